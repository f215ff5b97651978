"""Wall-clock timing of named phases: `with timer("generation"): ...`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Timer:
    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        """Seconds per phase since the last pop, as `timing/<phase>` metrics."""
        out = {f"timing/{k}": v for k, v in self.totals.items()}
        self.totals = {}
        return out
