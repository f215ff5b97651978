"""Train on any OpenEnv server by URL: `environment.name=openenv environment.kwargs.url=http://host:port`.

Each episode is one OpenEnv session over the server's WebSocket route (`/ws`): `reset` sends
`{"seed", "episode_id", "task"}` (servers take the keys their `reset` accepts), every `step` sends the
episode's last assistant message as the action `{action_field: content}`. An observation becomes chat
messages: its `messages` field when it has one (posttrain's servers, `posttrain.environments.openenv_protocol`), else
its `observation_field` as one `observation_role` message, else the whole observation as JSON. Its
`scored`, `info`, `tools`, `stop_strings`, `response_prefix`, `reward_components`, `invalid_tool_call`,
`malformed_thinking` and `new_context` fields are read when present (defaults: scored, none, False).

What holds (tests/functional/test_openenv.py):
- construction checks `GET /health` (with the retries) and raises `EnvironmentServerError` naming the
  URL when the server does not answer;
- a request that fails (connection refused or dropped, timeout, a full server) is retried `retries`
  times, waiting `backoff_s * 2**k` before retry k; a retry opens a new session and replays the
  episode (reset with its seed and task, then its earlier assistant turns) and checks every replayed
  observation against the sha256 digest recorded when it was first seen, so a restarted
  deterministic server continues the episode exactly;
- an episode whose request still fails, whose replay differs, or which the server answers with an
  error ends unscored (`scored=False`, left out of the loss), never scored 0; its `info`
  "verifier_error" names the server, the request and the episode.

Sessions live in this object: with `environment.num_workers > 1` a step that reaches a worker without
the episode's session replays it there (correct for deterministic servers, one extra replay each).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from posttrain.environments.interface import (
    EnvStepResult,
    EpisodeStart,
    Message,
    last_assistant_content,
    register_environment,
    verifier_error_metrics,
)
from posttrain.environments.openenv_protocol import MESSAGES_FIELD, observation_digest
from posttrain.errors import UserError

SESSION_KEY = "openenv"
"""Metadata key of an episode's session record: episode_id, seed, task, start_len, digests, failed."""


class EnvironmentServerError(UserError):
    """An OpenEnv server that cannot be reached (at construction): names the server's URL."""


class RequestFailed(Exception):
    """A request that may succeed when retried (connection, timeout, a full server)."""


class EpisodeFailed(Exception):
    """A request that will not succeed when retried (the server's error answer, a replay that differs)."""


class Session:
    """One OpenEnv WebSocket session (one episode); `request` sends a message and returns the reply's data."""

    def __init__(self, ws_url: str, timeout_s: float) -> None:
        from websockets.sync.client import connect

        self.timeout_s = timeout_s
        try:
            # entered as a context manager: a plain connection on every websockets version (17.1+ warns otherwise)
            self.ws = connect(ws_url, open_timeout=timeout_s, max_size=None).__enter__()
        except Exception as e:  # noqa: BLE001 - any failure to connect is retried
            raise RequestFailed(f"cannot connect: {type(e).__name__}: {e}") from e

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """The `data` of the reply; `RequestFailed` for a transport failure or a full server,
        `EpisodeFailed` for the server's error answer."""
        try:
            self.ws.send(json.dumps(message))
            reply = json.loads(self.ws.recv(timeout=self.timeout_s))
        except Exception as e:  # noqa: BLE001 - timeouts, dropped connections: retried
            raise RequestFailed(f"{type(e).__name__}: {e}") from e
        data = reply.get("data") or {}
        if reply.get("type") == "error":
            error = f"server error {data.get('code')}: {data.get('message')}"
            raise (RequestFailed if data.get("code") == "CAPACITY_REACHED" else EpisodeFailed)(error)
        return data

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 - best effort on a connection that may be gone
            pass


@register_environment("openenv")
class OpenEnvEnvironment:
    """Episodes on an OpenEnv server (see the module docstring for what holds).

    Args:
        url: the server, e.g. "http://127.0.0.1:8000" (ws:// and https:// work too).
        timeout_s: limit of one connection or one reply.
        retries: further attempts of a failed request (each with a fresh session and a replay).
        backoff_s: wait before the first retry; doubled for each next one.
        max_concurrency: episodes stepped at once (one session each).
        action_field: the action's key for the assistant message's content ("content" for posttrain's
            servers, e.g. "message" for OpenEnv's echo environment).
        observation_field: the observation's key shown to the model, for servers without `messages`.
        observation_role: the role of that message ("user" or "tool").
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 60.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 16,
        action_field: str = "content",
        observation_field: str | None = None,
        observation_role: str = "user",
    ) -> None:
        if retries < 0 or timeout_s <= 0 or backoff_s < 0 or max_concurrency < 1:
            raise ValueError("need retries >= 0, timeout_s > 0, backoff_s >= 0 and max_concurrency >= 1")
        self.url = url.rstrip("/")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.max_concurrency = max_concurrency
        self.action_field, self.observation_field = action_field, observation_field
        self.observation_role = observation_role
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self.check_health()

    @property
    def ws_url(self) -> str:
        for http, ws in (("https://", "wss://"), ("http://", "ws://")):
            if self.url.startswith(http):
                return ws + self.url[len(http) :] + "/ws"
        return (self.url if self.url.startswith(("ws://", "wss://")) else "ws://" + self.url) + "/ws"

    @property
    def http_url(self) -> str:
        return "http" + self.ws_url[2:-3] if self.ws_url.startswith("ws") else self.url

    def check_health(self) -> None:
        """`GET /health` answers 200 within the retries, or `EnvironmentServerError` naming the URL."""
        error = ""
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(f"{self.http_url}/health", timeout=self.timeout_s) as reply:
                    if reply.status == 200:
                        return
                    error = f"HTTP {reply.status}"
            except (urllib.error.URLError, OSError) as e:
                error = f"{type(e).__name__}: {e}"
            if attempt < self.retries:
                time.sleep(self.backoff_s * 2**attempt)
        raise EnvironmentServerError(
            f"OpenEnv server {self.url} is not healthy: GET {self.http_url}/health failed after "
            f"{self.retries + 1} attempts ({error}). Start it (e.g. `posttrain env serve NAME --port P`) or fix "
            "environment.kwargs.url"
        )

    # -- episodes ---------------------------------------------------------------------------------

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """One session per task; an episode whose reset fails starts from the task's messages and its
        first step ends it unscored."""
        with ThreadPoolExecutor(self.max_concurrency) as pool:
            return list(pool.map(self._reset_one, tasks, seeds))

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        with ThreadPoolExecutor(self.max_concurrency) as pool:
            results = list(pool.map(self._step_one, message_logs, metadata))
        return EnvStepResult.concat(results)

    def _reset_one(self, task: dict[str, Any], seed: int) -> EpisodeStart:
        record = {"episode_id": uuid.uuid4().hex, "seed": int(seed), "task": task, "digests": []}
        meta = {**{k: v for k, v in task.items() if k != "messages"}, SESSION_KEY: record}
        try:
            data = self._with_retries("reset", record, lambda: self._open(record)[1])
        except EpisodeFailed as e:
            record["failed"] = str(e)
            return EpisodeStart(messages=[dict(m) for m in task.get("messages", [])], metadata=meta)
        messages = self._messages(data, task.get("messages", []))
        record["start_len"] = len(messages)
        observation = data.get("observation") or {}
        return EpisodeStart(
            messages=messages,
            metadata=meta,
            tools=observation.get("tools"),
            stop_strings=tuple(observation.get("stop_strings") or ()),
            response_prefix=observation.get("response_prefix") or "",
        )

    def _step_one(self, log: list[Message], meta: dict[str, Any]) -> EnvStepResult:
        record = dict(meta[SESSION_KEY])
        record["digests"] = list(record["digests"])
        new_meta = {**meta, SESSION_KEY: record}
        if "failed" in record:
            return self._unscored(new_meta, record["failed"])
        action = {"type": "step", "data": {self.action_field: last_assistant_content(log)}}
        try:
            data = self._with_retries("step", record, lambda: self._session(record, log).request(action))
        except EpisodeFailed as e:
            return self._unscored(new_meta, str(e))
        record["digests"].append(observation_digest(data))
        return self._result(data, new_meta)

    def _with_retries(self, name: str, record: dict[str, Any], call: Any) -> dict[str, Any]:
        """`call()`, retried on `RequestFailed` with exponential backoff (each retry in a new session);
        `EpisodeFailed` naming the server, the request and the episode when it still fails."""
        error = ""
        for attempt in range(self.retries + 1):
            try:
                return call()
            except RequestFailed as e:
                error = str(e)
                self._drop(record["episode_id"])
            except EpisodeFailed as e:
                self._drop(record["episode_id"])
                raise EpisodeFailed(self._describe(name, record, str(e))) from e
            if attempt < self.retries:
                time.sleep(self.backoff_s * 2**attempt)
        raise EpisodeFailed(
            self._describe(name, record, f"failed after {self.retries + 1} attempts: {error}")
        )

    def _describe(self, name: str, record: dict[str, Any], error: str) -> str:
        turn = len(record["digests"])
        return f"OpenEnv server {self.url}: {name} (episode {record['episode_id']}, turn {turn}): {error}"

    # -- sessions ---------------------------------------------------------------------------------

    def _open(self, record: dict[str, Any]) -> tuple[Session, dict[str, Any]]:
        """A new session with the episode reset: its reset reply; registered under the episode id."""
        session = Session(self.ws_url, self.timeout_s)
        reset = {"seed": record["seed"], "episode_id": record["episode_id"], "task": record["task"]}
        try:
            data = session.request({"type": "reset", "data": reset})
        except Exception:
            session.close()
            raise
        with self._lock:
            self._sessions[record["episode_id"]] = session
        if not record["digests"]:
            record["digests"].append(observation_digest(data))
        elif observation_digest(data) != record["digests"][0]:
            raise EpisodeFailed("replay differs: the reset observation is not the one first seen")
        return session, data

    def _session(self, record: dict[str, Any], log: list[Message]) -> Session:
        """The episode's session, or a new one replayed to the state before this turn."""
        with self._lock:
            session = self._sessions.get(record["episode_id"])
        if session is not None:
            return session
        session, _ = self._open(record)
        replies = [m for m in log[record["start_len"] : -1] if m.get("role") == "assistant"]
        for turn, reply in enumerate(replies, start=1):
            data = session.request({"type": "step", "data": {self.action_field: reply.get("content") or ""}})
            if observation_digest(data) != record["digests"][turn]:
                raise EpisodeFailed(
                    f"replay differs at turn {turn}: the observation is not the one first seen"
                )
        return session

    def _drop(self, episode_id: str) -> None:
        with self._lock:
            session = self._sessions.pop(episode_id, None)
        if session is not None:
            session.close()

    def close(self) -> None:
        """Close every open session."""
        for episode_id in list(self._sessions):
            self._drop(episode_id)

    # -- observations -----------------------------------------------------------------------------

    def _messages(self, data: dict[str, Any], before: list[Message] = ()) -> list[Message]:
        """An observation as chat messages (see the module docstring)."""
        observation = data.get("observation") or {}
        if isinstance(observation.get(MESSAGES_FIELD), list):
            return [dict(m) for m in observation[MESSAGES_FIELD]]
        if self.observation_field is not None:
            content = observation.get(self.observation_field)
        else:
            content = json.dumps(observation, sort_keys=True)
        return [*(dict(m) for m in before), {"role": self.observation_role, "content": str(content)}]

    def _result(self, data: dict[str, Any], meta: dict[str, Any]) -> EnvStepResult:
        observation = data.get("observation") or {}
        done = bool(data.get("done"))
        messages = self._messages(data)
        if done:
            self._drop(meta[SESSION_KEY]["episode_id"])
        stop = observation.get("stop_strings")
        return EnvStepResult(
            rewards=[float(data.get("reward") or 0.0)],
            observations=[None if done else messages],
            done=[done],
            metadata=[meta],
            info=[dict(observation.get("info") or {})],
            scored=[bool(observation.get("scored", True))],
            stop_strings=[None if stop is None else tuple(stop)],
            response_prefixes=[observation.get("response_prefix")],
            reward_components=[
                {k: float(v) for k, v in (observation.get("reward_components") or {}).items()}
            ],
            invalid_tool_call=[bool(observation.get("invalid_tool_call", False))],
            malformed_thinking=[bool(observation.get("malformed_thinking", False))],
            new_context=[bool(observation.get("new_context", False))],
        )

    def _unscored(self, meta: dict[str, Any], error: str) -> EnvStepResult:
        """The episode ends unscored (left out of the loss), its error in info."""
        self._drop(meta[SESSION_KEY]["episode_id"])
        return EnvStepResult([0.0], [None], [True], [meta], [{"verifier_error": error}], scored=[False])

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        """Mean reward of the scored samples, unscored count, verifier errors."""
        scored = [r for r, s in zip(results.rewards, results.scored, strict=True) if s]
        return {
            "env/reward_mean": sum(scored) / max(len(scored), 1),
            "env/unscored": float(len(results) - len(scored)),
            **verifier_error_metrics(results),
        }
