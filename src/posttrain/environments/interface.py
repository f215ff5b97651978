"""The `Environment` protocol, its step result, a reward-function adapter and the registry.

An environment scores a batch of conversations. The rollout loop calls
`env.step(message_logs, metadata)` after each generation turn and gets, per sample, a reward,
the next observation (a message to append for another turn, or None), a done flag, updated
metadata and diagnostics. `env.batch_metrics(result)` turns diagnostics into logged numbers.

Writing a reward for a single-turn task takes one function (see docs/environments.md):

    def reward(completion: str, metadata: dict) -> float:
        return float(metadata["answer"] in completion)

    env = RewardFunctionEnvironment(reward)
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from posttrain.environments.timeout_pool import TIMEOUT, TimeoutPool
from posttrain.errors import UserError

Message = dict[str, Any]
"""One chat message: {"role": "system" | "user" | "assistant" | "tool", "content": str}, plus, in the
ecosystem's tool format, "tool_calls" on an assistant message and "name" / "tool_call_id" on a tool one."""


@dataclass
class EpisodeStart:
    """What `Environment.reset` returns for one task: the start of one episode.

    messages: the conversation before the first assistant turn (system and user messages).
    metadata: the episode's state (a game board, the task's answer); passed to every `step`.
    tools: JSON schemas of the tools offered to the model (given to the chat template as `tools=`),
        or None.
    stop_strings: generation of the first turn also stops at these (e.g. "</action>").
    response_prefix: text that begins every assistant turn of the episode, written by the
        environment, not generated (e.g. "<action>": the model only writes the move). Its tokens
        are in the sequence with loss mask 0; the assistant message (what `step` reads) holds the
        prefix and the reply.
    """

    messages: list[Message]
    metadata: dict[str, Any]
    tools: list[dict[str, Any]] | None = None
    stop_strings: tuple[str, ...] = ()
    response_prefix: str = ""


@dataclass
class EnvStepResult:
    """What `Environment.step` returns for a batch of B samples; every list has length B.

    rewards: the reward of this turn.
    observations: the next message to append (e.g. a tool result or user turn), None when done; or a
        list of messages when one turn gets several (the results of several tool calls), see
        `observation_messages`.
    done: whether the episode of this sample is over.
    metadata: the sample's metadata, updated (passed to the next `step` of a multi-turn episode).
    info: per-sample diagnostics (e.g. "extracted_answer", "verifier_error"), read by
        `batch_metrics` and written to rollout logs; not used for training.
    scored: False for an episode the environment could not score (a judge that failed, a broken
        task): it is left out of the loss instead of being scored 0. Default: every sample True.
    stop_strings: per sample, extra stop strings for its next turn (None: the configured ones).
    response_prefixes: per sample, the response prefix of its next turn and the ones after it
        (None: keep the episode's, see `EpisodeStart.response_prefix`; "" drops it).
    reward_components: per sample, named parts of this turn's reward, e.g. {"correct": 1.0,
        "format": 0.1}, for advantage.estimator=gdpo, which normalises each part apart; {}: none.
        Where given, the reward must be their sum (NeMo RL's contract, checked here: GRPO and GDPO
        read the same total). Default: {} for every sample.
    invalid_tool_call / malformed_thinking: per sample, whether the assistant message of this turn
        made a tool call that could not be run (unreadable, unknown tool, arguments that do not fit)
        or has a malformed `<think>` block; advantage.invalid_tool_call_advantage /
        malformed_thinking_advantage then set that turn's advantage. Default: False for every sample.
    new_context: per sample, whether the observation replaces the conversation: the next turn's
        prompt is the chat template over the observation's messages alone, the episode's earlier
        turns closed off as a token sequence of their own (`Trajectory.contexts`; GRPO trains each
        with the episode's advantage). For a game whose observation says everything the player needs
        (the board), so that every turn is read like the first. Default: False for every sample.
    """

    rewards: list[float]
    observations: list[Message | list[Message] | None]
    done: list[bool]
    metadata: list[dict[str, Any]]
    info: list[dict[str, Any]] = field(default_factory=list)
    scored: list[bool] = field(default_factory=list)
    stop_strings: list[tuple[str, ...] | None] = field(default_factory=list)
    response_prefixes: list[str | None] = field(default_factory=list)
    reward_components: list[dict[str, float]] = field(default_factory=list)
    invalid_tool_call: list[bool] = field(default_factory=list)
    malformed_thinking: list[bool] = field(default_factory=list)
    new_context: list[bool] = field(default_factory=list)

    @classmethod
    def final(
        cls, rewards: list[float], metadata: list[dict[str, Any]], info: list[dict[str, Any]]
    ) -> EnvStepResult:
        """A single-turn result: every episode ends with this reward, no next observation."""
        n = len(rewards)
        return cls(rewards, [None] * n, [True] * n, [dict(m) for m in metadata], info)

    def __post_init__(self) -> None:
        n = len(self.rewards)
        self.info = self.info or [{} for _ in range(n)]
        self.scored = self.scored or [True] * n
        self.stop_strings = self.stop_strings or [None] * n
        self.response_prefixes = self.response_prefixes or [None] * n
        self.reward_components = self.reward_components or [{} for _ in range(n)]
        self.invalid_tool_call = self.invalid_tool_call or [False] * n
        self.malformed_thinking = self.malformed_thinking or [False] * n
        self.new_context = self.new_context or [False] * n
        lengths = {f.name: len(getattr(self, f.name)) for f in dataclasses.fields(self)}
        if len(set(lengths.values())) != 1:
            raise ValueError(
                "EnvStepResult fields must all have one entry per sample; got lengths "
                + " ".join(f"{k}={v}" for k, v in lengths.items())
            )
        for i, (reward, parts) in enumerate(zip(self.rewards, self.reward_components, strict=True)):
            check_reward_components(i, reward, parts)

    def __len__(self) -> int:
        return len(self.rewards)

    @classmethod
    def concat(cls, results: Sequence[EnvStepResult]) -> EnvStepResult:
        """Concatenate per-chunk results, keeping order."""
        return cls(
            rewards=[r for x in results for r in x.rewards],
            observations=[o for x in results for o in x.observations],
            done=[d for x in results for d in x.done],
            metadata=[m for x in results for m in x.metadata],
            info=[i for x in results for i in x.info],
            scored=[s for x in results for s in x.scored],
            stop_strings=[s for x in results for s in x.stop_strings],
            response_prefixes=[p for x in results for p in x.response_prefixes],
            reward_components=[c for x in results for c in x.reward_components],
            invalid_tool_call=[f for x in results for f in x.invalid_tool_call],
            malformed_thinking=[f for x in results for f in x.malformed_thinking],
            new_context=[f for x in results for f in x.new_context],
        )


def check_reward_components(index: int, reward: float, parts: dict[str, float]) -> None:
    """Raise ValueError unless `parts` is empty or its values sum to `reward` (NeMo RL's tolerance:
    relative 1e-5, absolute 1e-6) with string names."""
    if not parts:
        return
    if not all(isinstance(name, str) and name for name in parts):
        raise ValueError(
            f"sample {index}: reward component names must be non-empty strings, got {list(parts)}"
        )
    total = sum(float(v) for v in parts.values())
    if not math.isclose(float(reward), total, rel_tol=1e-5, abs_tol=1e-6):
        raise ValueError(
            f"sample {index}: reward {reward} but its reward_components {parts} sum to {total}; an "
            "environment with named components must set the reward to their sum"
        )


@runtime_checkable
class Environment(Protocol):
    """Scores a batch of conversations; see `EnvStepResult` for what comes back.

    `step` must return one entry per input sample, in input order. A failure that concerns one
    sample (a verifier error) should score that sample (usually 0) and be recorded in `info`, or
    leave it out of the loss (`scored=False`); an exception from `step` is for failures of the
    whole batch and stops the run.

    Optional methods (looked up with getattr; environments without them keep working):
    - `reset(tasks, seeds) -> list[EpisodeStart]`: start one episode per task (a dataset row, all
      its fields) from the environment's own state (a game board); without it the episode starts
      from the task's messages and the task's other fields are the metadata (`task_start`).
    - `close()`: release processes; `EnvironmentGroup` calls it.
    """

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult: ...

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]: ...


def task_start(task: dict[str, Any]) -> EpisodeStart:
    """The episode start of an environment without `reset`: the task's "messages" (a list of chat
    messages) begin the conversation, every other field is metadata."""
    if "messages" not in task:
        raise ValueError(
            f"a task needs a 'messages' field (or an environment with reset()); got fields {sorted(task)}"
        )
    metadata = {k: v for k, v in task.items() if k != "messages"}
    return EpisodeStart(messages=[dict(m) for m in task["messages"]], metadata=metadata)


def observation_messages(observation: Message | list[Message] | None) -> list[Message]:
    """An observation as a list of messages: [] for None, [message] for one message."""
    if observation is None:
        return []
    return [observation] if isinstance(observation, dict) else list(observation)


def last_assistant_content(message_log: Sequence[Message]) -> str:
    """The content of the last assistant message ("" if there is none)."""
    for message in reversed(message_log):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return ""


class EnvironmentSpecError(UserError, ValueError):
    """An environment name, import path or constructor argument that does not resolve."""


class VerifierErrorsError(UserError):
    """Most of a batch's samples could not be scored: the environment (or its reward function) is broken."""


def check_verifier_errors(infos: Sequence[dict[str, Any]], max_fraction: float | None, name: str) -> None:
    """Raise `VerifierErrorsError` when more than `max_fraction` of the samples (their final `info`)
    have a "verifier_error"; the message names the environment and shows the first error.
    `max_fraction` None: never."""
    errors = [i.get("verifier_error") for i in infos if i.get("verifier_error") is not None]
    if max_fraction is None or not infos or len(errors) <= max_fraction * len(infos):
        return
    raise VerifierErrorsError(
        f"environment {name}: {len(errors)} of {len(infos)} samples could not be scored (verifier errors), "
        f"more than environment.max_error_fraction={max_fraction}; the first: {errors[0]}. Fix the "
        "environment or its reward function (environment.max_error_fraction=null turns this check off)"
    )


def verifier_error_metrics(results: EnvStepResult) -> dict[str, float]:
    """`env/verifier_errors` (all failed verifications: exceptions and timeouts) and `env/verifier_timeouts`."""
    errors = [i.get("verifier_error") for i in results.info]
    return {
        "env/verifier_errors": float(sum(e is not None for e in errors)),
        "env/verifier_timeouts": float(sum(e == TIMEOUT for e in errors)),
    }


class PooledEnvironment:
    """Holds an optional `TimeoutPool` of verifier processes: closed by `close`, never pickled."""

    _pool: TimeoutPool | None = None

    def close(self) -> None:
        """Stop the verifier processes (a later `step` starts new ones)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}


class RewardFunctionEnvironment(PooledEnvironment):
    """A single-turn environment from a function `reward_fn(completion, metadata) -> float`.

    `completion` is the content of the last assistant message; `metadata` is the dataset row's
    metadata (e.g. {"answer": "42"}). If `reward_fn` raises, the sample scores 0 and is counted
    in `env/verifier_errors`. With `timeout_s`, calls run in a subprocess (`TimeoutPool`) and a
    call that takes longer also scores 0 (then `reward_fn` must be picklable: a module-level
    function, or any callable if cloudpickle is installed).
    """

    callable_kwargs = ("reward_fn",)
    """Constructor arguments that may be given as "module:function" strings (a config, the command line)."""

    def __init__(
        self,
        reward_fn: Callable[[str, dict[str, Any]], float] | str,
        *,
        timeout_s: float | None = None,
        num_procs: int = 1,
    ) -> None:
        self.reward_fn = resolve_callable(reward_fn, "environment.kwargs.reward_fn")
        self.timeout_s = timeout_s
        self.num_procs = num_procs
        self._pool: TimeoutPool | None = None

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        completions = [last_assistant_content(log) for log in message_logs]
        if self.timeout_s is None:
            rewards, errors = [], []
            for completion, meta in zip(completions, metadata, strict=True):
                try:
                    rewards.append(float(self.reward_fn(completion, meta)))
                    errors.append(None)
                except Exception as e:  # one sample's failure scores it 0; the batch goes on
                    rewards.append(0.0)
                    errors.append(f"exception: {type(e).__name__}: {e}"[:500])
        else:
            if self._pool is None:
                self._pool = TimeoutPool(self.reward_fn, timeout_s=self.timeout_s, num_procs=self.num_procs)
            outcomes = self._pool.map(list(zip(completions, metadata, strict=True)))
            rewards = [float(o.value) if o.ok else 0.0 for o in outcomes]
            errors = [o.error for o in outcomes]
        return EnvStepResult.final(rewards, metadata, [{"verifier_error": e} for e in errors])

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        n = max(len(results), 1)
        return {"env/reward_mean": sum(results.rewards) / n, **verifier_error_metrics(results)}


ENVIRONMENTS: dict[str, type] = {}
"""Environment classes by name, for configs (`env.name: math`). Add yours with `register_environment`."""


def register_environment(name: str) -> Callable[[type], type]:
    """Class decorator: `@register_environment("my_env")` makes `make_environment("my_env")` work."""

    def decorator(cls: type) -> type:
        old = ENVIRONMENTS.get(name)
        # the same class defined again (a reloaded module, a re-run notebook cell) replaces itself
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(
                f"environment {name!r} is already registered as {ENVIRONMENTS[name].__qualname__}"
            )
        ENVIRONMENTS[name] = cls
        return cls

    return decorator


register_environment("reward_fn")(RewardFunctionEnvironment)


def resolve_environment(name: str | type) -> type:
    """A registered name, an import path "package.module:ClassName", or a class itself."""
    if isinstance(name, type):
        return name
    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name]
    if ":" in name:
        found = import_attribute(name, "environment.name")
        if not isinstance(found, type):
            raise EnvironmentSpecError(f"environment.name={name!r} is a {type(found).__name__}, not a class")
        return found
    raise EnvironmentSpecError(
        f"unknown environment {name!r}; registered: {sorted(ENVIRONMENTS)}. Register yours with "
        "@register_environment(name), or give an import path like 'my_package.envs:MyEnvironment'"
    )


def import_attribute(spec: str, key: str) -> Any:
    """`module:attribute` imported; `EnvironmentSpecError` naming `key` (the config key) when the
    module does not import or has no such attribute."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise EnvironmentSpecError(f"{key}={spec!r} is not of the form 'module:name'")
    try:
        loaded = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any failure of the user's module is reported in one line
        raise EnvironmentSpecError(
            f"{key}={spec!r}: cannot import module {module!r} ({type(e).__name__}: {e}); put its folder "
            "on PYTHONPATH"
        ) from e
    if not hasattr(loaded, attr):
        raise EnvironmentSpecError(f"{key}={spec!r}: module {module!r} has no attribute {attr!r}")
    return getattr(loaded, attr)


def resolve_callable(value: Callable | str, key: str) -> Callable:
    """A callable as is; a "module:function" string imported (`import_attribute`) and checked callable."""
    found = import_attribute(value, key) if isinstance(value, str) else value
    if not callable(found):
        raise EnvironmentSpecError(f"{key}={value!r} is a {type(found).__name__}, not a function")
    return found


def check_environment(name: str | type, kwargs: dict[str, Any]) -> None:
    """Raise `EnvironmentSpecError` unless `name` resolves to an environment class, `kwargs` fit its
    constructor, and its `callable_kwargs` given as strings import. Run at config validation, so a
    typo stops `--print-config`, `doctor` and a run before anything starts."""
    cls = resolve_environment(name)
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        raise EnvironmentSpecError(f"environment.kwargs do not fit {cls.__qualname__}: {e}") from None
    except ValueError:  # no signature to check (a builtin)
        pass
    for arg in getattr(cls, "callable_kwargs", ()):
        if isinstance(kwargs.get(arg), str):
            resolve_callable(kwargs[arg], f"environment.kwargs.{arg}")


def episode_turn_limit(cls: type, kwargs: dict[str, Any]) -> tuple[str, int] | None:
    """(argument, value): the constructor argument that bounds an episode's turns, which an
    environment class names in `turn_limit_kwarg` (the sliding puzzle's "max_moves", reasoning-gym's
    "max_tries"), and its value in `kwargs` or, absent there, its default; or what a class's own
    `turn_limit(kwargs)` returns (a wrapper: its inner environment's). None for a class without one.

    The rollout's `environment.max_turns` must be at least that value, or episodes are cut before
    the environment pays their last turn (config validation checks it)."""
    own = getattr(cls, "turn_limit", None)  # a wrapper names its inner environment's (latency)
    if own is not None:
        return own(kwargs)
    name = getattr(cls, "turn_limit_kwarg", None)
    if name is None:
        return None
    if name in kwargs:
        return name, int(kwargs[name])
    return name, int(inspect.signature(cls).parameters[name].default)


def make_environment(name: str | type, **kwargs: Any) -> Environment:
    """Build an environment by registered name (or import path, or class) with its constructor kwargs."""
    env = resolve_environment(name)(**kwargs)
    if not isinstance(env, Environment):
        raise TypeError(f"{type(env).__qualname__} does not implement Environment (step and batch_metrics)")
    return env
