"""Environment steps off the decoder's thread, a bounded number at a time.

The continuous episode loops (`posttrain.rollout.continuous`) submit each batch of ended turns here
and go on decoding the other episodes; between decode steps they collect the calls that returned.

    with EnvironmentCalls(environment, limit) as calls:
        calls.submit(keys, turn_ids, message_logs, metadata)   # returns at once (when calls.room)
        for call in calls.finished(block=False): ...           # the calls that have returned

What holds:
- at most `limit` calls are in flight (`room` is False at the limit; `submit` then raises): the loop
  keeps the ended turns waiting and sends them together in one call when a slot frees
  (backpressure: a slow environment gets fewer, larger calls, never more than `limit` at once);
- `finished` returns calls in submission order among those that have returned, and raises the
  exception of a call that failed (the loop stops, as a synchronous call would have stopped it);
- `results()` lists every call's result in submission order, whatever order they finished in.

The bound comes from the environment (`concurrency_bound`): an `EnvironmentGroup`'s
`max_concurrent_steps` (config `environment.max_concurrent_steps`, for environments that declare
`concurrent_steps = True`, else 1), else 1. With 1 the calls still run on a thread of their own:
one at a time, in order, so an environment that is not thread-safe is never entered twice at once.
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass
from typing import Any

from posttrain.environments.interface import EnvStepResult, Message


@dataclass
class EnvCall:
    """One step call: the episodes it steps, their turns' kept token ids, and (once done) its result."""

    order: int
    keys: list[int]
    turn_ids: list[list[int]]
    future: cf.Future


def concurrency_bound(environment: Any) -> int:
    """How many step calls a rollout loop may have in flight on `environment`: its
    `max_concurrent_steps` (at least 1), else 1."""
    return max(1, int(getattr(environment, "max_concurrent_steps", 1) or 1))


class EnvironmentCalls:
    """`environment.step` calls on a pool of `limit` threads; see the module docstring."""

    def __init__(self, environment: Any, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the bound on concurrent environment calls must be >= 1, got {limit}")
        self.environment, self.limit = environment, limit
        self._pool = cf.ThreadPoolExecutor(max_workers=limit, thread_name_prefix="env-step")
        self._in_flight: list[EnvCall] = []
        self._done: list[tuple[int, EnvStepResult]] = []
        self._submitted = 0
        self.peak = 0
        """The most calls that were in flight at once."""

    def __enter__(self) -> EnvironmentCalls:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def busy(self) -> bool:
        """Whether any call is in flight."""
        return bool(self._in_flight)

    @property
    def room(self) -> bool:
        """Whether another call may be submitted (fewer than `limit` in flight)."""
        return len(self._in_flight) < self.limit

    def submit(
        self,
        keys: list[int],
        turn_ids: list[list[int]],
        message_logs: list[list[Message]],
        metadata: list[dict[str, Any]],
    ) -> None:
        """Start `environment.step(message_logs, metadata)` for episodes `keys`; RuntimeError at the bound."""
        if not self.room:
            raise RuntimeError(f"{self.limit} environment calls are in flight already (the bound)")
        future = self._pool.submit(self.environment.step, message_logs, metadata)
        self._in_flight.append(EnvCall(self._submitted, keys, turn_ids, future))
        self._submitted += 1
        self.peak = max(self.peak, len(self._in_flight))

    def finished(self, *, block: bool) -> list[tuple[EnvCall, EnvStepResult]]:
        """The calls that have returned, with their results, in submission order; with `block`, wait
        until at least one has (nothing to wait for: []). Raises a failed call's exception."""
        if block and self._in_flight:
            cf.wait([c.future for c in self._in_flight], return_when=cf.FIRST_COMPLETED)
        ready = [c for c in self._in_flight if c.future.done()]
        self._in_flight = [c for c in self._in_flight if not c.future.done()]
        out = []
        for call in ready:
            result = call.future.result()  # a call that raised raises here
            self._done.append((call.order, result))
            out.append((call, result))
        return out

    def results(self) -> list[EnvStepResult]:
        """Every returned call's result, in submission order."""
        return [result for _, result in sorted(self._done, key=lambda pair: pair[0])]
