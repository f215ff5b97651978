"""Run N instances of a worker class and call a method on all of them.

`RayWorkers` places one Ray actor per rank on a placement group (the virtual cluster);
`LocalWorkers` holds a single instance in this process, for debugging with pdb. Both take
the method itself (e.g. `Policy.train`), not a string, so "go to definition" works, and both
raise `WorkerError` naming the failed worker with its traceback.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from posttrain.config.common import ClusterConfig
from posttrain.errors import UserError, WorkerLostError


class WorkerError(RuntimeError):
    """An exception inside a worker; the message holds the worker's name and traceback. `cause`: the
    worker's own exception when Ray could rebuild it (an OSError from a full disk, say)."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


@contextlib.contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with `num_threads` torch CPU threads (None: unchanged), then restore the count.

    torch's CPU thread count belongs to the calling thread (an OpenMP setting per thread; a new thread
    starts from the count of the process's first setting): setting it here changes nothing for the
    controller's other threads, and restoring it keeps a worker's setting from leaking into them.

    It sets the count with `set_torch_threads` (torch's own setter): vLLM's CPU worker replaces
    `torch.set_num_threads` with a no-op for the whole process once it binds its OpenMP threads, and a
    local vLLM engine runs in the controller's process."""
    import torch

    from posttrain.modeling.loading import set_torch_threads

    before = torch.get_num_threads()
    set_torch_threads(num_threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            set_torch_threads(before)


class LocalWorkers:
    """One worker in the controller's process.

    Its constructor and every call run under the worker's own `num_threads` (its constructor's
    argument, if it has one) in the calling thread, restored after: a local worker's thread count does
    not leak into the controller (a generation worker constructed with 1 thread once left the policy
    training on 1 of 2 cores), and a worker called from another thread (the asynchronous collector)
    decodes with its own count while the controller's thread trains with its own."""

    def __init__(self, cls: type, kwargs_per_rank: Sequence[dict[str, Any]], *, name: str) -> None:
        if len(kwargs_per_rank) != 1:
            raise ValueError(
                f"cluster.backend=local runs exactly one worker, but {len(kwargs_per_rank)} were asked for "
                "(cluster.num_workers); use cluster.backend=ray for data parallelism"
            )
        self.names = [f"{name}-0 (local)"]
        self.num_threads: int | None = kwargs_per_rank[0].get("num_threads")
        with torch_threads(self.num_threads):
            self.instances = [cls(**kwargs_per_rank[0])]

    def __len__(self) -> int:
        return 1

    def run(self, method: Callable, args_per_rank: Sequence[tuple] | None = None, **kwargs: Any) -> list[Any]:
        args = args_per_rank[0] if args_per_rank else ()
        with torch_threads(self.num_threads):
            return [method(self.instances[0], *args, **kwargs)]

    def shutdown(self) -> None:
        self.instances.clear()


class RayWorkers:
    """One Ray actor per rank, placed by a placement group with one bundle per worker."""

    def __init__(
        self,
        cls: type,
        kwargs_per_rank: Sequence[dict[str, Any]],
        *,
        name: str,
        cpus_per_worker: int = 1,
        gpus_per_worker: int = 0,
        timeout_s: float = 300.0,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        n = len(kwargs_per_rank)
        bundle = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
        self.placement_group = placement_group([bundle] * n, strategy="PACK")
        ready, _ = ray.wait([self.placement_group.ready()], timeout=timeout_s)
        if not ready:
            ray.util.remove_placement_group(self.placement_group)
            raise WorkerError(placement_message(n, bundle, name, timeout_s, ray.cluster_resources()))
        actor_cls = ray.remote(cls)
        self.names = [f"{name}-{rank}" for rank in range(n)]
        self.actors = [
            actor_cls.options(
                num_cpus=cpus_per_worker,
                num_gpus=gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=rank
                ),
            ).remote(**kwargs)
            for rank, kwargs in enumerate(kwargs_per_rank)
        ]

    def __len__(self) -> int:
        return len(self.actors)

    def run(self, method: Callable, args_per_rank: Sequence[tuple] | None = None, **kwargs: Any) -> list[Any]:
        """Call `method` on ranks 0..len(args_per_rank)-1 (all ranks when None); results in rank order."""
        return self._get(self.submit(method, args_per_rank, **kwargs))

    def submit(self, method: Callable, args_per_rank: Sequence[tuple] | None = None, **kwargs: Any) -> list:
        """Start `method` like `run` does, without waiting: one Ray ref per called rank."""
        args_per_rank = [()] * len(self.actors) if args_per_rank is None else args_per_rank
        if len(args_per_rank) > len(self.actors):
            raise ValueError(f"{len(args_per_rank)} argument sets for {len(self.actors)} workers")
        return [
            getattr(actor, method.__name__).remote(*args, **kwargs)
            for actor, args in zip(self.actors, args_per_rank, strict=False)
        ]

    def _get(self, refs: list) -> list[Any]:
        return get_named(refs, self.names)

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        ray.util.remove_placement_group(self.placement_group)


Workers = LocalWorkers | RayWorkers


def placement_message(n: int, bundle: dict, name: str, timeout_s: float, resources: dict) -> str:
    """Why a worker group could not start: what it asked for, what the cluster has, what to change."""
    return (
        f"the Ray cluster cannot place {n} workers of {bundle} for {name!r} within {timeout_s:.0f}s; "
        f"it has {resources}. Lower cluster.num_workers or cluster.cpus_per_worker, or add nodes."
    )


def get_named(refs: list, names: Sequence[str]) -> list[Any]:
    """ray.get every ref (refs[i] belongs to worker names[i]); the first failure is raised at once,
    naming its worker, even while the other workers still run."""
    import ray

    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            _raise_if_failed(done[0], names[index[done[0]]])
        except WorkerError:
            _raise_lost_peer(pending, [names[index[ref]] for ref in pending])
            raise
    return ray.get(refs)


PEER_GRACE_S = 30.0
"""How long a failed call waits for its peers' calls: a rank whose collective partner died fails
first ("connection closed by peer"), before Ray has noticed the death (a lost node: its health
checks)."""


def _raise_lost_peer(pending: list, names: Sequence[str], grace_s: float = PEER_GRACE_S) -> None:
    """After one worker's call failed: if another worker of the call died, raise `WorkerLostError`
    for that one, the cause. Waits at most `grace_s` for the other calls to end."""
    import ray

    if not pending:
        return
    done, _ = ray.wait(pending, num_returns=len(pending), timeout=grace_s)
    for ref in done:
        try:
            ray.get(ref)
        except _worker_deaths() as e:
            if not _init_failed(e):
                raise WorkerLostError(names[pending.index(ref)], _death_reason(e)) from None
        except ray.exceptions.RayError:
            continue


def _raise_if_failed(ref: Any, name: str) -> None:
    """ray.get a finished ref; a dead worker process raises `WorkerLostError` (a re-run resumes), an
    exception inside the worker `WorkerError` with its traceback (a bug or a bad input)."""
    import ray

    try:
        ray.get(ref)
    except _worker_deaths() as e:
        if _init_failed(e):  # an exception in the worker's constructor: a bug or a bad input
            raise WorkerError(f"worker {name} failed:\n{e}") from None
        raise WorkerLostError(name, _death_reason(e)) from None
    except ray.exceptions.RayError as e:
        cause = e.cause if isinstance(e, ray.exceptions.RayTaskError) else None
        if isinstance(cause, UserError):  # a bad config or input, found inside the worker: one line
            raise UserError(f"worker {name}: {cause}") from cause
        raise WorkerError(f"worker {name} failed:\n{e}", cause) from None


def _worker_deaths() -> tuple[type[BaseException], ...]:
    """Ray's errors for a worker process that is gone (not an exception in its code): its actor
    died, Ray's memory monitor killed it, it crashed, or its node died."""
    import ray

    errors = ray.exceptions
    return (errors.RayActorError, errors.OutOfMemoryError, errors.WorkerCrashedError, errors.NodeDiedError)


def _init_failed(error: BaseException) -> bool:
    """A dead actor whose constructor raised: its process did not die, its code failed."""
    return bool(getattr(error, "actor_init_failed", False))


def _death_reason(error: BaseException) -> str:
    """Ray's account of an actor's death in one line: the first sentence of its message."""
    text = " ".join(str(error).split())
    if "node running low on memory" in text:  # the memory monitor's own words, not a hint list
        return "killed by Ray's memory monitor: the node ran low on memory"
    reason = text.split(". ")[0].removeprefix("The actor died unexpectedly before finishing this task")
    return reason.strip(" .:") or "its process exited: killed, out of memory, or its node was lost"


def run_concurrently(
    *calls: tuple[Workers, Callable, Sequence[tuple] | None], timeout_s: float | None = None
) -> list[list[Any]]:
    """Run every (workers, method, args_per_rank) at the same time and wait for all; results per call.

    For a collective that spans worker groups (a refit broadcast from a policy rank to the
    generation workers): each member blocks until the others join, so calling one group after the
    other would deadlock. Ray workers are started first; in-process (local) workers run in threads
    meanwhile. The first failure is raised at once, naming its worker; `TimeoutError` after
    `timeout_s` (the calls themselves go on)."""
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(calls))
    refs: list = []
    names: list[str] = []
    slots: list[slice | concurrent.futures.Future] = []
    try:
        for workers, method, args in calls:  # Ray first: local calls may block until they join
            if isinstance(workers, RayWorkers):
                started = workers.submit(method, args)
                slots.append(slice(len(refs), len(refs) + len(started)))
                refs += started
                names += workers.names[: len(started)]
            else:
                slots.append(None)
        for i, (workers, method, args) in enumerate(calls):
            if slots[i] is None:
                slots[i] = pool.submit(workers.run, method, args)
        local = [slot for slot in slots if isinstance(slot, concurrent.futures.Future)]
        values = _wait_all(refs, names, local, timeout_s)
    finally:
        pool.shutdown(wait=False)
    return [values[slot] if isinstance(slot, slice) else slot.result() for slot in slots]


def _wait_all(refs: list, names: Sequence[str], local: list, timeout_s: float | None) -> list[Any]:
    """Values of all Ray refs once every ref and every local future is done; a failure on either side
    is raised as soon as it happens."""
    if not local and timeout_s is None:
        return get_named(refs, names) if refs else []
    import concurrent.futures
    import time

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    while pending or not all(f.done() for f in local):
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"workers did not finish within {timeout_s} s")
        for future in local:
            if future.done() and future.exception() is not None:
                raise future.exception()
        if pending:
            import ray

            done, pending = ray.wait(pending, num_returns=1, timeout=0.05)
            for ref in done:
                try:
                    _raise_if_failed(ref, names[index[ref]])
                except WorkerError:
                    _raise_lost_peer(pending, [names[index[r]] for r in pending])
                    raise
        else:
            concurrent.futures.wait(local, timeout=0.05, return_when=concurrent.futures.FIRST_EXCEPTION)
    for future in local:
        future.result()
    if not refs:
        return []
    import ray

    return ray.get(refs)


def init_ray(cluster: ClusterConfig) -> None:
    """Attach to RAY_ADDRESS if set, else start a local Ray with this machine's CPUs (no dashboard,
    token authentication: RAY_AUTH_MODE=token unless set)."""
    import ray

    if ray.is_initialized():
        return
    env_vars = {"TOKENIZERS_PARALLELISM": "false"}
    if "PYTHONPATH" in os.environ:
        env_vars["PYTHONPATH"] = os.environ["PYTHONPATH"]
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env={"env_vars": env_vars}, log_to_driver=True)
    else:
        local_token_auth()
        ray.init(include_dashboard=False, runtime_env={"env_vars": env_vars}, log_to_driver=True)


def local_token_auth() -> None:
    """Token authentication for the local cluster this process starts, chosen explicitly: Ray's own
    default for a new local cluster (a token in ~/.ray/auth_token), set the way `ray.init` sets it
    (RAY_AUTH_MODE=token for this process and its children, Ray's cached config refreshed) but
    without the warning Ray prints on every start when the mode is unset. RAY_AUTH_MODE set by the
    user wins; a Ray without token authentication is left alone."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    try:
        from ray._private.authentication.authentication_token_setup import _enable_token_auth
    except ImportError:
        return
    _enable_token_auth()


def make_workers(
    cls: type, kwargs_per_rank: Sequence[dict[str, Any]], cluster: ClusterConfig, *, name: str
) -> Workers:
    if cluster.backend == "local":
        return LocalWorkers(cls, kwargs_per_rank, name=name)
    init_ray(cluster)
    gpus = 1 if cluster.gpus_per_node > 0 else 0
    return RayWorkers(
        cls, kwargs_per_rank, name=name, cpus_per_worker=cluster.worker_cpus(), gpus_per_worker=gpus
    )
