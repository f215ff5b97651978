"""Weight transfer ("refit") from the trained policy to generation engines, in packed buffers.

Three transports, each a handful of large buffers instead of one call per parameter:
- packed buckets through the Ray object store: the state dict grouped by dtype into flat buckets
  of at most `bucket_bytes`, each one contiguous tensor plus the (name, shape, offset) of every
  tensor in it (any node; on GPU the buckets go through host memory);
- shared flat weights: the policy's parameters live in flat shared-memory buffers to begin with,
  and a generation worker on the same machine maps them (no packing, no object store);
- collective: the same buckets broadcast from policy rank 0 to every generation worker over a
  torch.distributed process group of their own (`RefitGroup`; NCCL for CUDA tensors, gloo for
  CPU tensors). The bucket layout is computed once (`plan_buckets`) and sent once; a refit moves
  only the buffers.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import math
import os
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from posttrain.errors import UserError


@dataclass
class PackedBucket:
    buffer: torch.Tensor  # 1-D, one dtype
    entries: list[tuple[str, tuple[int, ...], int]]  # (name, shape, offset into buffer)


@dataclass
class NumpyBucket:
    """A PackedBucket as a numpy array, the form the Ray object store stores and returns without
    copies (measured: 256 MB put 0.1 s / get 0 s, against 0.4 s / 0.35 s as a torch tensor)."""

    array: Any  # numpy.ndarray; bfloat16 travels as int16
    dtype: torch.dtype
    entries: list[tuple[str, tuple[int, ...], int]]

    @classmethod
    def of(cls, bucket: PackedBucket) -> NumpyBucket:
        raw = bucket.buffer.view(torch.int16) if bucket.buffer.dtype == torch.bfloat16 else bucket.buffer
        return cls(raw.numpy(), bucket.buffer.dtype, bucket.entries)

    def to_packed(self) -> PackedBucket:
        with warnings.catch_warnings():  # the object store's arrays are read-only; we only read them
            warnings.simplefilter("ignore", UserWarning)
            buffer = torch.from_numpy(self.array)
        return PackedBucket(buffer.view(self.dtype), self.entries)


DEFAULT_BUCKET_BYTES = 256 << 20


@dataclass(frozen=True)
class BucketLayout:
    """Where each tensor of one packed bucket lives: a 1-D buffer of `numel` elements of `dtype`."""

    dtype: torch.dtype
    numel: int
    entries: tuple[tuple[str, tuple[int, ...], int], ...]  # (name, shape, offset into the buffer)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def plan_buckets(
    specs: Iterable[tuple[str, tuple[int, ...], torch.dtype]],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    cast: torch.dtype | None = None,
) -> list[BucketLayout]:
    """Group (name, shape, dtype) by dtype into buckets of at most `bucket_bytes` (a larger tensor gets
    a bucket of its own), in the order given within each dtype. `cast`: floating-point tensors travel
    in this dtype (the receiver's, e.g. a bf16 engine under an fp32 policy: half the bytes)."""
    by_dtype: dict[torch.dtype, list[tuple[str, tuple[int, ...]]]] = {}
    for name, shape, dtype in specs:
        dtype = cast if cast is not None and dtype.is_floating_point else dtype
        by_dtype.setdefault(dtype, []).append((name, tuple(shape)))
    layouts = []
    for dtype, items in by_dtype.items():
        entries: list[tuple[str, tuple[int, ...], int]] = []
        size = 0
        for name, shape in items:
            numel = math.prod(shape)
            if entries and (size + numel) * dtype.itemsize > bucket_bytes:
                layouts.append(BucketLayout(dtype, size, tuple(entries)))
                entries, size = [], 0
            entries.append((name, shape, size))
            size += numel
        if entries:
            layouts.append(BucketLayout(dtype, size, tuple(entries)))
    return layouts


def pack_bucket(
    layout: BucketLayout,
    tensors: Mapping[str, torch.Tensor],
    device: torch.device | str = "cpu",
    out: torch.Tensor | None = None,
) -> PackedBucket:
    """Copy the layout's tensors (from `tensors`, by name) into `out` or a new buffer on `device`,
    cast to the layout's dtype."""
    buffer = torch.empty(layout.numel, dtype=layout.dtype, device=device) if out is None else out
    for name, shape, offset in layout.entries:
        buffer[offset : offset + math.prod(shape)].copy_(tensors[name].detach().reshape(-1))
    return PackedBucket(buffer, list(layout.entries))


def pack_state_dict(
    state: Mapping[str, torch.Tensor],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    device: torch.device | str = "cpu",
    cast: torch.dtype | None = None,
) -> list[PackedBucket]:
    layouts = plan_buckets(((k, tuple(v.shape), v.dtype) for k, v in state.items()), bucket_bytes, cast)
    return [pack_bucket(layout, state, device) for layout in layouts]


def unpack(buckets: list[PackedBucket]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views into the buckets' buffers, in packing order (no copies)."""
    for bucket in buckets:
        for name, shape, offset in bucket.entries:
            yield name, bucket.buffer[offset : offset + math.prod(shape)].view(shape)


def load_packed(model: torch.nn.Module, buckets: list[PackedBucket]) -> int:
    """Copy packed tensors into the model's parameters and buffers; returns the number of tensors."""
    return load_named(model, unpack(buckets))


@torch.no_grad()
def load_named(model: torch.nn.Module, named: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy (name, tensor) pairs into the model's state of those names, cast to its dtype; returns
    the number of tensors."""
    own = model.state_dict()
    count = 0
    for name, tensor in named:
        own[name].copy_(tensor)
        count += 1
    return count


CHECKSUM_CHUNK = 1 << 18
"""Elements `weights_checksum` converts to float64 at a time (2 MiB)."""


@torch.no_grad()
def weights_checksum(
    parameters: Iterable[torch.Tensor], dtype: torch.dtype | None = None
) -> tuple[float, float]:
    """(Σw, Σw²) in float64 over distinct tensors: a fingerprint of a model's weights. Fused and split
    layouts of the same weights (vLLM's qkv_proj vs HF's q/k/v_proj) give the same sums up to
    float64 rounding; one optimizer step changes them. `dtype`: of the weights first cast to it (what
    an engine that holds them in that dtype has)."""
    total, squares, seen = 0.0, 0.0, set()
    for p in parameters:
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        w = p.detach() if dtype is None else p.detach().to(dtype)
        # in float64, a cache-sized chunk at a time: a whole float64 copy of a large tensor took 5x longer
        for chunk in w.reshape(-1).split(CHECKSUM_CHUNK):
            exact = chunk.double()
            total += float(exact.sum())
            squares += float(torch.dot(exact, exact))
    return total, squares


@dataclass
class SharedWeightsHandle:
    """What a reader on the same machine needs to map a `SharedFlatWeights`: small and picklable."""

    files: list[tuple[str, torch.dtype, int]]  # (path, dtype, numel) per buffer
    entries: list[list[tuple[str, tuple[int, ...], int]]]  # per buffer: (name, shape, offset)
    version_path: str | None = None  # a `SharedSnapshot`'s version word and lock file


def require_shm_space(directory: str, nbytes: int) -> None:
    """Fail with the fix when `directory` (a tmpfs: /dev/shm) cannot hold `nbytes`: writing past a
    full tmpfs through a mapping kills the process with SIGBUS instead of raising an error."""
    free = shutil.disk_usage(directory).free
    if free < nbytes:
        raise UserError(shm_too_small_message(directory, free, nbytes))


def shm_too_small_message(directory: str, free: int, nbytes: int) -> str:
    gib = 1 << 30
    return (
        f"{directory} has {free / gib:.2f} GiB free, but generation.refit_transport=shared_memory needs "
        f"{nbytes / gib:.2f} GiB there for the policy's weights; grow it (docker run "
        f"--shm-size={-(-nbytes // gib) + 1}g, or mount -o remount,size=...G {directory}) or set "
        "generation.refit_transport=object_store"
    )


def flat_shared_buffers(
    model: torch.nn.Module, directory: str, kind: str
) -> tuple[
    list[str],
    list[tuple[str, torch.dtype, int]],
    list[list[tuple[str, tuple[int, ...], int]]],
    dict[str, torch.Tensor],
]:
    """New flat shared-memory buffers for the model's parameters, one file per dtype in `directory`
    (named posttrain-<kind>-<pid>-...): (file paths, (path, dtype, numel) per file, per file the
    (name, shape, offset) of each parameter, and a view of each parameter's place by name). The
    buffers are not filled."""
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, param in model.named_parameters():
        by_dtype.setdefault(param.dtype, []).append((name, param))
    paths, files, entries, views = [], [], [], {}
    for dtype, items in by_dtype.items():
        numel = sum(p.numel() for _, p in items)
        path = f"{directory}/posttrain-{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}-{str(dtype)[6:]}"
        buffer = torch.from_file(path, shared=True, size=numel, dtype=dtype)
        paths.append(path)
        offset, table = 0, []
        for name, param in items:
            views[name] = buffer[offset : offset + param.numel()].view(param.shape)
            table.append((name, tuple(param.shape), offset))
            offset += param.numel()
        files.append((path, dtype, numel))
        entries.append(table)
    return paths, files, entries, views


def stale_shared_files(directory: str = "/dev/shm") -> list[str]:
    """posttrain's shared-memory files in `directory` (posttrain-<kind>-<pid>-..., written by
    `flat_shared_buffers` and the snapshot's version word) whose writing process is gone: a process
    killed with SIGKILL cannot remove them, and they hold memory until deleted."""
    stale = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        parts = name.split("-")
        if len(parts) < 4 or parts[0] != "posttrain" or not parts[2].isdigit():
            continue
        try:
            os.kill(int(parts[2]), 0)
        except ProcessLookupError:
            stale.append(os.path.join(directory, name))
        except PermissionError:  # alive, another user's
            pass
    return stale


class SharedFlatWeights:
    """A model's parameters moved into one flat shared-memory buffer per dtype (files in /dev/shm).

    The parameters become views into the buffers, so training updates them in place and a
    generation worker on the same machine reads the new weights by mapping the same files: a
    refit is then a single copy (buffer -> engine) with no packing and no object store."""

    def __init__(self, model: torch.nn.Module, directory: str = "/dev/shm") -> None:
        require_shm_space(directory, sum(p.numel() * p.element_size() for p in model.parameters()))
        self.paths, files, entries, views = flat_shared_buffers(model, directory, "weights")
        with torch.no_grad():
            for name, param in model.named_parameters():
                views[name].copy_(param.detach())
                param.data = views[name]
        self.handle = SharedWeightsHandle(files, entries)

    def close(self) -> None:
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.paths = []


class SharedSnapshot:
    """A copy of a model's parameters in flat shared-memory buffers (one per dtype, files in /dev/shm)
    that generation workers on the same machine map: the double buffer of asynchronous GRPO.

    Unlike `SharedFlatWeights` the parameters stay where they are, so training never writes these
    buffers; only `write` does, which the controller never runs while a reader loads them
    (`posttrain.rollout.async_collector`). The handle is the same as `SharedFlatWeights`'s."""

    def __init__(self, model: torch.nn.Module, directory: str = "/dev/shm") -> None:
        self.paths, files, entries, self.views = flat_shared_buffers(model, directory, "snapshot")
        # the version word: which policy version the buffers hold (-1: none yet); its file is also the
        # lock that `write` holds exclusively and readers shared (partial rollouts read mid-generation)
        version_path = f"{directory}/posttrain-snapshot-{os.getpid()}-{uuid.uuid4().hex[:8]}-version"
        self.version = torch.from_file(version_path, shared=True, size=1, dtype=torch.int64)
        self.version.fill_(-1)
        self.paths.append(version_path)
        self.lock_fd = os.open(version_path, os.O_RDWR)
        self.handle = SharedWeightsHandle(files, entries, version_path)

    @torch.no_grad()
    def write(self, model: torch.nn.Module, version: int = -1) -> None:
        """Copy the model's current parameters into the buffers, as policy version `version`."""
        with file_lock(self.lock_fd, exclusive=True):
            for name, param in model.named_parameters():
                self.views[name].copy_(param.detach())
            self.version[0] = version

    def close(self) -> None:
        """Remove the files' names (mappings, the writer's and the readers', stay valid)."""
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.paths = []


@contextlib.contextmanager
def file_lock(fd: int, *, exclusive: bool) -> Iterator[None]:
    """flock(2) on `fd`: exclusive for the writer, shared for readers; between processes and between
    two descriptors of one process alike."""
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


class SnapshotReader:
    """A generation worker's mapping of the policy's shared weights (a `SharedFlatWeights`, or a
    `SharedSnapshot` with its version word and lock). Map it before the writer removes the names."""

    def __init__(self, handle: SharedWeightsHandle) -> None:
        self.views = map_shared(handle)
        self.version: torch.Tensor | None = None
        self.lock_fd: int | None = None
        if handle.version_path is not None:
            self.version = torch.from_file(handle.version_path, shared=True, size=1, dtype=torch.int64)
            self.lock_fd = os.open(handle.version_path, os.O_RDWR)

    def published_version(self) -> int | None:
        """The version the snapshot holds (-1: none written yet); None without a version word."""
        return None if self.version is None else int(self.version[0])

    def reading(self) -> contextlib.AbstractContextManager:
        """Hold while reading the buffers: no `SharedSnapshot.write` runs meanwhile."""
        if self.lock_fd is None:
            return contextlib.nullcontext()
        return file_lock(self.lock_fd, exclusive=False)


def map_shared(handle: SharedWeightsHandle) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views into the writer's shared buffers; they show its latest weights."""
    out = []
    for (path, dtype, numel), table in zip(handle.files, handle.entries, strict=True):
        buffer = torch.from_file(path, shared=True, size=numel, dtype=dtype)
        out += [
            (name, buffer[offset : offset + math.prod(shape)].view(shape)) for name, shape, offset in table
        ]
    return out


# ------------------------------------------------------------------------------ collective transport
REFIT_GROUP_TIMEOUT = datetime.timedelta(minutes=10)


def host_refit_store(
    world_size: int, timeout: datetime.timedelta = REFIT_GROUP_TIMEOUT
) -> tuple[dist.TCPStore, str, int]:
    """The rendezvous of a `RefitGroup`, hosted by its sender: (store, address, port), the port
    picked free by the OS. Keep the store alive as long as the group."""
    address = "127.0.0.1"  # one process (cluster.backend=local)
    with contextlib.suppress(ImportError):
        import ray

        if ray.is_initialized():
            address = ray.util.get_node_ip_address()
    store = dist.TCPStore(address, 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
    return store, address, store.port


class RefitGroup:
    """A torch.distributed process group of its own for refit: rank 0 (policy rank 0) sends,
    ranks 1..n (the generation workers) receive.

    It is built on a `TCPStore` (hosted by rank 0, see `host_refit_store`; the others `connect`)
    without the default process group, so it does not touch the policy's own training group.
    Backend: NCCL when `device` is CUDA (imported only then), gloo otherwise. Every member builds
    the group at the same time (gloo connects there: build them concurrently), then calls
    `broadcast` in the same order.
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        device: torch.device | str,
        timeout: datetime.timedelta = REFIT_GROUP_TIMEOUT,
    ) -> None:
        self.store = store  # rank 0's store serves the others: keep it as long as the group
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        prefixed = dist.PrefixStore("posttrain-refit", store)
        if self.device.type == "cuda":
            from torch.distributed import ProcessGroupNCCL

            torch.cuda.set_device(self.device)
            self.backend = ProcessGroupNCCL(prefixed, rank, world_size, timeout)
        else:
            self.backend = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        self._scratch: dict[torch.dtype, torch.Tensor] = {}

    @classmethod
    def connect(
        cls,
        address: str,
        port: int,
        rank: int,
        world_size: int,
        device: torch.device | str,
        timeout: datetime.timedelta = REFIT_GROUP_TIMEOUT,
    ) -> RefitGroup:
        """A receiver (rank > 0) joins the group whose store rank 0 hosts at address:port."""
        store = dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
        return cls(store, rank, world_size, device, timeout)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's `tensor` into every member's `tensor` (same numel and dtype everywhere)."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.backend.broadcast([tensor], options).wait()

    def bucket_buffer(self, layout: BucketLayout) -> torch.Tensor:
        """A buffer for one bucket, valid until the next call. On CPU a slice of one scratch buffer per
        dtype, kept across buckets and refits: fresh pages cost as much as the transfer itself (gloo,
        256 MB between two processes on the dev machine: 0.94 GB/s into new buffers, 1.74 GB/s into
        reused ones). On CUDA a new tensor, whose memory the caching allocator reuses anyway."""
        if self.device.type != "cpu":
            return torch.empty(layout.numel, dtype=layout.dtype, device=self.device)
        scratch = self._scratch.get(layout.dtype)
        if scratch is None or scratch.numel() < layout.numel:
            scratch = self._scratch[layout.dtype] = torch.empty(layout.numel, dtype=layout.dtype)
        return scratch[: layout.numel]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.backend.shutdown()
        self.backend = None
        self.store = None
        self._scratch = {}


def send_buckets(
    group: RefitGroup | None,
    layouts: list[BucketLayout],
    tensors_of: Callable[[BucketLayout], Mapping[str, torch.Tensor]],
) -> int:
    """Rank 0: pack each layout's tensors (`tensors_of(layout)`) into a buffer on the group's device
    and broadcast it; returns the bytes sent. With group None the tensors are still asked for (FSDP
    ranks other than 0 must join each bucket's gather) but nothing is sent."""
    sent = 0
    for layout in layouts:
        tensors = tensors_of(layout)
        if group is not None:
            group.broadcast(pack_bucket(layout, tensors, out=group.bucket_buffer(layout)).buffer)
            sent += layout.nbytes
    return sent


def receive_buckets(group: RefitGroup, layouts: list[BucketLayout]) -> Iterator[PackedBucket]:
    """Rank > 0: each bucket that rank 0 broadcasts, received into a buffer of the announced size and
    dtype on the group's device. A bucket is valid until the next is asked for: load it first."""
    for layout in layouts:
        buffer = group.bucket_buffer(layout)
        group.broadcast(buffer)
        yield PackedBucket(buffer, list(layout.entries))
