"""The asynchronous collector: generation in a background thread, feeding a replay buffer.

One thread (in the controller: the same loop for the local backend, where it runs the in-process
generation worker, and for Ray, where it drives the generation actors while the policy actors
train) repeats:

  1. wait until it may start batch i: not paused, room in the buffer, and the throttle
         taken + queued - published <= max_age
     (taken: batches the trainer has taken; queued: whole batches in the buffer; published: the
     newest policy version published). Batch i is then taken at step taken + queued at the
     latest, by a trainer at version >= published, so no group it makes is older than max_age
     when it is sampled: nothing is generated only to be dropped, and the trainer cannot starve
     (the throttle always opens once the trainer has published or taken a batch);
  2. load the newest published weights into the generator if it has older ones (`load_weights`);
  3. `produce(i, version)`: generate and score batch i with those weights -> rollout groups;
  4. put the groups into the buffer.

Weights cannot tear: the trainer writes a snapshot (`publish`) and the collector loads it
(step 2) under one lock, so a generator never reads weights while they are written, and it
loads them only between batches (never inside a generate call). Training itself updates other
memory (the snapshot is a copy).

Faults: an exception in the thread (a dead generation worker, an environment that raised) is
raised in the trainer at its next `take`; a generator that makes no progress for `watchdog_s`
seconds while the trainer waits raises `GenerationStalled`. Neither hangs the run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from posttrain.errors import WorkerLostError
from posttrain.rollout.replay_buffer import ReplayBuffer, RolloutGroup


class GenerationFailed(RuntimeError):
    """The generation thread raised; the original exception is the cause."""


class GenerationStalled(GenerationFailed):
    """No rollout group arrived within the watchdog time while the trainer waited for one."""


# ---------------------------------------------------------------------------------------- activity
class ActivityLog:
    """Intervals [start, end) of time.monotonic() during which one side (generator, waiting trainer)
    was busy; appended by one thread, read by another."""

    def __init__(self, keep_s: float = 3600.0) -> None:
        self.intervals: list[tuple[float, float]] = []
        self.keep_s = keep_s
        self._lock = threading.Lock()
        self._open: float | None = None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        start = time.monotonic()
        self._open = start
        try:
            yield
        finally:
            end = time.monotonic()
            with self._lock:
                self._open = None
                self.intervals.append((start, end))
                self.intervals = [iv for iv in self.intervals if iv[1] > end - self.keep_s]

    def snapshot(self, now: float) -> list[tuple[float, float]]:
        """The closed intervals, plus the open one (if any) up to `now`."""
        with self._lock:
            out = list(self.intervals)
            if self._open is not None:
                out.append((self._open, now))
        return out


def busy_time(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end) covered by `intervals` (pairwise disjoint: one thread's activity)."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


def overlap_time(
    first: list[tuple[float, float]], second: list[tuple[float, float]], start: float, end: float
) -> float:
    """Seconds of [start, end) covered by both lists (each pairwise disjoint)."""
    total = 0.0
    for a, b in first:
        lo, hi = max(a, start), min(b, end)
        if hi > lo:
            total += busy_time(second, lo, hi)
    return total


# ---------------------------------------------------------------------------------------- collector
class AsyncCollector:
    """Runs `produce(batch_index, policy_version) -> groups` in a thread, `groups_per_batch` groups per
    batch, into `buffer`; the trainer `take`s them and `publish`es new weights.

    `load_weights(version)` loads the snapshot last written by `publish` into the generator; it is
    called by the collector thread between batches, or by the trainer's thread while `paused`.
    """

    def __init__(
        self,
        produce: Callable[[int, int], list[RolloutGroup]],
        load_weights: Callable[[int], None],
        buffer: ReplayBuffer,
        *,
        groups_per_batch: int,
        watchdog_s: float,
        next_batch: int = 0,
        taken: int = 0,
    ) -> None:
        if buffer.capacity < groups_per_batch:
            raise ValueError(
                f"the replay buffer ({buffer.capacity} groups) cannot hold one batch of {groups_per_batch}"
            )
        self.produce, self.load_weights, self.buffer = produce, load_weights, buffer
        self.groups_per_batch, self.watchdog_s = groups_per_batch, watchdog_s
        self.max_age = buffer.max_age
        self.next_batch, self.taken = next_batch, taken
        self.published: int | None = None
        self.generator_version: int | None = None
        self.cond = threading.Condition()
        self.weights_lock = threading.Lock()
        self.error: BaseException | None = None
        self.in_flight = False
        self.pauses = 0
        self.stopping = False
        self.last_progress = time.monotonic()
        self.generating = ActivityLog()
        self.waiting = ActivityLog()  # the trainer, waiting in `take`
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ trainer side
    def start(self) -> None:
        if self.published is None:
            raise RuntimeError("publish the first weights before starting the collector")
        self.thread = threading.Thread(target=self._run, name="posttrain-async-collector", daemon=True)
        self.thread.start()

    def publish(self, version: int, write: Callable[[], None]) -> None:
        """Write the policy's new weights (`write()`, e.g. into the snapshot) as `version`; the
        generator picks them up before its next batch."""
        with self.weights_lock:
            write()
            with self.cond:
                self.published = version
                self.cond.notify_all()

    def take(self, version: int) -> list[RolloutGroup]:
        """The next `groups_per_batch` groups fresh for trainer version `version` (oldest first),
        waiting for them; raises what the generation thread raised, or `GenerationStalled` after
        `watchdog_s` seconds without a new batch."""
        with self.waiting.active(), self.cond:
            waiting_since = time.monotonic()
            while True:
                self._raise_failure()
                groups = self.buffer.sample(self.groups_per_batch, version)
                if groups is not None:
                    self.taken += 1
                    self.cond.notify_all()
                    return groups
                if self.thread is None or not self.thread.is_alive():
                    raise GenerationFailed("the generation thread is not running (never started, or stopped)")
                left = max(waiting_since, self.last_progress) + self.watchdog_s - time.monotonic()
                if left <= 0:
                    raise GenerationStalled(
                        f"no rollout batch arrived for {self.watchdog_s:g} s (grpo.async_watchdog_s) while "
                        "the trainer waited: a generation worker or the environment is hung. The run stops."
                    )
                self.cond.wait(timeout=min(left, 1.0))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No batch starts inside; the one in flight (if any) lands in the buffer first. For
        validation and checkpoints: the generator is idle and the data position is consistent."""
        with self.cond:
            self.pauses += 1
            try:
                deadline = time.monotonic() + self.watchdog_s
                while self.in_flight and self.error is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise GenerationStalled(
                            f"the batch in flight did not finish within {self.watchdog_s:g} s "
                            "(grpo.async_watchdog_s): a generation worker or the environment is hung"
                        )
                    self.cond.wait(timeout=min(left, 1.0))
            except BaseException:
                self.pauses -= 1
                raise
        try:
            yield
        finally:
            with self.cond:
                self.pauses -= 1
                self.cond.notify_all()

    def sync_weights(self) -> int:
        """Load the newest published weights into the generator if it runs older ones; its version."""
        with self.weights_lock:
            version = self.published
            if version is not None and version != self.generator_version:
                self.load_weights(version)
                self.generator_version = version
        return self.generator_version

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the thread after its batch in flight (waits at most `timeout_s`; a hung generator
        is left to its daemon thread)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=timeout_s)

    def _raise_failure(self) -> None:
        if self.error is None:
            return
        if isinstance(self.error, WorkerLostError):
            raise self.error  # already says which worker died and what to do
        raise GenerationFailed(
            f"generation failed in the background thread ({type(self.error).__name__}: {self.error}); "
            "the run stops"
        ) from self.error

    # ------------------------------------------------------------------ generator side
    def _may_start(self) -> bool:
        if self.stopping:
            return True
        if self.pauses or self.published is None or self.buffer.free < self.groups_per_batch:
            return False
        queued = len(self.buffer) // self.groups_per_batch
        return self.taken + queued - self.published <= self.max_age

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    self.cond.wait_for(self._may_start)
                    if self.stopping:
                        return
                    self.in_flight = True
                    index = self.next_batch
                with self.generating.active():
                    version = self.sync_weights()
                    groups = self.produce(index, version)
                with self.cond:
                    for group in groups:
                        self.buffer.put(group)
                    self.next_batch += 1
                    self.in_flight = False
                    self.last_progress = time.monotonic()
                    self.cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the trainer's thread
            with self.cond:
                self.error = e
                self.in_flight = False
                self.cond.notify_all()

    def activity(self, start: float, end: float) -> dict[str, float]:
        """Generator and trainer activity over [start, end) (time.monotonic()): generator idle and
        trainer idle (waiting in `take`) seconds, and the share of the window both were busy."""
        span = max(end - start, 1e-9)
        generating = self.generating.snapshot(end)
        waiting = self.waiting.snapshot(end)
        busy = busy_time(generating, start, end)
        both = busy - overlap_time(generating, waiting, start, end)
        return {
            "async/generator_idle_s": span - busy,
            "async/trainer_idle_s": busy_time(waiting, start, end),
            "async/overlap_fraction": both / span,
        }
