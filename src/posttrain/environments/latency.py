"""An environment that waits: any registered environment behind a configurable step latency.

A benchmark wrapper for environments that wait on something (an HTTP verifier, a judge model,
sandboxed code, a tool server). Each sample's latency is drawn from a distribution with median
`latency_ms`:

- "fixed": exactly `latency_ms`;
- "lognormal": median `latency_ms`, log-standard-deviation `sigma` (x = m · exp(sigma · Φ⁻¹(u)));
- "pareto": median `latency_ms`, tail index `alpha` (x = m · 2^(-1/alpha) · (1 - u)^(-1/alpha));
  alpha <= 1 has no mean,

capped at `max_latency_ms` when given. The uniform number u of a sample is a hash of (`seed`, the
sample's conversation so far): the conversation names the episode and its turn, so the latency is a
function of (seed, episode, turn) alone, whatever batch, call or thread the sample is stepped in.
A call of n samples returns after the longest of their latencies (they wait in parallel, as requests
to a service do), then steps them with the inner environment, whose result is returned unchanged.

The wait holds no lock and no GIL (`time.sleep`); the inner environment's `step` runs under a lock,
so an inner environment that is not safe to call from several threads is never called from two at
once, while several calls wait at once (`concurrent_steps = True`: the rollout loop may keep up to
`environment.max_concurrent_steps` calls in flight).

    environment:
      name: latency
      kwargs: {inner: sliding_puzzle, inner_kwargs: {max_moves: 4}, latency_ms: 200,
               distribution: pareto, alpha: 1.5, seed: 0}
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import threading
import time
from typing import Any, ClassVar, Literal

from posttrain.environments.interface import (
    EnvStepResult,
    EpisodeStart,
    Message,
    make_environment,
    register_environment,
    resolve_environment,
    task_start,
)

Distribution = Literal["fixed", "lognormal", "pareto"]


def uniform_of(seed: int, message_log: list[Message]) -> float:
    """A number in (0, 1) from (seed, conversation): the first 8 bytes of blake2b over their JSON,
    (h + 0.5) / 2**64. Equal inputs give equal numbers in every process (no Python hash salt)."""
    text = json.dumps([seed, message_log], sort_keys=True, default=str)
    h = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
    return (h + 0.5) / 2.0**64


def latency_quantile(
    u: float, *, latency_ms: float, distribution: Distribution, sigma: float = 1.0, alpha: float = 1.5
) -> float:
    """The latency (ms) at quantile u in (0, 1) of a distribution with median `latency_ms`.
    Holds: u = 0.5 gives `latency_ms` for every distribution; "fixed" ignores u."""
    if distribution == "fixed" or latency_ms == 0:
        return float(latency_ms)
    if distribution == "lognormal":
        return latency_ms * math.exp(sigma * statistics.NormalDist().inv_cdf(u))
    if distribution == "pareto":
        return latency_ms * 2.0 ** (-1.0 / alpha) * (1.0 - u) ** (-1.0 / alpha)
    raise ValueError(f"distribution must be fixed, lognormal or pareto, got {distribution!r}")


@register_environment("latency")
class LatencyEnvironment:
    """`inner` (a registered environment name or import path, built with `inner_kwargs`) whose every
    `step` first waits each sample's latency (see the module docstring). `reset`, `generate_tasks`,
    `batch_metrics` and `close` are the inner environment's."""

    concurrent_steps: ClassVar[bool] = True
    """Several `step` calls may run at once from different threads (they wait in parallel)."""

    def __init__(
        self,
        inner: str,
        inner_kwargs: dict[str, Any] | None = None,
        *,
        latency_ms: float = 0.0,
        distribution: Distribution = "fixed",
        sigma: float = 1.0,
        alpha: float = 1.5,
        max_latency_ms: float | None = None,
        seed: int = 0,
    ) -> None:
        check_latency_args(latency_ms, distribution, sigma, alpha, max_latency_ms)
        if resolve_environment(inner) is LatencyEnvironment:
            raise ValueError("environment.kwargs.inner: a latency environment cannot wrap another one")
        self.inner = make_environment(inner, **dict(inner_kwargs or {}))
        if getattr(self.inner, "needs_whole_groups", False):
            raise ValueError(
                f"environment.kwargs.inner={inner!r} scores the samples of a group together; the latency "
                "wrapper takes environments that score each sample on its own"
            )
        self.latency_ms, self.distribution = float(latency_ms), distribution
        self.sigma, self.alpha, self.max_latency_ms, self.seed = sigma, alpha, max_latency_ms, seed
        self._lock = threading.Lock()

    def latencies_ms(self, message_logs: list[list[Message]]) -> list[float]:
        """Each sample's latency (ms): a function of (seed, its conversation) only."""
        out = []
        for log in message_logs:
            u = uniform_of(self.seed, log) if self.distribution != "fixed" else 0.5
            x = latency_quantile(
                u,
                latency_ms=self.latency_ms,
                distribution=self.distribution,
                sigma=self.sigma,
                alpha=self.alpha,
            )
            out.append(x if self.max_latency_ms is None else min(x, self.max_latency_ms))
        return out

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        """Wait the longest latency of the batch (no lock held), then the inner step (under a lock)."""
        wait_ms = max(self.latencies_ms(message_logs), default=0.0)
        if wait_ms > 0:
            time.sleep(wait_ms / 1000.0)
        with self._lock:
            return self.inner.step(message_logs, metadata)

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """The inner environment's reset, or each task's own messages when it has none."""
        reset = getattr(self.inner, "reset", None)
        with self._lock:
            return reset(tasks, seeds) if reset is not None else [task_start(t) for t in tasks]

    def generate_tasks(self, size: int, seed: int, split: str | None = None) -> list[dict[str, Any]]:
        """The inner environment's `generate_tasks` (ValueError when it has none)."""
        generate = getattr(self.inner, "generate_tasks", None)
        if generate is None:
            raise ValueError(f"{type(self.inner).__name__} has no generate_tasks(); use a dataset instead")
        return generate(size, seed) if split is None else generate(size, seed, split=split)

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        return self.inner.batch_metrics(results)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    @classmethod
    def turn_limit(cls, kwargs: dict[str, Any]) -> tuple[str, int] | None:
        """The inner environment's turn limit (`episode_turn_limit`), named as a key of inner_kwargs."""
        from posttrain.environments.interface import episode_turn_limit

        if "inner" not in kwargs:
            return None
        limit = episode_turn_limit(resolve_environment(kwargs["inner"]), kwargs.get("inner_kwargs") or {})
        return None if limit is None else (f"inner_kwargs.{limit[0]}", limit[1])


def check_latency_args(
    latency_ms: float, distribution: str, sigma: float, alpha: float, max_latency_ms: float | None
) -> None:
    """ValueError naming the argument unless latency_ms >= 0, the distribution is known, sigma >= 0,
    alpha > 0 and max_latency_ms (if given) >= 0."""
    if latency_ms < 0:
        raise ValueError(f"environment.kwargs.latency_ms must be >= 0, got {latency_ms}")
    if distribution not in ("fixed", "lognormal", "pareto"):
        raise ValueError(
            f"environment.kwargs.distribution must be fixed, lognormal or pareto, got {distribution!r}"
        )
    if sigma < 0 or alpha <= 0:
        raise ValueError(
            f"environment.kwargs: sigma must be >= 0 and alpha > 0, got sigma={sigma}, alpha={alpha}"
        )
    if max_latency_ms is not None and max_latency_ms < 0:
        raise ValueError(f"environment.kwargs.max_latency_ms must be >= 0, got {max_latency_ms}")
