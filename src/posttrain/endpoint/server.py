"""The endpoint over HTTP: Python's own `http.server` (a thread per request) on loopback by default.

Routes (a session id in the path, so that the stock `openai` client works with
`base_url=f"{url}/sessions/{session_id}/v1"`):

    GET  /health                                   {"status": "ok"}
    GET  /sessions/{id}/v1/models                  the one model, OpenAI's list format
    POST /sessions/{id}/v1/chat/completions        `AgentEndpoint.chat_completions`
    POST /sessions/{id}/v1/responses               `AgentEndpoint.responses` (the Responses API)
    POST /sessions/{id}/reward  (or .../v1/reward) {"reward": number, "info": {...}}

Errors come back as OpenAI's {"error": {...}} with the status of `APIError` (404: unknown session,
400: a bad or unsupported request, an edited history, an episode that is over; 500: the generator failed).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from posttrain.endpoint.app import AgentEndpoint, APIError

_ROUTE = re.compile(r"^/sessions/([A-Za-z0-9._:-]+)(?:/v1)?/(chat/completions|responses|reward|models)$")


def _handler(app: AgentEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the run logs what matters
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> tuple[int, dict[str, Any]]:
            path = self.path.split("?", 1)[0].rstrip("/")
            if method == "GET" and path == "/health":
                return 200, {"status": "ok"}
            match = _ROUTE.match(path)
            if match is None:
                raise APIError(404, f"no route {method} {path}", code="not_found")
            session_id, operation = match.groups()
            if method == "GET" and operation == "models":
                app.session(session_id)
                return 200, {
                    "object": "list",
                    "data": [{"id": app.model_name, "object": "model", "owned_by": "posttrain"}],
                }
            if method != "POST" or operation == "models":
                raise APIError(405, f"{method} is not allowed on {path}", code="method_not_allowed")
            body = self._body()
            operations = {
                "chat/completions": app.chat_completions,
                "responses": app.responses,
                "reward": app.post_reward,
            }
            return 200, operations[operation](session_id, body)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError as e:
                raise APIError(400, f"the request body is not JSON: {e}") from None
            if not isinstance(body, dict):
                raise APIError(400, "the request body must be a JSON object")
            return body

        def _serve(self, method: str) -> None:
            try:
                status, body = self._route(method)
            except APIError as e:
                status, body = e.status, e.body()
            except Exception as e:  # the generator failed: the agent sees a server error, the run goes on
                status, body = 500, APIError(500, f"{type(e).__name__}: {e}", "server_error").body()
            self._send(status, body)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

    return Handler


class _ThreadingServer(ThreadingHTTPServer):
    """A thread per request, and a listen backlog for every agent of a rollout connecting at once:
    socketserver's default of 5 drops the other connects' SYNs, which the client retries only after
    TCP's 1 s timeout, so those agents' first requests missed the rollout's first batch."""

    daemon_threads = True
    request_queue_size = 1024


class EndpointServer:
    """`app` served over HTTP on (host, port) (port 0: a free one) in a background thread; `url` is
    `http://host:port`. Use as a context manager, or `start()` / `close()`."""

    def __init__(self, app: AgentEndpoint, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.httpd = _ThreadingServer((host, port), _handler(app))
        # a short poll: `close` waits for the serving loop to notice (socketserver's default is 0.5 s)
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="endpoint-http", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def base_url(self, session_id: str) -> str:
        """What an OpenAI client takes as `base_url` for one session."""
        return f"{self.url}/sessions/{session_id}/v1"

    def start(self) -> EndpointServer:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._thread.is_alive():
            self.httpd.shutdown()
            self._thread.join(timeout=10)
        self.httpd.server_close()

    def __enter__(self) -> EndpointServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
