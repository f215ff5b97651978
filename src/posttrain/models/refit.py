"""Weight transfer ("refit") from the trained policy to generation engines, in packed buffers.

The state dict is grouped by dtype into flat buckets of at most `bucket_bytes`; each bucket is
one contiguous tensor plus the (name, shape, offset) of every tensor in it, so a transfer is a
handful of large copies instead of one call per parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedBucket:
    buffer: torch.Tensor  # 1-D, one dtype
    entries: list[tuple[str, tuple[int, ...], int]]  # (name, shape, offset into buffer)


def pack_state_dict(state: dict[str, torch.Tensor], bucket_bytes: int = 256 << 20) -> list[PackedBucket]:
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in state.items():
        by_dtype.setdefault(tensor.dtype, []).append((name, tensor))
    buckets = []
    for dtype, items in by_dtype.items():
        itemsize = torch.empty((), dtype=dtype).element_size()
        start = 0
        while start < len(items):
            stop, size = start, 0
            while stop < len(items) and (
                stop == start or (size + items[stop][1].numel()) * itemsize <= bucket_bytes
            ):
                size += items[stop][1].numel()
                stop += 1
            buffer = torch.empty(size, dtype=dtype)
            entries, offset = [], 0
            for name, tensor in items[start:stop]:
                buffer[offset : offset + tensor.numel()].copy_(tensor.detach().reshape(-1))
                entries.append((name, tuple(tensor.shape), offset))
                offset += tensor.numel()
            buckets.append(PackedBucket(buffer, entries))
            start = stop
    return buckets


@torch.no_grad()
def load_packed(model: torch.nn.Module, buckets: list[PackedBucket]) -> int:
    """Copy packed tensors into the model's parameters and buffers; returns the number of tensors."""
    own = model.state_dict()
    count = 0
    for bucket in buckets:
        for name, shape, offset in bucket.entries:
            numel = 1
            for d in shape:
                numel *= d
            own[name].copy_(bucket.buffer[offset : offset + numel].view(shape))
            count += 1
    return count
