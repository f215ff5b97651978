"""Progress on the console: bars for long phases, the training stage, and counts from workers.

`phase("validation", total=32, counts="episode")` shows a bar with its count and elapsed time under
the training step's bar while the phase runs, and removes it when the phase ends. When stdout is not
a terminal (CI, a log file, a Slurm job) a phase that runs longer than `LINE_INTERVAL_S` prints a line
of its count at most that often (`evaluation: 96/256 episodes, 2m 10s`), and one when it ends; a short
phase prints nothing (the trainers' step lines say what happened).

The bar advances as work finishes wherever it runs: code that finishes a reply or an episode calls
`report("reply")` / `report("episode")`. In the controller's process (the local backend, turn-by-turn
rollouts) that advances the innermost bar whose `counts` is that kind; in a Ray worker it goes to a
named counter actor (`RAY_COUNTER`, made only while a bar is shown on a terminal) that the bar polls.

`stage("train")` names what the run is doing (generate, score, logprobs, train, validate, checkpoint)
for the block; `Timer` blocks name theirs (`TIMER_STAGES`). The step bar shows `current_stage()`.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
Kind = Literal["reply", "episode"]

TIMER_STAGES = {
    "generation": "generate",
    "rewards": "score",
    "reference_logprobs": "logprobs",
    "old_logprobs": "logprobs",
    "teacher": "logprobs",
    "replay_values": "values",
    "training": "train",
    "refit": "refit",
    "refit_check": "refit",
    "publish": "refit",
}
"""The stage a `Timer` block of that name is (a name not here is shown as it is)."""

RAY_COUNTER = "posttrain-progress"
POLL_S = 0.25
LINE_INTERVAL_S = 30.0
"""Without a terminal: the least time between two progress lines of a phase (none before it has run this long)."""


class Phase:
    """The handle of one phase's bar; does nothing when no bar is shown. `counts`: the kind of
    `report` that advances it (None: only `advance` / `update` do)."""

    def __init__(self, bar: Any = None, task: Any = None, counts: Kind | None = None) -> None:
        self.bar, self.task, self.counts = bar, task, counts

    @property
    def shown(self) -> bool:
        return self.bar is not None

    def advance(self, amount: float = 1) -> None:
        if self.bar is not None:
            self.bar.advance(self.task, amount)

    def update(self, *, completed: float | None = None, description: str | None = None) -> None:
        """Set the count done so far, or change the description (e.g. the current sub-step)."""
        if self.bar is not None:
            self.bar.update(self.task, completed=completed, description=description)

    def count(self, kind: Kind, amount: int) -> None:
        """Advance by `amount` if this bar counts `kind`."""
        if kind == self.counts:
            self.advance(amount)


class LinePhase(Phase):
    """A phase without a terminal: counts as a bar would and prints its count as a line to stdout, at
    most every `LINE_INTERVAL_S`, and a last line at its end if it printed any."""

    def __init__(self, description: str, total: float | None, counts: Kind | None) -> None:
        super().__init__(counts=counts)
        self.description, self.total, self.completed = description, total, 0.0
        self.started = self.last_line = time.monotonic()
        self.printed = False

    def advance(self, amount: float = 1) -> None:
        self.completed += amount
        self._maybe_print()

    def update(self, *, completed: float | None = None, description: str | None = None) -> None:
        if completed is not None:
            self.completed = completed
        if description is not None:
            self.description = description
        self._maybe_print()

    def line(self) -> str:
        total = "" if self.total is None else f"/{self.total:g}"
        unit = f" {self.counts}s" if self.counts else ""
        elapsed = int(time.monotonic() - self.started)
        return f"{self.description}: {self.completed:g}{total}{unit}, {elapsed // 60}m {elapsed % 60:02d}s"

    def _maybe_print(self) -> None:
        now = time.monotonic()
        if now - self.last_line >= LINE_INTERVAL_S:
            self.last_line = now
            self.printed = True
            print(self.line(), flush=True)

    def finish(self) -> None:
        if self.printed:
            print(f"{self.line()} (done)", flush=True)


_active: list[tuple[int, Phase]] = []  # this process's shown phases with their threads, innermost last


@contextlib.contextmanager
def _counting_in_this_thread(shown: Phase) -> Iterator[None]:
    """`report` from this thread advances `shown` while the block runs."""
    entry = (threading.get_ident(), shown)
    _active.append(entry)
    try:
        yield
    finally:
        _active.remove(entry)


@contextlib.contextmanager
def phase(
    description: str, total: float | None = None, *, console: Any = None, counts: Kind | None = None
) -> Iterator[Phase]:
    """A transient progress bar for the block on a terminal; `total=None`: a spinner with the elapsed
    time. `console`: a rich Console to draw on (default: stdout, and only when it is a terminal).
    `counts`: the kind of `report` (from this process or Ray workers) that advances the bar."""
    if console is None and not sys.stdout.isatty():
        lines = LinePhase(description, total, counts)
        with _counting_in_this_thread(lines):
            yield lines
        lines.finish()
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    bar = Progress(*columns, TimeElapsedColumn(), transient=True, console=console)
    with bar:
        shown = Phase(bar, bar.add_task(description, total=total), counts)
        with _counting_in_this_thread(shown), _ray_poller(shown):
            yield shown


def report(kind: Kind, amount: int = 1) -> None:
    """`amount` replies (a generated turn) or episodes finished here: advances the innermost bar this
    thread shows, if any (another thread's bar, say the rollouts of asynchronous GRPO, is not this
    work's), else, in a Ray job, the controller's bar through `RAY_COUNTER`."""
    if amount <= 0:
        return
    mine = [shown for thread, shown in _active if thread == threading.get_ident()]
    if mine:
        mine[-1].count(kind, amount)
        return
    counter = _worker_counter()
    if counter is not None:
        with contextlib.suppress(Exception):  # a display never stops the run
            counter.add.remote(kind, amount)


class ProgressCounter:
    """The Ray actor that carries workers' `report`s to the controller's bar: counts per kind."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, kind: str, amount: int) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + amount

    def take(self) -> dict[str, int]:
        """The counts since the last take (then zero)."""
        counts, self.counts = self.counts, {}
        return counts


def _ray() -> Any:
    """The ray module when this process is connected to a Ray cluster (never imports it)."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


_lookup: dict[str, Any] = {"handle": None, "missed_at": -1e9}


def _worker_counter(retry_s: float = 5.0) -> Any:
    """The handle of `RAY_COUNTER` if this process is in a Ray job where it exists; a missing one is
    looked up again at most every `retry_s` seconds."""
    ray = _ray()
    if ray is None:
        return None
    if _lookup["handle"] is None and time.monotonic() - _lookup["missed_at"] > retry_s:
        try:
            _lookup["handle"] = ray.get_actor(RAY_COUNTER)
        except ValueError:
            _lookup["missed_at"] = time.monotonic()
    return _lookup["handle"]


_owned: dict[str, Any] = {}  # job id -> the handle that created RAY_COUNTER (it lives while held)


def _controller_counter(ray: Any) -> Any:
    """This Ray job's `RAY_COUNTER`, made on first use; its creating handle is kept for the job
    (a named actor is collected once the handle that created it is dropped)."""
    job = ray.get_runtime_context().get_job_id()
    if job not in _owned:
        actor = ray.remote(num_cpus=0)(ProgressCounter)
        _owned[job] = actor.options(name=RAY_COUNTER, get_if_exists=True).remote()
    return _owned[job]


@contextlib.contextmanager
def _ray_poller(shown: Phase) -> Iterator[None]:
    """While the block runs, add the counts Ray workers report to `shown` (every POLL_S seconds);
    nothing outside a Ray job or for a bar that counts nothing. A display never stops the run: a
    counter that fails leaves the bar to the final count its caller sets."""
    ray = _ray()
    counter = None
    if ray is not None and shown.counts is not None:
        try:
            counter = _controller_counter(ray)
            ray.get(counter.take.remote(), timeout=30)  # counts of an earlier phase that came in late
        except Exception:
            counter = None
    if counter is None:
        yield
        return
    done = threading.Event()

    def poll() -> None:
        while not done.wait(POLL_S):
            with contextlib.suppress(Exception):
                for kind, amount in ray.get(counter.take.remote(), timeout=10).items():
                    shown.count(kind, amount)

    thread = threading.Thread(target=poll, name="posttrain-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


_stages: list[str] = []
_stage_listeners: list[Callable[[str], None]] = []


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """The block is stage `name` of the run (nested: `current_stage()` is "outer › inner"). Only the
    main thread's blocks count: a background thread (asynchronous rollouts) does not change it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _stages.append(name)
    _notify()
    try:
        yield
    finally:
        _stages.pop()
        _notify()


def staged(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A decorator: every call of the function is stage `name` (`stage`)."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            with stage(name):
                return fn(*args, **kwargs)

        return inner

    return wrap


def current_stage() -> str:
    """What the run is doing now, e.g. "validate › generate"; "" between stages."""
    return " › ".join(_stages)


@contextlib.contextmanager
def on_stage_change(listener: Callable[[str], None]) -> Iterator[None]:
    """Within the block, `listener(current_stage())` is called whenever the stage changes."""
    _stage_listeners.append(listener)
    try:
        yield
    finally:
        _stage_listeners.remove(listener)


def _notify() -> None:
    text = current_stage()
    for listener in list(_stage_listeners):
        listener(text)
