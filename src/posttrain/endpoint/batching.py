"""Requests from many sessions, generated together: the endpoint's batching in front of a generator.

Each HTTP request thread calls `GenerationQueue.generate(prompt_ids, params)` and blocks. One worker
thread takes the pending requests as a batch once as many are pending as sessions are running
(`expected()`, the agents that have not finished) or `wait_s` after the first one arrived, whichever
comes first, and generates them with the run's generator (`generate(prompt_ids, params, batch_size)`:
the HF sampler or a vLLM engine, in process or on Ray workers), one call per distinct sampling setting.
A batch seeded run's call gets the seed `turn_seed(seed, batch_index)`, so batches never share a seed;
which requests share a batch depends on timing, so sampled (not greedy) episodes are reproducible only
when each is generated alone.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.generation.interface import Generates
from posttrain.generation.sampling import SamplingParams, turn_seed


@dataclass
class _Pending:
    prompt_ids: list[int]
    params: SamplingParams
    done: threading.Event = field(default_factory=threading.Event)
    result: tuple[list[int], list[float], bool] | None = None
    error: BaseException | None = None


class GenerationQueue:
    """Batches blocking `generate` calls from request threads into the generator's batched calls."""

    def __init__(
        self,
        generator: Generates,
        *,
        batch_size: int,
        wait_s: float = 0.02,
        expected: Callable[[], int] | None = None,
    ) -> None:
        self.generator, self.batch_size, self.wait_s = generator, batch_size, wait_s
        self.expected = expected or (lambda: 1)
        self.batches = 0
        self._pending: list[_Pending] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="endpoint-generation", daemon=True)
        self._thread.start()

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> tuple[list[int], list[float], bool]:
        """(generated ids, their logprobs, truncated at max_new_tokens) for one prompt; blocks until done.
        The generator's exception, if it raised, is raised here."""
        item = _Pending(list(prompt_ids), params)
        with self._cond:
            if self._closed:
                raise RuntimeError("the endpoint's generation queue is closed")
            self._pending.append(item)
            self._cond.notify_all()
        item.done.wait()
        if item.error is not None:
            raise item.error
        assert item.result is not None
        return item.result

    def wake(self) -> None:
        """Re-check the batch condition (a session finished, so fewer requests are expected)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the worker thread; pending requests fail."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _take(self) -> list[_Pending]:
        """The next batch: wait for a first request, then for `expected()` of them or `wait_s`."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            deadline = time.monotonic() + self.wait_s
            while not self._closed and len(self._pending) < self.expected():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, self._pending = self._pending, []
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if self._closed:
                for item in batch:
                    item.error = RuntimeError("the endpoint's generation queue is closed")
                    item.done.set()
                return
            self._run(batch)

    def _run(self, batch: list[_Pending]) -> None:
        """Generate a batch, one generator call per distinct sampling setting (seed aside)."""
        groups: dict[SamplingParams, list[_Pending]] = {}
        for item in batch:
            groups.setdefault(dataclasses.replace(item.params, seed=None), []).append(item)
        for items in groups.values():
            seed = items[0].params.seed
            params = dataclasses.replace(
                items[0].params, seed=None if seed is None else turn_seed(seed, self.batches)
            )
            self.batches += 1
            try:
                out: Any = self.generator.generate([i.prompt_ids for i in items], params, self.batch_size)
                rows = zip(items, out.token_ids, out.logprobs, out.truncated, strict=True)
                for item, ids, lps, truncated in rows:
                    item.result = (list(ids), list(lps), bool(truncated))
            except BaseException as e:  # every waiting request gets the generator's error
                for item in items:
                    item.error = e
            for item in items:
                item.done.set()
