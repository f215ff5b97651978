"""Padded tensor batches, their splits into shards and microbatches, and resumable samplers (of one
list, and of several sources with fixed shares of every batch)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from posttrain.data.tokenize import TokenizedExample
from posttrain.errors import UserError


class ChangedDataError(UserError):
    """A resumed run's training data is not the data its checkpoint was sampling."""


@dataclass
class TokenBatch:
    """B right-padded sequences.

    input_ids: [B, T] long; attention_mask: [B, T] long (1 = real token);
    loss_mask: [B, T] float, 1 where token t is a training target (always 0 at t = 0).
    Subclasses add per-sequence [B] or per-token [B, T] tensors; `select` keeps them aligned.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_target_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum().item())

    def select(self, start: int, stop: int) -> TokenBatch:
        """Rows [start, stop), trimmed to their own longest sequence."""
        length = int(self.attention_mask[start:stop].sum(dim=1).max().item()) if stop > start else 0
        updates = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, torch.Tensor):
                value = value[start:stop]
                if value.dim() == 2:
                    value = value[:, :length]
            updates[field.name] = value
        return dataclasses.replace(self, **updates)

    def reorder(self, order: Sequence[int]) -> TokenBatch:
        """The rows in `order` (a permutation of range(len(self))), every tensor field alike."""
        if sorted(order) != list(range(len(self))):
            raise ValueError(f"reorder needs a permutation of range({len(self)}), got {list(order)}")
        index = torch.as_tensor(list(order), dtype=torch.long)
        updates = {
            f.name: getattr(self, f.name)[index]
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **updates)

    def shards(self, n: int) -> list[TokenBatch]:
        """n contiguous, equal shards (one per data-parallel worker)."""
        if len(self) % n:
            raise ValueError(f"a batch of {len(self)} sequences does not split evenly over {n} workers")
        size = len(self) // n
        return [self.select(i * size, (i + 1) * size) for i in range(n)]

    def chunks(self, n: int) -> list[TokenBatch]:
        """At most n contiguous, non-empty pieces whose sizes differ by at most one."""
        n = min(n, len(self))
        bounds = [round(i * len(self) / n) for i in range(n + 1)]
        return [self.select(bounds[i], bounds[i + 1]) for i in range(n)]

    def microbatches(self, size: int) -> Iterator[TokenBatch]:
        for start in range(0, len(self), size):
            yield self.select(start, min(start + size, len(self)))


def concat_batches(batches: Sequence[TokenBatch], pad_id: int = 0) -> TokenBatch:
    """The rows of `batches` (all of one class, the same fields set) in order, every [B, T] tensor
    right-padded to the longest T: `input_ids` with `pad_id`, every other field with 0."""
    if not batches:
        raise ValueError("concat_batches needs at least one batch")
    length = max(b.input_ids.shape[1] for b in batches)
    updates = {}
    for field in dataclasses.fields(batches[0]):
        values = [getattr(b, field.name) for b in batches]
        if all(v is None for v in values):
            continue
        if any(not isinstance(v, torch.Tensor) for v in values):
            raise ValueError(f"concat_batches: field {field.name!r} is set in some batches only")
        if values[0].dim() == 2:
            fill = pad_id if field.name == "input_ids" else 0
            values = [torch.nn.functional.pad(v, (0, length - v.shape[1]), value=fill) for v in values]
        updates[field.name] = torch.cat(values)
    return dataclasses.replace(batches[0], **updates)


def collate(examples: Sequence[TokenizedExample], pad_id: int = 0) -> TokenBatch:
    length = max(len(e) for e in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), length), dtype=torch.float32)
    for i, e in enumerate(examples):
        n = len(e)
        input_ids[i, :n] = torch.tensor(e.input_ids)
        attention_mask[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(e.loss_mask, dtype=torch.float32)
    loss_mask[:, 0] = 0.0
    return TokenBatch(input_ids, attention_mask, loss_mask)


class EpochSampler:
    """Shuffled batches of indices, reshuffled each epoch from (seed, epoch); resumable by its state."""

    def __init__(self, num_items: int, batch_size: int, *, seed: int, shuffle: bool = True) -> None:
        if batch_size > num_items:
            raise ValueError(f"batch size {batch_size} is larger than the dataset ({num_items} items)")
        self.num_items, self.batch_size, self.seed, self.shuffle = num_items, batch_size, seed, shuffle
        self.epoch, self.offset = 0, 0

    @property
    def batches_per_epoch(self) -> int:
        return self.num_items // self.batch_size

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_items))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.num_items, generator=generator).tolist()

    def next_batch(self) -> list[int]:
        if self.offset + self.batch_size > self.num_items:
            self.epoch, self.offset = self.epoch + 1, 0
        batch = self._order()[self.offset : self.offset + self.batch_size]
        self.offset += self.batch_size
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "num_items": self.num_items}

    def load_state_dict(self, state: dict) -> None:
        """Resume at the saved position; a different number of items (the training data changed
        since the checkpoint) is a `ChangedDataError`, since its batches would not continue the run's."""
        saved = state.get("num_items", self.num_items)  # checkpoints before the count was saved
        if saved != self.num_items:
            raise ChangedDataError(
                f"the checkpoint was sampling {saved} training items and this run has {self.num_items}: "
                "the training data changed since the checkpoint (with data.exclude_validation_from_train, "
                "a changed data.validation also changes which training tasks are dropped). Resume with "
                "the same data, or start a new run (another logging.run_dir, or checkpoint.resume=none)"
            )
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])


class MixtureSampler:
    """Batches drawn from several sources (lists of items laid end to end), `counts[i]` items of source
    i in every batch, each source an `EpochSampler` of its own (seed `seed + i`; its epochs are its
    own). Indices are into the concatenation; a batch interleaves the sources one item each in turn
    (counts 3, 2, 1: a b c a b a), so contiguous slices of it (minibatches) mix them too. Resumable
    by its state."""

    def __init__(
        self, sizes: Sequence[int], counts: Sequence[int], *, seed: int, names: Sequence[str] = ()
    ) -> None:
        if len(sizes) != len(counts) or not sizes:
            raise ValueError(f"one count per source: {len(sizes)} sources, {len(counts)} counts")
        labels = list(names) or [f"source {i}" for i in range(len(sizes))]
        for label, size, count in zip(labels, sizes, counts, strict=True):
            if not 0 < count <= size:
                raise ValueError(
                    f"{label} has {size} tasks and would give {count} of every batch; it needs at least "
                    f"that many tasks and a count of at least 1"
                )
        self.labels = labels
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.samplers = [
            EpochSampler(n, k, seed=seed + i) for i, (n, k) in enumerate(zip(sizes, counts, strict=True))
        ]

    def next_batch(self) -> list[int]:
        picks = [[o + j for j in s.next_batch()] for o, s in zip(self.offsets, self.samplers, strict=True)]
        turns = max(len(p) for p in picks)
        return [p[t] for t in range(turns) for p in picks if t < len(p)]

    def describe(self) -> str:
        """Each source's size and share of a batch, for the run's first lines."""
        parts = [
            f"{label} {s.num_items} tasks, {s.batch_size} per batch"
            for label, s in zip(self.labels, self.samplers, strict=True)
        ]
        return "sources: " + "; ".join(parts)

    def state_dict(self) -> dict:
        return {"sources": [s.state_dict() for s in self.samplers]}

    def load_state_dict(self, state: dict) -> None:
        for sampler, own in zip(self.samplers, state["sources"], strict=True):
            sampler.load_state_dict(own)
