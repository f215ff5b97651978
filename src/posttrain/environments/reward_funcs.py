"""Reward functions in TRL's shape (`GRPOTrainer(reward_funcs=[fn])`) as a single-turn environment.

Each function is called once per batch of B completed episodes, with keyword arguments:

    fn(prompts=..., completions=..., **fields) -> list[float | None]   (length B)

- `prompts[i]`: the conversation before the reply (a list of {"role", "content"} messages);
- `completions[i]`: the reply's text (a str);
- one keyword per task field (the dataset row's other columns, e.g. `answer`), a list with the
  field's value for each sample (None where a row lacks it), as TRL passes dataset columns.

A function should accept `**kwargs` for the fields it does not use. The reward of sample i is
sum_j weights[j] * fn_j(...)[i] over the functions that scored it; a None means "not applicable"
(TRL's convention), and a sample that no function scored is left out of the loss (`scored=False`).
An exception, or a result that is not B numbers, stops the run naming the function: a batch-level
function that fails is a bug to fix, not a zero reward to train on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from posttrain.environments.interface import (
    EnvStepResult,
    Message,
    last_assistant_content,
    register_environment,
    resolve_callable,
)

RewardFunc = Callable[..., Sequence[float | None]]


def func_name(fn: Any) -> str:
    """The name a function's metrics are logged under (`env/reward/<name>`)."""
    return getattr(fn, "__name__", None) or type(fn).__name__


class RewardFuncsEnvironment:
    """Scores single-turn episodes with TRL-style reward functions (see the module docstring).

    `reward_funcs`: callables or "module:function" strings; `weights`: one per function (default 1)."""

    def __init__(
        self, reward_funcs: Sequence[RewardFunc | str], weights: Sequence[float] | None = None
    ) -> None:
        if isinstance(reward_funcs, (str, bytes)) or callable(reward_funcs):
            reward_funcs = [reward_funcs]
        self.funcs = [
            resolve_callable(f, f"environment.kwargs.reward_funcs[{i}]") for i, f in enumerate(reward_funcs)
        ]
        if not self.funcs:
            raise ValueError("reward_funcs is empty: give at least one reward function")
        self.weights = [1.0] * len(self.funcs) if weights is None else [float(w) for w in weights]
        if len(self.weights) != len(self.funcs):
            raise ValueError(f"{len(self.weights)} reward weights for {len(self.funcs)} reward functions")
        self.names = [func_name(f) for f in self.funcs]

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        prompts = [_before_last_reply(log) for log in message_logs]
        completions = [last_assistant_content(log) for log in message_logs]
        fields = sorted({k for meta in metadata for k in meta} - {"prompts", "completions"})
        columns = {k: [meta.get(k) for meta in metadata] for k in fields}
        scores = [
            self._call(fn, name, prompts, completions, columns)
            for fn, name in zip(self.funcs, self.names, strict=True)
        ]
        rewards, scored, info = [], [], []
        for i in range(len(message_logs)):
            given = [(w, s[i]) for w, s in zip(self.weights, scores, strict=True) if s[i] is not None]
            rewards.append(sum(w * r for w, r in given))
            scored.append(bool(given))
            info.append({f"reward/{n}": s[i] for n, s in zip(self.names, scores, strict=True)})
        result = EnvStepResult.final(rewards, metadata, info)
        result.scored = scored
        return result

    def _call(
        self,
        fn: RewardFunc,
        name: str,
        prompts: list[list[Message]],
        completions: list[str],
        columns: dict[str, list[Any]],
    ) -> list[float | None]:
        """`fn`'s rewards for the batch, checked to be B numbers (or None) and finite."""
        try:
            out = list(fn(prompts=prompts, completions=completions, **columns))
        except Exception as e:
            raise RuntimeError(f"reward function {name!r} raised {type(e).__name__}: {e}") from e
        if len(out) != len(completions):
            raise RuntimeError(
                f"reward function {name!r} returned {len(out)} rewards for {len(completions)} completions"
            )
        bad = [r for r in out if r is not None and (not isinstance(r, (int, float)) or not math.isfinite(r))]
        if bad:
            raise RuntimeError(
                f"reward function {name!r} returned {bad[0]!r}; each reward must be a finite number or None"
            )
        return [None if r is None else float(r) for r in out]

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        """`env/reward_mean` over scored samples and `env/reward/<function>` (each function's mean
        over the samples it scored, unweighted)."""
        scored = [r for r, s in zip(results.rewards, results.scored, strict=True) if s]
        metrics = {"env/reward_mean": sum(scored) / max(len(scored), 1)}
        for name in self.names:
            values = [i[f"reward/{name}"] for i in results.info if i.get(f"reward/{name}") is not None]
            if values:
                metrics[f"env/reward/{name}"] = sum(values) / len(values)
        return metrics


def _before_last_reply(log: list[Message]) -> list[Message]:
    """The conversation before its last assistant message."""
    for i in range(len(log) - 1, -1, -1):
        if log[i].get("role") == "assistant":
            return [dict(m) for m in log[:i]]
    return [dict(m) for m in log]


register_environment("reward_funcs")(RewardFuncsEnvironment)
