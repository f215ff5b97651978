"""Continuous batching for posttrain's HF sampler: rows join and leave a running decode batch.

Multi-turn episodes do not wait for each other: when an episode's turn ends, its environment
step runs and it rejoins the batch with its next prompt while the other rows keep decoding (no
turn barrier). `ContinuousDecoder` holds the running batch:

- `add(keys, prompts)`: prefill new rows (each distinct prompt once) and merge their KV cache
  into the running one. Rows are right-aligned on a shared column: a row whose prompt is shorter
  than the running batch's cache is left-padded (masked), and when a new prompt is longer the
  running rows are shifted right in a new buffer (a copy of the cache, the price of joining).
- `step()`: sample one token for every row (one forward of the whole batch), return each row's
  token and logprob, and drop the rows that finished (EOS, a stop string, or their token budget).
  A row may sample from a random stream of its own (`generators=` of `add` / `resume`): its tokens
  then do not depend on which other rows share its steps (up to the logits' batch rounding).

The distribution sampled is the sampler's (`choose_tokens`: softmax(logits / T), top-k, top-p,
logprobs before truncation), and attention is the same SDPA call with the same masks and
position ids, so a batch whose rows all join at once decodes exactly like `sample` (tested).
Only full-attention caches are supported (every layer a `DynamicLayer`); models with
sliding-window layers use the turn-by-turn loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from posttrain.generation.sampler import PreallocatedLayer, _hits_stop_string, choose_tokens, left_pad
from posttrain.modeling.attention import GQA_SDPA_ATTENTION, attention_implementation


class SlotLayer(PreallocatedLayer):
    """The sampler's preallocated KV layer (buffers [B, H, capacity, D], writes at column `length`),
    built from existing keys and values: every row right-aligned so that all rows write their next
    token at the same column."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        super().__init__(capacity)
        batch, heads, length, dim = keys.shape
        self.lazy_initialization(keys, values)
        self.key_buffer = keys.new_zeros(batch, heads, capacity, dim)
        self.value_buffer = values.new_zeros(batch, heads, capacity, values.shape[-1])
        self.key_buffer[:, :, :length] = keys
        self.value_buffer[:, :, :length] = values
        self.length = length
        self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]

    def keep_rows(self, index: torch.Tensor) -> None:
        self.batch_select_indices(index)

    def get_seq_length(self) -> int:
        return self.length


def _merge(old: SlotLayer | None, new_keys: torch.Tensor, new_values: torch.Tensor, room: int) -> SlotLayer:
    """The running rows and new rows in one right-aligned layer with `room` free columns."""
    if old is None:
        return SlotLayer(new_keys, new_values, new_keys.shape[2] + room)
    length = max(old.length, new_keys.shape[2])
    keys = _right_align([old.keys, new_keys], length)
    values = _right_align([old.values, new_values], length)
    return SlotLayer(keys, values, length + room)


def _right_align(parts: list[torch.Tensor], length: int) -> torch.Tensor:
    """Concatenate [b_i, H, L_i, D] tensors over the batch, each left-padded with zeros to `length`."""
    padded = [torch.nn.functional.pad(p, (0, 0, length - p.shape[2], 0)) for p in parts]
    return torch.cat(padded, dim=0)


@dataclass
class Row:
    """One row of the running batch: whose it is and what it has generated in this call."""

    key: Any
    budget: int
    stop_strings: tuple[str, ...] = ()
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished_by: str = ""  # "eos" | "stop" | "length" once finished
    generator: torch.Generator | None = None
    """The row's own random stream (one uniform number a token), or None: the decoder's `generator`."""
    cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    """With `keep_cache`, once finished: per layer the row's keys and values [H, L, D] for every
    token it has seen except its last sampled one (not yet run through the model); `resume` goes on
    from there."""


class ContinuousDecoder:
    """A running decode batch that rows join (`add`) and leave (finished rows, after `step`).

    Args:
        model: a causal LM (eval mode is the caller's business, as in `sample`).
        eos_ids: tokens that end a row.
        pad_id: the padding token of left-padded prompts.
        temperature, top_p, top_k: as in `sample`.
        tokenizer: needed for stop strings.
        generator: a seeded `torch.Generator` for reproducible sampling, or None.
        room: free cache columns allocated past the longest row at each merge (more: fewer re-layouts).
        keep_cache: finished rows keep their KV cache (`Row.cache`), so that `resume` continues a
            multi-turn episode by running only its new tokens (the observation) instead of its
            whole history.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_ids: set[int],
        pad_id: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        tokenizer: Any = None,
        generator: torch.Generator | None = None,
        room: int = 64,
        keep_cache: bool = False,
    ) -> None:
        if any(type(layer) is not DynamicLayer for layer in DynamicCache(config=model.config).layers):
            raise ValueError("continuous batching needs a full-attention KV cache (no sliding-window layers)")
        self.model, self.eos_ids, self.pad_id = model, eos_ids, pad_id
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.tokenizer, self.generator, self.room = tokenizer, generator, room
        self.keep_cache = keep_cache
        self.device = next(model.parameters()).device
        self.rows: list[Row] = []
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self.logits = torch.zeros(0, 0, device=self.device)

    def __len__(self) -> int:
        return len(self.rows)

    def _forward(self, **inputs: Any) -> Any:
        """The model's forward, with the sampler's grouped-query SDPA kernel when it uses SDPA."""
        if getattr(self.model.config, "_attn_implementation", None) != "sdpa":
            return self.model(**inputs)
        with attention_implementation(self.model, GQA_SDPA_ATTENTION):
            return self.model(**inputs)

    @torch.no_grad()
    def add(
        self,
        keys: list[Any],
        prompts: list[list[int]],
        budgets: list[int],
        stop_strings: list[tuple[str, ...]],
        generators: list[torch.Generator | None] | None = None,
    ) -> None:
        """Prefill `prompts` (each distinct one once) and join them to the running batch; `generators`:
        each row's own random stream (None: the decoder's)."""
        if not prompts:
            return
        if any(s for s in stop_strings) and self.tokenizer is None:
            raise ValueError("stop strings need the tokenizer to decode the generated text")
        distinct: dict[tuple[int, ...], int] = {}
        source = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        ids, mask = left_pad([list(p) for p in distinct], self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        fresh = DynamicCache(config=self.model.config)
        out = self._forward(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            past_key_values=fresh,
            use_cache=True,
            logits_to_keep=1,
        )
        rows = torch.tensor(source, device=self.device)
        new_logits = out.logits[:, -1][rows]
        new_mask = mask[rows]
        self._join(fresh, rows, new_mask, new_logits)
        self._add_rows(keys, budgets, stop_strings, generators)

    @torch.no_grad()
    def resume(
        self,
        keys: list[Any],
        caches: list[list[tuple[torch.Tensor, torch.Tensor]]],
        new_tokens: list[list[int]],
        budgets: list[int],
        stop_strings: list[tuple[str, ...]],
        generators: list[torch.Generator | None] | None = None,
    ) -> None:
        """Join rows that continue where a finished row (`Row.cache`) stopped: only `new_tokens` (its
        last sampled token, then e.g. an observation) run through the model, on top of the kept cache.

        Layout of the joining rows: each kept cache right-aligned on a shared column L, then its new
        tokens right-aligned after L (masked padding in between), position ids counting real tokens."""
        if not keys:
            return
        lengths = [c[0][0].shape[1] for c in caches]
        counts = [len(t) for t in new_tokens]
        if min(counts) < 1:
            raise ValueError("resume needs at least one new token per row (its last sampled token)")
        L, N = max(lengths), max(counts)
        pad = torch.nn.functional.pad
        fresh = DynamicCache(config=self.model.config)
        fresh.layers = [
            SlotLayer(
                torch.stack([pad(c[layer][0], (0, 0, L - c[layer][0].shape[1], 0)) for c in caches]),
                torch.stack([pad(c[layer][1], (0, 0, L - c[layer][1].shape[1], 0)) for c in caches]),
                L + N,
            )
            for layer in range(len(caches[0]))
        ]
        ids, new_mask = left_pad(new_tokens, self.pad_id)
        ids, new_mask = ids.to(self.device), new_mask.to(self.device)
        old_mask = torch.zeros(len(keys), L, dtype=torch.long, device=self.device)
        for i, n in enumerate(lengths):
            old_mask[i, L - n :] = 1
        mask = torch.cat([old_mask, new_mask], dim=-1)
        offsets = torch.tensor(lengths, device=self.device)[:, None]
        positions = (offsets + new_mask.cumsum(-1) - 1).clamp(min=0)
        out = self._forward(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=fresh,
            use_cache=True,
            logits_to_keep=1,
        )
        rows = torch.arange(len(keys), device=self.device)
        self._join(fresh, rows, mask, out.logits[:, -1])
        self._add_rows(keys, budgets, stop_strings, generators)

    def _add_rows(
        self,
        keys: list[Any],
        budgets: list[int],
        stop_strings: list[tuple[str, ...]],
        generators: list[torch.Generator | None] | None,
    ) -> None:
        generators = generators if generators is not None else [None] * len(keys)
        rows = zip(keys, budgets, stop_strings, generators, strict=True)
        self.rows += [Row(k, b, tuple(s), generator=g) for k, b, s, g in rows]

    def _join(
        self, fresh: DynamicCache, rows: torch.Tensor, new_mask: torch.Tensor, new_logits: torch.Tensor
    ) -> None:
        length = max(self.mask.shape[1], new_mask.shape[1])
        layers = []
        for i, layer in enumerate(fresh.layers):
            old = self.cache.layers[i] if self.cache is not None else None
            layers.append(_merge(old, layer.keys[rows], layer.values[rows], self.room))
        cache = DynamicCache(config=self.model.config)
        cache.layers = layers
        self.cache = cache
        pad = torch.nn.functional.pad
        self.mask = torch.cat(
            [pad(self.mask, (length - self.mask.shape[1], 0)), pad(new_mask, (length - new_mask.shape[1], 0))]
        )
        self.positions = torch.cat([self.positions, new_mask.sum(-1)])
        self.logits = new_logits if not len(self.rows) else torch.cat([self.logits, new_logits])

    @torch.no_grad()
    def step(self) -> list[Row]:
        """Sample one token for every row; returns the rows that finished (they leave the batch)."""
        if not self.rows:
            return []
        tokens, logprobs = choose_tokens(
            self.logits,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            generator=self.generator,
            uniforms=self._row_uniforms(),
        )
        finished = []
        for row, token, logprob in zip(self.rows, tokens.tolist(), logprobs.tolist(), strict=True):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if token in self.eos_ids:
                row.finished_by = "eos"
            elif row.stop_strings and _hits_stop_string(row.tokens, row.stop_strings, self.tokenizer):
                row.finished_by = "stop"
            elif len(row.tokens) >= row.budget:
                row.finished_by = "length"
            if row.finished_by:
                finished.append(row)
        keep = [i for i, row in enumerate(self.rows) if not row.finished_by]
        if self.keep_cache:
            for i, row in enumerate(self.rows):
                if row.finished_by:
                    real = self.mask[i].bool()
                    row.cache = [
                        (layer.keys[i][:, real], layer.values[i][:, real]) for layer in self.cache.layers
                    ]
        if len(keep) < len(self.rows):
            index = torch.tensor(keep, dtype=torch.long, device=self.device)
            for layer in self.cache.layers:
                layer.keep_rows(index)
            tokens, self.mask, self.positions = tokens[index], self.mask[index], self.positions[index]
            self.rows = [self.rows[i] for i in keep]
        if not self.rows:
            self.cache, self.mask = None, self.mask[:0, :0]
            self.positions, self.logits = self.positions[:0], self.logits[:0]
            return finished
        if self.cache.layers[0].length >= self.cache.layers[0].capacity:
            self._grow()
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=-1)
        out = self._forward(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=self.positions[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        self.logits = out.logits[:, -1]
        self.positions = self.positions + 1
        return finished

    def _row_uniforms(self) -> torch.Tensor | None:
        """[B] one uniform number per row from its own stream (a row without one: the decoder's
        `generator`), when any row has one and sampling is random; else None."""
        if self.temperature == 0 or all(row.generator is None for row in self.rows):
            return None
        return torch.cat([torch.rand(1, generator=row.generator or self.generator) for row in self.rows])

    def _grow(self) -> None:
        """More free cache columns for the running rows (a copy into larger buffers)."""
        layers = [
            SlotLayer(layer.keys, layer.values, layer.length + self.room) for layer in self.cache.layers
        ]
        self.cache.layers = layers
