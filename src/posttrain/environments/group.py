"""Run an environment as N Ray actors (or in this process) and step a batch across them.

    envs = EnvironmentGroup("math", {"timeout_s": 5.0}, num_workers=2)
    result = envs.step(message_logs, metadata)      # split in contiguous chunks, results in input order
    metrics = envs.batch_metrics(result)
    envs.shutdown()

An environment that must see whole groups (the pairwise judge compares the samples of a group with
each other) sets `needs_whole_groups = True` and defines `group_key(message_log, metadata)`: `step`
then gives all samples with one key to one worker (groups in first-seen order, as even a share per
worker as groups allow) and still returns results in input order.

Per-sample verifier failures are the environment's business (they score 0 and are counted).
An exception from a worker's `step` (a bug, bad metadata) fails the whole batch and is raised
here as `WorkerError`, naming the worker and carrying its traceback.

A rollout loop without a turn barrier calls `step` from threads while it decodes
(`posttrain.rollout.env_calls`): up to `max_concurrent_steps` calls at once when the environment
class declares `concurrent_steps = True` (the `latency` wrapper), else one at a time.

Environment actors reserve `cpus_per_worker` CPUs (0 by default), so they always fit next to
policy and generation workers, which hold the CPUs through placement groups; verification is
short and bursty, between generation and training.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any, Literal

from posttrain.distributed.workers import WorkerError, get_named
from posttrain.environments.interface import (
    EnvStepResult,
    EpisodeStart,
    Message,
    resolve_environment,
    task_start,
)

_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(EnvStepResult))


class _EnvWorker:
    """Holds one environment; the body of each Ray actor (and of the local backend)."""

    def __init__(self, env_cls: type, kwargs: dict[str, Any]) -> None:
        self.env = env_cls(**kwargs)

    def ready(self) -> bool:
        return True

    def needs_whole_groups(self) -> bool:
        return bool(getattr(self.env, "needs_whole_groups", False))

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        return self.env.step(message_logs, metadata)

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """The environment's reset, or each task's own messages when it has none."""
        reset = getattr(self.env, "reset", None)
        return reset(tasks, seeds) if reset is not None else [task_start(t) for t in tasks]

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        return self.env.batch_metrics(results)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


class EnvironmentGroup:
    """`num_workers` copies of one environment; `step` splits a batch across them.

    Args:
        name: a registered environment name ("math"), an import path ("pkg.module:Class"),
            or a class. The class is resolved here, so environments registered in the driver's
            script work in the actors too.
        kwargs: constructor arguments of the environment.
        num_workers: Ray actors (ignored by the local backend, which holds one environment).
        backend: "ray" (actors; Ray is started with `init_ray` if it is not running) or "local"
            (in this process, for debugging).
        cpus_per_worker: CPUs each actor reserves from Ray's scheduler.
        max_concurrent_steps: how many `step` calls a rollout loop may have in flight on this group
            (`posttrain.rollout.env_calls`), for an environment class that declares
            `concurrent_steps = True` (safe to step from several threads at once; its Ray actors then
            run that many calls at once); 1 for any other.
    """

    def __init__(
        self,
        name: str | type,
        kwargs: dict[str, Any] | None = None,
        *,
        num_workers: int = 1,
        backend: Literal["ray", "local"] = "ray",
        cpus_per_worker: float = 0.0,
        max_concurrent_steps: int = 1,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if max_concurrent_steps < 1:
            raise ValueError(f"max_concurrent_steps must be >= 1, got {max_concurrent_steps}")
        env_cls = resolve_environment(name)
        concurrent = bool(getattr(env_cls, "concurrent_steps", False))
        self.max_concurrent_steps = max_concurrent_steps if concurrent else 1
        """The bound on step calls in flight that rollout loops read (`concurrency_bound`)."""
        kwargs = dict(kwargs or {})
        label = name if isinstance(name, str) else env_cls.__name__
        self.backend = backend
        self._group_key = getattr(env_cls, "group_key", None)
        self._whole_groups = False
        self._local: _EnvWorker | None = None
        self._actors: list[Any] = []
        if backend == "local":
            self.names = [f"env-{label}-0 (local)"]
            try:
                self._local = _EnvWorker(env_cls, kwargs)
            except Exception as e:
                raise WorkerError(f"environment worker {self.names[0]} failed to start: {e!r}") from e
            self._whole_groups = self._local.needs_whole_groups()
        elif backend == "ray":
            import ray

            from posttrain.config.common import ClusterConfig
            from posttrain.distributed.workers import init_ray

            init_ray(ClusterConfig())
            actor_cls = ray.remote(_EnvWorker)
            self.names = [f"env-{label}-{rank}" for rank in range(num_workers)]
            self._actors = [
                actor_cls.options(num_cpus=cpus_per_worker, max_concurrency=self.max_concurrent_steps).remote(
                    env_cls, kwargs
                )
                for _ in range(num_workers)
            ]
            try:
                self._get([actor.ready.remote() for actor in self._actors])
                self._whole_groups = self._get([self._actors[0].needs_whole_groups.remote()])[0]
            except WorkerError:
                self.shutdown()
                raise
        else:
            raise ValueError(f"backend must be 'ray' or 'local', got {backend!r}")
        if self._whole_groups and self._group_key is None:
            self.shutdown()
            raise ValueError(
                f"{env_cls.__name__} needs whole groups on one worker but defines no group_key(message_log, "
                "metadata); define it or set environment.num_workers=1"
            )

    @property
    def num_workers(self) -> int:
        return len(self.names)

    @property
    def needs_whole_groups(self) -> bool:
        """Whether the environment scores a group's samples together (the pairwise judge): then a
        rollout loop steps a group only when all its running episodes have ended their turn."""
        return self._whole_groups

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        """Step every sample, results in input order. The batch is split in contiguous chunks, one per
        worker, or, for an environment that needs whole groups, in pieces of whole groups."""
        if len(message_logs) != len(metadata):
            raise ValueError(f"{len(message_logs)} message logs but {len(metadata)} metadata entries")
        if not message_logs:
            return EnvStepResult(rewards=[], observations=[], done=[], metadata=[], info=[])
        if not self._whole_groups or self._local is not None:
            return EnvStepResult.concat(self._chunked("step", message_logs, metadata))
        pieces = self._group_pieces(message_logs, metadata)
        chunks = self._run_pieces("step", pieces, message_logs, metadata)
        merged = EnvStepResult.concat(chunks)
        position = {i: p for p, i in enumerate(i for piece in pieces for i in piece)}
        order = [position[i] for i in range(len(message_logs))]
        return EnvStepResult(**{name: [getattr(merged, name)[p] for p in order] for name in _RESULT_FIELDS})

    def _group_pieces(
        self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]
    ) -> list[list[int]]:
        """Sample indices in at most one piece per worker, each piece whole groups (samples with one
        `group_key`, in first-seen order), as even a number of groups per piece as they allow."""
        groups: dict[Hashable, list[int]] = {}
        for i, (log, meta) in enumerate(zip(message_logs, metadata, strict=True)):
            groups.setdefault(self._group_key(log, meta), []).append(i)
        members = list(groups.values())
        k = min(len(self._actors), len(members))
        bounds = [round(r * len(members) / k) for r in range(k + 1)]
        return [[i for group in members[bounds[r] : bounds[r + 1]] for i in group] for r in range(k)]

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """Start one episode per task (the environment's `reset`, or the task's own messages), split
        over the workers like `step`."""
        if len(tasks) != len(seeds):
            raise ValueError(f"{len(tasks)} tasks but {len(seeds)} seeds")
        return [start for chunk in self._chunked("reset", tasks, seeds) for start in chunk] if tasks else []

    def _chunked(self, method: str, *columns: list) -> list:
        """Call `method` on contiguous chunks of the columns, one chunk per worker, in input order;
        every chunk's result must have one entry per input."""
        n = len(columns[0])
        if self._local is None:
            k = max(1, min(len(self._actors), n))
            bounds = [n * r // k for r in range(k + 1)]
            return self._run_pieces(
                method, [list(range(bounds[r], bounds[r + 1])) for r in range(k)], *columns
            )
        try:
            chunk = getattr(self._local, method)(*columns)
        except Exception as e:
            raise WorkerError(f"environment worker {self.names[0]} failed: {e!r}") from e
        if len(chunk) != n:
            raise WorkerError(
                f"environment worker {self.names[0]} returned {len(chunk)} results for {n} samples"
            )
        return [chunk]

    def _run_pieces(self, method: str, pieces: list[list[int]], *columns: list) -> list:
        """Call `method` on actor r with the entries `pieces[r]` of the columns; every result must have
        one entry per input."""
        if not self._actors:
            raise RuntimeError("the environment group is shut down")
        chunks = self._get(
            [
                getattr(self._actors[r], method).remote(*([c[i] for i in piece] for c in columns))
                for r, piece in enumerate(pieces)
            ]
        )
        for r, chunk in enumerate(chunks):
            if len(chunk) != len(pieces[r]):
                raise WorkerError(
                    f"environment worker {self.names[r]} returned {len(chunk)} results for {len(pieces[r])} samples"
                )
        return chunks

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        """The environment's metrics over a whole (concatenated) batch, computed by worker 0."""
        if self._local is not None:
            return self._local.batch_metrics(results)
        if not self._actors:
            raise RuntimeError("the environment group is shut down")
        return self._get([self._actors[0].batch_metrics.remote(results)])[0]

    def _get(self, refs: list) -> list[Any]:
        return get_named(refs, self.names)

    def shutdown(self) -> None:
        """Close the environments (stopping their verifier processes) and end the actors. Idempotent."""
        if self._local is not None:
            self._local.close()
            self._local = None
        if self._actors:
            import ray

            try:
                ray.wait(
                    [a.close.remote() for a in self._actors], num_returns=len(self._actors), timeout=10.0
                )
            except Exception:  # noqa: BLE001 - dead actors are killed below anyway
                pass
            for actor in self._actors:
                ray.kill(actor)
            self._actors = []

    def __enter__(self) -> EnvironmentGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
