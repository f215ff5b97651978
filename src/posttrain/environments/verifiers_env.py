"""Environments written for `verifiers` (PyPI 0.4.0, the environment library prime-rl trains with) as
posttrain environments: `environment.name=verifiers`.

verifiers 0.4.0's stack is `verifiers.v1` (`import verifiers.v1 as vf`): a `vf.Taskset` yields
`vf.Task`s; a task's `vf.TaskData` holds the prompt (a string or messages) and the system prompt, and
its `@vf.reward(weight=...)` methods score the finished trace (`@vf.metric` ones are logged, not
summed). In verifiers a harness program plays the task against a model endpoint; its default
(`null`) harness is a chat loop: the system prompt and the prompt, then model turns, each tool call
run on the task's and the taskset's `vf.Toolset`s (MCP servers), until a reply without a tool call,
a `@vf.stop` or the turn limit. This environment is that loop with posttrain generating the turns:

- tasks: `generate_tasks(count, seed)` draws from the taskset (`taskset.shuffle(seed)` for a finite
  one, the first `count` of an infinite one); a task row is the task's `TaskData` as JSON, so data
  rows with the same fields (`prompt`, `answer`, ...) work too;
- `reset`: the first messages as the null harness builds them (a system message, then the prompt),
  and the tools of the task's and the taskset's toolsets (named `<server>_<tool>` as the harness
  names them), which run in this process (verifiers' own `Toolset.register` on an in-process MCP
  server, so MCP checks the arguments);
- `step`: an assistant message with tool calls gets the tool results (the episode goes on, reward 0)
  until `max_turns` turns or a `@vf.stop(trace)` that fires; the last turn's trace is scored with
  `Task.score`: the reward is the weighted sum of the rewards (`vf.Trace.reward`) and each reward is
  a named component (score x weight, for GDPO); metrics go to `info["metrics"]`.

Model output is untrusted: a reward that raises, does not run, times out (the task's
`timeout.scoring`, else `score_timeout_s`) or is not finite leaves the episode unscored
(`scored=False`, out of the loss, its `info["verifier_error"]` saying why), never scored 0. A tool
call that cannot run (unreadable, an unknown tool, arguments that do not fit) is answered with the
error text, as verifiers' harness answers it, and flags the turn (`invalid_tool_call`).

Not carried (refused at construction or reset with the reason): tasks that need a container
runtime, rewards/metrics that need a runtime, toolsets that keep a per-rollout `vf.State` (verifiers
syncs it over a state channel this adapter does not run), `@vf.stop`s on requests or responses, and
multi-agent `vf.Env`s (they need a model endpoint: see docs/agents.md). Needs the `verifiers` extra.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import threading
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from posttrain.environments.interface import (
    EnvironmentSpecError,
    EnvStepResult,
    EpisodeStart,
    Message,
    register_environment,
    resolve_callable,
    verifier_error_metrics,
)
from posttrain.environments.tools import ToolCall, malformed_thinking, parse_tool_calls

EPISODE_KEY = "verifiers"
"""Metadata key of an episode's record: {"episode": id, "start_len": first messages, "turns": n}."""


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise EnvironmentSpecError(
            "environment.name=verifiers needs the verifiers package: pip install 'posttrain[verifiers]'"
        ) from e
    return vf


class AsyncRunner:
    """An event loop on a thread of its own: `run(coroutine)` from any thread (the rollout steps
    environments on worker threads, some of which may run a loop already)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="verifiers-env", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class ToolServers:
    """Toolsets served in this process: their tools as OpenAI schemas, and calls by qualified name."""

    def __init__(self) -> None:
        self.servers: dict[str, tuple[Any, str]] = {}  # qualified name -> (MCP server, tool name)
        self.schemas: list[dict[str, Any]] = []

    async def add(self, toolset: Any, task: Any | None) -> None:
        """Set `toolset` up (and for `task` when given) and register its tools as verifiers does."""
        from mcp.server.mcpserver import MCPServer

        await toolset.setup()
        if task is not None:
            await toolset.setup_task(task)
        prefix = toolset.server_name
        server = MCPServer(prefix or type(toolset).__name__)
        toolset.register(server)
        for tool in await server.list_tools():
            name = f"{prefix}_{tool.name}" if prefix else tool.name
            if name in self.servers:
                raise EnvironmentSpecError(f"two verifiers toolsets offer a tool named {name!r}")
            self.servers[name] = (server, tool.name)
            function = {"name": name, "description": tool.description or "", "parameters": tool.input_schema}
            self.schemas.append({"type": "function", "function": function})

    async def call(self, call: ToolCall) -> tuple[str, bool]:
        """(the result text, whether the call was invalid: unreadable, unknown tool, bad arguments).
        A tool that raises answers with its error, as MCP's own server does, and is not invalid."""
        from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError

        if call.error is not None:
            return f"error: {call.error}", True
        if call.name not in self.servers:
            return f"error: unknown tool {call.name!r}", True
        server, name = self.servers[call.name]
        try:
            result = await server.call_tool(name, call.arguments)
        except UnexpectedToolError as e:
            return str(e), False
        except ToolError as e:  # MCP's argument validation
            return str(e), True
        return "\n".join(getattr(block, "text", None) or str(block) for block in result.content), False


@register_environment("verifiers")
class VerifiersEnvironment:
    """A verifiers taskset as a posttrain environment (see the module docstring).

    Args:
        taskset: "module:function" (or the function) that returns a `vf.Taskset`, called with
            `taskset_args`.
        taskset_id: else an installed verifiers taskset by id, loaded by verifiers' loader with its
            config built from `taskset_args`.
        taskset_args: keyword arguments of the function, or the taskset config's fields.
        max_turns: assistant turns of an episode at most (verifiers' agent `max_turns`); the last
            one is scored whatever it calls. 1 (single turn, as `environment.max_turns`' default):
            a taskset with tools needs more, and `environment.max_turns` at least as many.
        score_timeout_s: the scoring limit of a task without its own `timeout.scoring` (None: none).
    """

    callable_kwargs = ("taskset",)
    turn_limit_kwarg = "max_turns"

    def __init__(
        self,
        taskset: str | Callable[..., Any] | None = None,
        *,
        taskset_id: str | None = None,
        taskset_args: dict[str, Any] | None = None,
        max_turns: int = 1,
        score_timeout_s: float | None = 120.0,
    ) -> None:
        if (taskset is None) == (taskset_id is None):
            raise EnvironmentSpecError("environment.kwargs: give exactly one of taskset and taskset_id")
        if max_turns < 1 or (score_timeout_s is not None and score_timeout_s <= 0):
            raise ValueError("need max_turns >= 1 and score_timeout_s > 0 (or null)")
        self.taskset_spec, self.taskset_id = taskset, taskset_id
        self.taskset_args = dict(taskset_args or {})
        self.max_turns, self.score_timeout_s = max_turns, score_timeout_s
        self._taskset: Any = None
        self._runner: AsyncRunner | None = None
        self._shared: ToolServers | None = None
        self._episodes: dict[str, ToolServers] = {}
        self._lock = threading.Lock()
        check_task_class(type(self.taskset).task_type(), self.taskset)

    # -- the taskset ----------------------------------------------------------------------------

    @property
    def taskset(self) -> Any:
        """The verifiers taskset, built on first use (and again after unpickling)."""
        if self._taskset is None:
            self._taskset = self._build_taskset()
        return self._taskset

    def _build_taskset(self) -> Any:
        vf = _vf()
        if self.taskset_id is not None:
            try:
                config_type = vf.taskset_config_type(self.taskset_id)
            except (ImportError, AttributeError, TypeError, ValueError) as e:
                raise EnvironmentSpecError(f"environment.kwargs.taskset_id={self.taskset_id!r}: {e}") from e
            return vf.load_taskset(config_type.model_validate({**self.taskset_args, "id": self.taskset_id}))
        built = resolve_callable(self.taskset_spec, "environment.kwargs.taskset")(**self.taskset_args)
        if not isinstance(built, vf.Taskset):
            raise EnvironmentSpecError(
                f"environment.kwargs.taskset={self.taskset_spec!r} returned a {type(built).__name__}, "
                "not a verifiers.v1.Taskset"
            )
        return built

    def generate_tasks(self, count: int, seed: int) -> list[dict[str, Any]]:
        """`count` tasks as rows (their `TaskData` as JSON): a finite taskset shuffled with `seed`."""
        view = self.taskset.shuffle(seed) if self.taskset.bounded else self.taskset
        return [task_row(task) for task in view.take(count)]

    def task(self, row: dict[str, Any]) -> Any:
        """The verifiers task of a row: its `TaskData` fields (others ignored), the taskset's config
        and system-prompt override."""
        task_type = type(self.taskset).task_type()
        data_type = task_type.data_type()
        fields = (
            row
            if data_type.model_config.get("extra") == "allow"
            else {k: v for k, v in row.items() if k in data_type.model_fields}
        )
        task = task_type(data_type.model_validate(fields), self.taskset.config.task)
        if self.taskset.system_prompt is not None:
            task = task.with_system_prompt(self.taskset.system_prompt)
        check_stops(task)
        return task

    # -- episodes -------------------------------------------------------------------------------

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """Each task's first messages (system prompt, then prompt) and tools; `seeds` are unused (a
        verifiers task is its data)."""
        return [self._start(row) for row in tasks]

    def _start(self, row: dict[str, Any]) -> EpisodeStart:
        task = self.task(row)
        messages = first_messages(task.data)
        episode = uuid.uuid4().hex
        servers = self._run(self._episode_servers(episode, task))
        record = {"episode": episode, "start_len": len(messages), "turns": 0}
        metadata = {**row, EPISODE_KEY: record}
        return EpisodeStart(messages=messages, metadata=metadata, tools=servers.schemas or None)

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        async def all_steps() -> list[EnvStepResult]:
            return list(await asyncio.gather(*map(self._step_one, message_logs, metadata)))

        return EnvStepResult.concat(self._run(all_steps()))

    async def _step_one(self, log: list[Message], meta: dict[str, Any]) -> EnvStepResult:
        record = {**meta[EPISODE_KEY], "turns": meta[EPISODE_KEY]["turns"] + 1}
        new_meta = {**meta, EPISODE_KEY: record}
        task = self.task({k: v for k, v in meta.items() if k != EPISODE_KEY})
        servers = await self._episode_servers(record["episode"], task)
        message = next((m for m in reversed(log) if m.get("role") == "assistant"), {})
        calls = parse_tool_calls(message) if servers.schemas else []
        flags = {"malformed_thinking": [malformed_thinking(message.get("content") or "")]}
        if calls and record["turns"] < self.max_turns:
            observations, invalid = await self._tool_turn(servers, calls, record["turns"])
            trace = build_trace(task, [*log, *observations], record, servers.schemas)
            if not await stop_fired(task, trace):
                info = {"tool_calls": len(calls)}
                return EnvStepResult(
                    [0.0], [observations], [False], [new_meta], [info], invalid_tool_call=[invalid], **flags
                )
        else:
            trace = build_trace(task, log, record, servers.schemas)
            trace.stop("max_turns" if calls else "agent_completed")
        self._drop(record["episode"])
        reward, parts, info = await self._score(task, trace)
        scored = "verifier_error" not in info
        return EnvStepResult(
            [reward], [None], [True], [new_meta], [info], scored=[scored], reward_components=[parts], **flags
        )

    async def _tool_turn(
        self, servers: ToolServers, calls: list[ToolCall], turn: int
    ) -> tuple[list[Message], bool]:
        """The tool messages answering `calls`, and whether any call was invalid."""
        observations, invalid = [], False
        for k, call in enumerate(calls):
            content, bad = await servers.call(call)
            invalid = invalid or bad
            observations.append(
                {
                    "role": "tool",
                    "name": call.name or "unknown",
                    "content": content,
                    "tool_call_id": call_id(call, turn, k),
                }
            )
        return observations, invalid

    async def _score(self, task: Any, trace: Any) -> tuple[float, dict[str, float], dict[str, Any]]:
        """(reward, components, info); info has "verifier_error" when the episode cannot be scored."""
        timeout = task.data.timeout.scoring or self.score_timeout_s
        info: dict[str, Any] = {"stop_condition": trace.stop_condition}
        try:
            await asyncio.wait_for(task.score(trace), timeout)
        except asyncio.TimeoutError:
            return 0.0, {}, {**info, "verifier_error": f"scoring took longer than {timeout} s"}
        except Exception as e:  # noqa: BLE001 - a reward's failure on untrusted output leaves the episode unscored
            return 0.0, {}, {**info, "verifier_error": f"exception: {type(e).__name__}: {e}"[:500]}
        info["metrics"] = dict(trace.metrics)
        missing = sorted(name for name, r in trace.rewards.items() if r is None)
        parts = {name: r.score * r.weight for name, r in trace.rewards.items() if r is not None}
        if missing or not all(math.isfinite(v) for v in parts.values()):
            error = f"rewards that did not run: {missing}" if missing else f"rewards not finite: {parts}"
            return 0.0, {}, {**info, "verifier_error": error}
        return sum(parts.values()), parts, info

    # -- tool servers and the loop --------------------------------------------------------------

    async def _episode_servers(self, episode: str, task: Any) -> ToolServers:
        """The episode's tools: the taskset's (shared) and the task's own (one set per episode,
        made again where this object has none, e.g. after unpickling). Runs on the loop's thread."""
        with self._lock:
            found = self._episodes.get(episode)
        if found is None:
            found = await self._make_servers(task)
            with self._lock:
                self._episodes[episode] = found
        return found

    async def _make_servers(self, task: Any) -> ToolServers:
        if self._shared is None:
            shared = ToolServers()
            for toolset in type(self.taskset).toolsets(self.taskset.config):
                await shared.add(toolset, None)
            self._shared = shared
        servers = ToolServers()
        servers.servers, servers.schemas = dict(self._shared.servers), list(self._shared.schemas)
        for toolset in type(task).toolsets(task.config):
            await servers.add(toolset, task)
        return servers

    def _drop(self, episode: str) -> None:
        with self._lock:
            self._episodes.pop(episode, None)

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        with self._lock:
            if self._runner is None:
                self._runner = AsyncRunner()
            runner = self._runner
        return runner.run(coroutine)

    def close(self) -> None:
        """Stop the event loop thread and forget the episodes' tool servers."""
        with self._lock:
            runner, self._runner = self._runner, None
            self._episodes, self._shared = {}, None
        if runner is not None:
            runner.close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_taskset=None, _runner=None, _shared=None, _episodes={}, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        """Over the episodes that ended: mean reward of the scored ones, the unscored count, and the
        mean of each verifiers metric (`env/metric/<name>`); verifier errors."""
        ended = [
            (r, i, s)
            for r, i, s, d in zip(results.rewards, results.info, results.scored, results.done, strict=True)
            if d
        ]
        scored = [(r, i) for r, i, s in ended if s]
        metrics = {
            "env/reward_mean": sum(r for r, _ in scored) / max(len(scored), 1),
            "env/unscored": float(len(ended) - len(scored)),
            **verifier_error_metrics(results),
        }
        names = sorted({name for _, i in scored for name in i.get("metrics", {})})
        for name in names:
            values = [i["metrics"][name] for _, i in scored if i["metrics"].get(name) is not None]
            if values:
                metrics[f"env/metric/{name}"] = sum(values) / len(values)
        return metrics


# -- verifiers' data as posttrain's ---------------------------------------------------------------


def task_row(task: Any) -> dict[str, Any]:
    """A verifiers task as a posttrain task row: its data as JSON, defaults left out."""
    return task.data.model_dump(mode="json", exclude_defaults=True)


def first_messages(data: Any) -> list[Message]:
    """The null harness's first messages: a system message (when the task has a system prompt), then
    the prompt as a user message, or the prompt's own messages."""
    from verifiers.v1.dialects.chat import message_to_wire

    messages: list[Message] = []
    if data.system_prompt:
        messages.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    elif data.prompt:
        messages.extend(message_to_wire(m) for m in data.prompt)
    if not any(m["role"] == "user" for m in messages):
        raise EnvironmentSpecError(
            f"verifiers task {data.idx}: no prompt; a task whose user opens the conversation needs a "
            "multi-agent verifiers Env, which the verifiers environment does not run"
        )
    return messages


def call_id(call: ToolCall, turn: int, index: int) -> str:
    """The call's own id, else one made from its turn and place (the same each time it is read)."""
    return call.id or f"call_{turn}_{index}"


def build_trace(task: Any, log: list[Message], record: dict[str, Any], tools: list[dict[str, Any]]) -> Any:
    """A `vf.Trace` of the episode so far: one node per message, the assistant messages after the
    first messages sampled, their tool calls (text or structured) as verifiers' `ToolCall`s."""
    vf = _vf()
    from verifiers.v1.dialects.chat import parse_message, parse_tools

    nodes, turn = [], 0
    for i, message in enumerate(log):
        sampled = i >= record["start_len"] and message.get("role") == "assistant"
        wire = dict(message)
        if message.get("role") == "assistant":
            turn += sampled
            calls = [c for c in parse_tool_calls(message) if c.name]
            wire["tool_calls"] = [
                {
                    "id": call_id(c, turn, k),
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for k, c in enumerate(calls)
            ]
        nodes.append(
            vf.MessageNode(message=parse_message(wire), parent=i - 1 if i else None, sampled=sampled)
        )
    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        nodes=nodes,
        tools=parse_tools(tools) or [],
    )
    trace.is_completed = trace.ok = True
    return trace


async def stop_fired(task: Any, trace: Any) -> bool:
    """Whether one of the task's `@vf.stop(trace)` hooks ends the episode now (the trace records which)."""
    from verifiers.v1.errors import TaskError
    from verifiers.v1.utils.decorators import invoke

    for stop in task.hooks("stop"):
        result = invoke(stop, {_vf().Trace: trace, "trace": trace})
        result = await result if inspect.isawaitable(result) else result
        if not isinstance(result, bool):
            raise TaskError(f"@stop {stop.__name__} must return bool, got {type(result).__name__}")
        if result:
            trace.stop(stop.__name__)
            return True
    return False


# -- what the adapter does not carry --------------------------------------------------------------


def _needs_runtime(fn: Callable[..., Any]) -> bool:
    parameter = inspect.signature(fn).parameters.get("runtime")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def check_task_class(task_type: type, taskset: Any) -> None:
    """Raise `EnvironmentSpecError` for a task class or toolset this adapter cannot run faithfully."""
    from verifiers.v1.state import State, state_cls

    if task_type.NEEDS_CONTAINER:
        raise EnvironmentSpecError(
            f"verifiers task {task_type.__name__} needs a container runtime, which the verifiers environment does not run"
        )
    toolsets = [*type(taskset).toolsets(taskset.config), *task_type.toolsets(taskset.config.task)]
    for toolset in toolsets:
        if state_cls(type(toolset)) is not State:
            raise EnvironmentSpecError(
                f"verifiers toolset {type(toolset).__name__} keeps a per-rollout State, which verifiers syncs "
                "over a state channel the verifiers environment does not run"
            )


def check_stops(task: Any) -> None:
    """Raise `EnvironmentSpecError` for a reward or metric that needs a runtime, or a `@vf.stop` on a
    request or response (only `@vf.stop`s on the trace run here)."""
    for fn in (*task.hooks("reward"), *task.hooks("metric")):
        if _needs_runtime(fn):
            raise EnvironmentSpecError(
                f"verifiers task {type(task).__name__}: {fn.__name__} needs a runtime (a sandbox), which the "
                "verifiers environment does not provide"
            )
    for stop in task.hooks("stop"):
        others = [
            p.name
            for p in inspect.signature(stop).parameters.values()
            if p.name != "trace" and "Trace" not in str(p.annotation)
        ]
        if others:
            raise EnvironmentSpecError(
                f"verifiers task {type(task).__name__}: @stop {stop.__name__} takes {others}; only stops on "
                "the trace run in the verifiers environment"
            )
