"""A registered posttrain environment served as an OpenEnv server (`posttrain env serve NAME`).

posttrain's `Environment` is batched and keeps an episode's state in its metadata; OpenEnv's is one
episode per session. Each OpenEnv session (a `/ws` connection) holds one episode: its message log
and metadata. `reset(seed, task)` calls the environment's `reset([task], [seed])` (or starts from the
task's messages, `task_start`); each `step(action)` appends the action as the assistant message and
calls `step([log], [metadata])`. The observation carries the environment's next messages, reward,
done and posttrain's extensions (`scored`, `info`, generation controls; see `posttrain.environments.openenv_protocol`).

Without a `task` in the reset, an environment that draws its own tasks (`generate_tasks(count, seed)`,
the sliding puzzle) draws one from the seed; any other needs the task (a math problem and its answer).

One environment object serves every session of a server process; its calls are serialised by a lock,
so environments need not be thread-safe. OpenEnv's stateless HTTP `/reset` and `/step` build a fresh
session per request (OpenEnv's own behaviour), so `/step` there has no episode: episodes go over
`/ws`. posttrain adds `POST /posttrain/verify` (`VERIFY_ROUTE`): a finished transcript is scored
without a session by replaying its assistant turns from `reset(task, seed)`.

Needs the `serve` extra (openenv-core, which imports fastapi, uvicorn and gradio).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import threading
from typing import Any

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment as OpenEnvBase
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import BaseModel, ConfigDict, Field

from posttrain.environments.interface import (
    EnvStepResult,
    EpisodeStart,
    Message,
    check_environment,
    make_environment,
    observation_messages,
    task_start,
)
from posttrain.environments.openenv_protocol import VERIFY_ROUTE

SPEC_VARIABLE = "POSTTRAIN_SERVE_SPEC"
"""Environment variable holding the JSON spec (name, kwargs, max_concurrency) for `app_from_environ`,
how uvicorn's worker processes learn what to serve."""


class ChatAction(Action):
    """One assistant turn: its text and, in the OpenAI tool format, its tool calls."""

    content: str = Field("", description="The assistant message's content")
    tool_calls: list[dict[str, Any]] | None = Field(None, description="The assistant message's tool calls")

    def message(self) -> Message:
        """The assistant message this action stands for."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


class ChatObservation(Observation):
    """The environment's answer: next messages plus posttrain's fields (see `posttrain.environments.openenv_protocol`)."""

    messages: list[dict[str, Any]] = Field(
        default_factory=list, description="The environment's next messages"
    )
    scored: bool = Field(True, description="False: the environment could not score this episode")
    info: dict[str, Any] = Field(default_factory=dict, description="The environment's diagnostics")
    tools: list[dict[str, Any]] | None = Field(None, description="Tool schemas offered to the model")
    stop_strings: list[str] | None = Field(None, description="Extra stop strings for the next turn")
    response_prefix: str | None = Field(None, description="Text that begins the next assistant turns")
    reward_components: dict[str, float] = Field(
        default_factory=dict, description="Named parts of this turn's reward (their sum is the reward)"
    )
    invalid_tool_call: bool = Field(False, description="This turn made a tool call that could not be run")
    malformed_thinking: bool = Field(False, description="This turn's <think> block is malformed")
    new_context: bool = Field(
        False, description="The messages replace the conversation: the next turn's prompt is them alone"
    )


class EnvironmentHost:
    """One posttrain environment shared by a server's sessions; every call holds `lock`."""

    def __init__(self, name: str, kwargs: dict[str, Any]) -> None:
        check_environment(name, kwargs)
        self.name = name
        self.env = make_environment(name, **kwargs)
        self.lock = threading.Lock()

    def start(self, task: dict[str, Any] | None, seed: int) -> EpisodeStart:
        """The episode start of `task` (drawn from `seed` when None and the environment draws tasks)."""
        with self.lock:
            if task is None:
                task = self._draw_task(seed)
            reset = getattr(self.env, "reset", None)
            starts = reset([task], [seed]) if reset is not None else [task_start(task)]
        return starts[0]

    def _draw_task(self, seed: int) -> dict[str, Any]:
        generate = getattr(self.env, "generate_tasks", None)
        if generate is None:
            raise ValueError(
                f"environment {self.name!r} draws no tasks of its own: send the task in the reset "
                '(reset data {"seed": ..., "task": {...}})'
            )
        return generate(1, seed)[0]

    def step(self, log: list[Message], metadata: dict[str, Any]) -> EnvStepResult:
        """The environment's step of one episode."""
        with self.lock:
            return self.env.step([log], [metadata])


class ServedSession(OpenEnvBase[ChatAction, ChatObservation, State]):
    """One OpenEnv session over a posttrain environment: one episode at a time."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, host: EnvironmentHost) -> None:
        super().__init__()
        self.host = host
        self._log: list[Message] | None = None
        self._metadata: dict[str, Any] = {}
        self._done = False
        self._state = State()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, task: dict[str, Any] | None = None
    ) -> ChatObservation:
        """Start an episode of `task` with `seed` (default 0); the observation holds its first messages."""
        start = self.host.start(task, 0 if seed is None else int(seed))
        self._log = [dict(m) for m in start.messages]
        self._metadata = start.metadata
        self._done = False
        self._state = State(episode_id=episode_id, step_count=0)
        return ChatObservation(
            messages=self._log,
            tools=start.tools,
            stop_strings=list(start.stop_strings),
            response_prefix=start.response_prefix,
        )

    def step(self, action: ChatAction, timeout_s: float | None = None, **kwargs: Any) -> ChatObservation:
        """Append the action's assistant message and step the environment."""
        if self._log is None or self._done:
            raise RuntimeError("no episode is running in this session: send a reset first")
        self._log.append(action.message())
        result = self.host.step(self._log, self._metadata)
        observation = result_observation(result)
        self._metadata = result.metadata[0]
        self._log.extend(observation.messages)
        self._done = observation.done
        self._state.step_count += 1
        return observation

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        doc = inspect.getdoc(type(self.host.env)) or ""
        return EnvironmentMetadata(
            name=self.host.name, description=doc.split("\n\n")[0] or self.host.name, version="posttrain"
        )


def result_observation(result: EnvStepResult) -> ChatObservation:
    """Sample 0 of a step result as an observation; `messages` is [] when the episode is done."""
    stop = result.stop_strings[0]
    return ChatObservation(
        messages=observation_messages(result.observations[0]),
        reward=float(result.rewards[0]),
        done=bool(result.done[0]),
        scored=bool(result.scored[0]),
        info=jsonable(result.info[0]),
        stop_strings=None if stop is None else list(stop),
        response_prefix=result.response_prefixes[0],
        reward_components={name: float(v) for name, v in result.reward_components[0].items()},
        invalid_tool_call=bool(result.invalid_tool_call[0]),
        malformed_thinking=bool(result.malformed_thinking[0]),
        new_context=bool(result.new_context[0]),
    )


def jsonable(value: Any) -> Any:
    """`value` as plain JSON data (tuples become lists, other objects their repr)."""
    return json.loads(json.dumps(value, default=repr))


class VerifyRequest(BaseModel):
    """A finished transcript to score: the task, the seed and the messages (the assistant turns count)."""

    model_config = ConfigDict(extra="forbid")
    task: dict[str, Any] | None = None
    seed: int = 0
    messages: list[dict[str, Any]]


class VerifyResponse(BaseModel):
    """The replay of a transcript's assistant turns: per-turn rewards, their named parts and flags, and
    how the episode ended."""

    rewards: list[float]
    done: bool
    scored: bool
    turns: int
    info: list[dict[str, Any]]
    reward_components: list[dict[str, float]] = []
    invalid_tool_call: list[bool] = []
    malformed_thinking: list[bool] = []


def verify(host: EnvironmentHost, request: VerifyRequest) -> VerifyResponse:
    """Replay the transcript's assistant messages (those after the episode's first messages) through a
    fresh episode; the environment's own observations are used between them. Stops when it is done."""
    start = host.start(request.task, request.seed)
    log, metadata = [dict(m) for m in start.messages], start.metadata
    replies = [m for m in request.messages[len(log) :] if m.get("role") == "assistant"]
    turns: list[ChatObservation] = []
    for reply in replies:
        log.append(dict(reply))
        result = host.step(log, metadata)
        metadata = result.metadata[0]
        log.extend(observation_messages(result.observations[0]))
        turns.append(result_observation(result))
        if turns[-1].done:
            break
    return VerifyResponse(
        rewards=[float(t.reward) for t in turns],
        done=bool(turns and turns[-1].done),
        scored=all(t.scored for t in turns),
        turns=len(turns),
        info=[t.info for t in turns],
        reward_components=[t.reward_components for t in turns],
        invalid_tool_call=[t.invalid_tool_call for t in turns],
        malformed_thinking=[t.malformed_thinking for t in turns],
    )


def create_app(name: str, kwargs: dict[str, Any] | None = None, max_concurrency: int = 64) -> Any:
    """The FastAPI app: OpenEnv's routes (`/ws`, `/reset`, `/step`, `/state`, `/health`, `/metadata`,
    `/schema`) over `name`'s environment, at most `max_concurrency` sessions at once, plus `VERIFY_ROUTE`."""
    host = EnvironmentHost(name, dict(kwargs or {}))
    app = create_fastapi_app(
        functools.partial(ServedSession, host),
        ChatAction,
        ChatObservation,
        max_concurrent_envs=max_concurrency,
    )

    @app.post(VERIFY_ROUTE, response_model=VerifyResponse, tags=["posttrain"])
    def verify_route(request: VerifyRequest) -> VerifyResponse:
        return verify(host, request)

    return app


def app_from_environ() -> Any:
    """`create_app` from the JSON spec in `SPEC_VARIABLE` (uvicorn's factory in worker processes)."""
    spec = json.loads(os.environ[SPEC_VARIABLE])
    return create_app(spec["name"], spec.get("kwargs"), spec.get("max_concurrency", 64))


def serve(
    name: str,
    kwargs: dict[str, Any] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    max_concurrency: int = 64,
) -> None:
    """Run the server until interrupted. `workers` > 1 starts that many processes (uvicorn), each with
    its own environment and its own `max_concurrency` sessions; a session stays in one process."""
    import uvicorn

    spec = {"name": name, "kwargs": dict(kwargs or {}), "max_concurrency": max_concurrency}
    if workers == 1:
        uvicorn.run(create_app(name, kwargs, max_concurrency), host=host, port=port, log_level="warning")
        return
    os.environ[SPEC_VARIABLE] = json.dumps(spec)
    uvicorn.run(
        "posttrain.serve.openenv_server:app_from_environ",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
    )
