"""Progress bars for long phases: a batch's generation, validation, evaluation, a model conversion.

`phase("validation", total=32)` shows a bar with its count and elapsed time under the training
step's bar while the phase runs, and removes it when the phase ends. When stdout is not a terminal
(CI, a log file, a Slurm job) it prints nothing: the trainers' step lines say what happened.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


class Phase:
    """The handle of one phase's bar; does nothing when no bar is shown."""

    def __init__(self, bar: Any = None, task: Any = None) -> None:
        self.bar, self.task = bar, task

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


@contextlib.contextmanager
def phase(description: str, total: float | None = None, *, console: Any = None) -> Iterator[Phase]:
    """A transient progress bar for the block on a terminal; `total=None`: a spinner with the elapsed
    time. `console`: a rich Console to draw on (default: stdout, and only when it is a terminal)."""
    if console is None and not sys.stdout.isatty():
        yield Phase()
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
        yield Phase(bar, bar.add_task(description, total=total))
