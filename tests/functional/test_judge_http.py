"""The HTTP judge backend against a real local HTTP server (http.server in a thread): retries with
backoff on 5xx / 429 / timeouts / refused connections, no retry on 4xx or malformed replies, bounded
concurrency, the request it sends, and the judge environment masking what failed."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from posttrain.environments.judge import JudgeEnvironment
from posttrain.environments.judge_backends import HTTPJudge, JudgeFailure

Reply = tuple[int, dict[str, str], bytes]


def completion(text: str) -> Reply:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
    return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()


class FakeServer:
    """An OpenAI-style endpoint whose answer to the n-th request is `behaviour(n, request_body)`:
    a reply (status, headers, body) or a number of seconds to stall before answering 200."""

    def __init__(self, behaviour: Callable[[int, dict], Reply | float]) -> None:
        self.behaviour, self.requests, self.headers = behaviour, [], []
        self.in_flight = self.peak = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    n = len(server.requests)
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                    server.in_flight += 1
                    server.peak = max(server.peak, server.in_flight)
                answered = False
                try:
                    action = server.behaviour(n, body)
                    if isinstance(action, int | float):
                        time.sleep(action)
                        action = completion("Score: 5")
                    status, headers, payload = action
                    # out of flight before the reply is sent: a client that got its reply may send its
                    # next request before this thread runs again (peak counted what the client holds)
                    with server.lock:
                        server.in_flight -= 1
                        answered = True
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass
                finally:
                    if not answered:
                        with server.lock:
                            server.in_flight -= 1

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[int, dict], Reply | float]], FakeServer]]:
    servers: list[FakeServer] = []

    def start(behaviour: Callable[[int, dict], Reply | float]) -> FakeServer:
        servers.append(FakeServer(behaviour))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def judge(server: FakeServer, **kwargs) -> HTTPJudge:
    options = dict(model="judge-model", timeout_s=5.0, max_retries=3, backoff_s=0.01, max_backoff_s=0.05)
    return HTTPJudge(server.base_url, **{**options, **kwargs})


USER = [{"role": "user", "content": "Rate this."}]


def test_the_request_and_a_reply(serve, monkeypatch) -> None:
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-test-123")
    server = serve(lambda n, body: completion("Fine.\nScore: 9"))
    backend = judge(server, api_key_env="JUDGE_TEST_KEY", max_tokens=7)
    assert backend.complete([USER]) == ["Fine.\nScore: 9"]
    body = server.requests[0]
    assert body == {"model": "judge-model", "messages": USER, "max_tokens": 7, "temperature": 0.0}
    assert server.headers[0]["Authorization"] == "Bearer sk-test-123"
    assert backend.retries == 0
    # a conversation ending with an assistant message asks the server to continue it
    backend.complete([[*USER, {"role": "assistant", "content": "Score:"}]])
    assert server.requests[1]["continue_final_message"] is True
    assert server.requests[1]["add_generation_prompt"] is False


def test_server_errors_are_retried_until_success(serve) -> None:
    server = serve(lambda n, body: (503, {}, b"busy") if n < 2 else completion("Score: 4"))
    backend = judge(server)
    assert backend.complete([USER]) == ["Score: 4"]
    assert len(server.requests) == 3 and backend.retries == 2


def test_rate_limits_honour_retry_after(serve) -> None:
    server = serve(lambda n, body: (429, {"Retry-After": "0"}, b"slow down") if n < 1 else completion("ok"))
    backend = judge(server, backoff_s=30.0, max_backoff_s=30.0)  # Retry-After: 0 means no 30 s wait
    started = time.monotonic()
    assert backend.complete([USER]) == ["ok"] and backend.retries == 1
    assert time.monotonic() - started < 30.0


def test_a_server_that_keeps_failing_gives_a_failure_after_the_retries(serve) -> None:
    server = serve(lambda n, body: (500, {}, b"internal error"))
    (reply,) = judge(server, max_retries=2).complete([USER])
    assert isinstance(reply, JudgeFailure) and "HTTP 500" in reply.error and "3 attempts" in reply.error
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ((400, {}, b'{"error": "bad model"}'), "HTTP 400"),
        ((200, {}, b"<html>not json</html>"), "not a chat completion"),
        ((200, {}, b'{"choices": []}'), "not a chat completion"),
        ((200, {}, b'{"choices": [{"message": {"content": null}}]}'), "without text content"),
    ],
)
def test_client_errors_and_malformed_replies_fail_without_retry(serve, answer, expected) -> None:
    server = serve(lambda n, body: answer)
    backend = judge(server)
    (reply,) = backend.complete([USER])
    assert isinstance(reply, JudgeFailure) and expected in reply.error
    assert len(server.requests) == 1 and backend.retries == 0


def test_timeouts_are_retried_then_fail(serve) -> None:
    server = serve(lambda n, body: 2.0)  # every request stalls past the client's timeout
    backend = judge(server, timeout_s=0.3, max_retries=1)
    (reply,) = backend.complete([USER])
    assert isinstance(reply, JudgeFailure) and "timed out" in reply.error.lower()
    assert backend.retries == 1 and len(server.requests) == 2


def test_a_refused_connection_is_retried_then_fails() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = HTTPJudge(f"http://127.0.0.1:{port}/v1", "m", max_retries=2, backoff_s=0.01)
    (reply,) = backend.complete([USER])
    assert isinstance(reply, JudgeFailure) and "refused" in reply.error.lower()
    assert backend.retries == 2


def test_concurrency_is_bounded(serve) -> None:
    server = serve(lambda n, body: 0.3)
    replies = judge(server, max_concurrency=2).complete([USER] * 6)
    assert replies == ["Score: 5"] * 6 and server.peak == 2


def test_the_environment_masks_failed_requests_only(serve) -> None:
    """Per request: the reply 'bad' gets a 500 every time (masked, counted as an error with its
    retries); the others are scored; a repeat is served from the cache without a request."""

    def behaviour(n: int, body: dict) -> Reply:
        prompt = body["messages"][0]["content"]
        return (500, {}, b"down") if "Answer:\nbad" in prompt else completion("Score: 10")

    server = serve(behaviour)
    env = JudgeEnvironment(
        backend="http", base_url=server.base_url, model="m", max_retries=1, backoff_s=0.01, max_concurrency=4
    )
    logs = [
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": r}] for r in ("good", "bad", "ok")
    ]
    r = env.step(logs, [{}] * 3)
    assert r.scored == [True, False, True] and r.rewards == [1.0, 0.0, 1.0]
    assert "HTTP 500" in r.info[1]["judge_error"]
    m = env.batch_metrics(r)
    assert m["env/judge_errors"] == 1 and m["env/judge_retries"] == 1 and m["env/judge_masked"] == 1
    assert m["env/judge_requests"] == 3 and m["env/judge_parse_failure_rate"] == 0.0
    before = len(server.requests)
    again = env.step(logs[:1], [{}])
    assert len(server.requests) == before and again.info[0]["cache_hit"] and again.rewards == [1.0]
