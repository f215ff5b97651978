"""Wall-clock timing of named phases: `with timer("generation"): ...`; the block is also the run's
console stage (`posttrain.logging.progress.stage`, named by `TIMER_STAGES`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from posttrain.logging.progress import TIMER_STAGES, stage


class Timer:
    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with stage(TIMER_STAGES.get(name, name)):
                yield
        finally:
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        """Seconds per phase since the last pop, as `timing/<phase>` metrics."""
        out = {f"timing/{k}": v for k, v in self.totals.items()}
        self.totals = {}
        return out
