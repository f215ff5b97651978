"""A lean sampling loop for Hugging Face causal LMs, written for RL rollouts.

GRPO asks for G samples of each prompt. This loop prefills every distinct prompt once, copies its
KV cache to the G rows that share it, then decodes one token per step for the whole batch,
dropping rows from the batch as they finish. Per decode step t and unfinished row:

    z_t      = model(y_<t, cache)[-1]                      (fp32 logits of the last position)
    logp_t   = log softmax(z_t / T)[y_t]                   (what RL trains; before top-k / top-p)
    y_t      ~ softmax(top_p(top_k(z_t / T)))               (sampling, T > 0)
    y_t      = argmax z_t,  logp_t = log softmax(z_t)[y_t]  (greedy, T = 0)

A row finishes at an EOS token or when the decoded text contains a stop string. Randomness comes
from a `torch.Generator` seeded with `SamplingParams.seed`, so a seeded call is reproducible and
leaves the global RNG alone.

Partial rollouts (`WeightUpdates`, asynchronous GRPO): between decode steps the loop asks whether
newer weights were published; if so they are loaded into the model, the KV cache of every row is
computed again with them (prompt and tokens so far), and decoding goes on. A token's logprob is
that of the weights that sampled it, and `WeightUpdates.versions` records their version per token.

A model sharded with FSDP2 runs every forward as a collective of all its ranks, so no rank may stop
while another still decodes: each step the ranks all-reduce whether any of them still has an
unfinished row, and a rank whose rows are all done (or that got no prompts) keeps calling the model
on one dummy row, whose tokens it throws away, until every rank is done.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from posttrain.logging.progress import report
from posttrain.modeling.attention import GQA_SDPA_ATTENTION, attention_implementation
from posttrain.modeling.fsdp import all_ranks_max, collective_group

# Drop finished rows from the batch once this fraction of the rows still in it has finished.
COMPACT_FRACTION = 0.25


def filter_top_k_top_p(scaled_logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """Logits with everything outside the top-k and outside the smallest top-p nucleus set to -inf.

    The nucleus keeps the most likely tokens whose cumulative probability, counted before each
    token, is below top_p (so the most likely token is always kept)."""
    logits = scaled_logits
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def choose_tokens(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_k: int | None,
    top_p: float,
    generator: torch.Generator | None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(next tokens [B], their logprobs [B] under softmax(logits / T)); greedy when temperature is 0.

    Sampling inverts the CDF with one uniform number per row (searchsorted over the cumulative
    probabilities), which costs far less than exponential noise over the whole vocabulary. The
    numbers are drawn from `generator`, or given: `uniforms` [B] in [0, 1) (rows with random streams
    of their own, `ContinuousDecoder`)."""
    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(-1)
        return tokens, logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    scaled = logits / temperature if temperature != 1.0 else logits
    logprobs = scaled.log_softmax(-1)
    filtered = filter_top_k_top_p(scaled, top_k, top_p)
    probs = logprobs.exp() if filtered is scaled else filtered.softmax(-1)
    cdf = probs.cumsum(-1)
    if uniforms is None:
        u = torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device) * cdf[:, -1:]
    else:
        u = uniforms.to(cdf.device, cdf.dtype)[:, None] * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


class PreallocatedLayer(DynamicLayer):
    """A full-attention KV cache layer that writes each step into a buffer allocated once for the
    whole generation, where `DynamicLayer` concatenates (copying the whole cache every token)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            batch, heads, _, dim = key_states.shape
            self.key_buffer = key_states.new_empty(batch, heads, self.capacity, dim)
            self.value_buffer = value_states.new_empty(batch, heads, self.capacity, value_states.shape[-1])
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache full: {end} positions > capacity {self.capacity}")
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.key_buffer = self.key_buffer.index_select(0, indices)
        self.value_buffer = self.value_buffer.index_select(0, indices)
        self.keys, self.values = self.key_buffer[:, :, : self.length], self.value_buffer[:, :, : self.length]

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        self.batch_select_indices(beam_idx)


def preallocated_cache(config: Any, capacity: int) -> DynamicCache:
    """A DynamicCache whose full-attention layers are `PreallocatedLayer`s (other layer kinds, such as
    sliding-window layers, keep transformers' own implementation)."""
    cache = DynamicCache(config=config)
    cache.layers = [
        PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache


@dataclass
class WeightUpdates:
    """In-flight weight updates of one `sample` call (partial rollouts).

    `poll()` loads newer weights into the model when there are any and returns their version (None:
    unchanged); `sample` calls it between decode steps, never inside a forward. `version`: the version
    of the weights the model holds (updated by `sample`); `versions`: filled by `sample`, per output
    row the version of the weights that sampled each token."""

    poll: Callable[[], int | None]
    version: int
    versions: list[list[int]] = field(default_factory=list)


def prefill(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, capacity: int) -> tuple[Any, Any]:
    """Run left-padded `ids` through the model into a new KV cache of `capacity` positions;
    (model output with the last position's logits, cache)."""
    cache = preallocated_cache(model.config, capacity)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out, cache


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, length - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, length - len(p) :] = 1
    return ids, mask


def _hits_stop_string(tokens: list[int], stop_strings: tuple[str, ...], tokenizer: Any) -> bool:
    window = max(len(s) for s in stop_strings) + 1  # every token decodes to at least one character
    text = tokenizer.decode(tokens[-window:])
    return any(s in text for s in stop_strings)


def _with_gqa_attention(sample_fn: Callable) -> Callable:
    """Run `sample_fn(model, ...)` with `GQA_SDPA_ATTENTION` when the model uses transformers' "sdpa"
    (the same attention without a copy of the KV cache per layer and token for grouped-query heads)."""

    @functools.wraps(sample_fn)
    def wrapper(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if getattr(model.config, "_attn_implementation", None) != "sdpa":
            return sample_fn(model, *args, **kwargs)
        with attention_implementation(model, GQA_SDPA_ATTENTION):
            return sample_fn(model, *args, **kwargs)

    return wrapper


@torch.no_grad()
@_with_gqa_attention
def sample(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    eos_ids: set[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int | None = None,
    stop_strings: tuple[str, ...] = (),
    tokenizer: Any = None,
    seed: int | None = None,
    updates: WeightUpdates | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Sampled token ids and their logprobs per prompt, each ending at EOS or a stop string, or at
    max_new_tokens (the caller tells the two apart). With `updates`, newer weights are loaded
    between decode steps and `updates.versions` tells which version sampled each token.

    Under FSDP2 (`collective_group`) every rank must call this the same number of times, with
    `max_new_tokens` the same everywhere; `prompt_ids` may be empty."""
    if stop_strings and tokenizer is None:
        raise ValueError("stop strings need the tokenizer to decode the generated text")
    group = collective_group(model)
    if updates is not None and group is not None:
        raise ValueError("partial rollouts (weights updated mid-generation) need an unsharded model")
    n = len(prompt_ids)
    if n == 0 and group is None:
        return [], []
    device = next(model.parameters()).device
    generator = None
    if seed is not None and temperature > 0:
        generator = torch.Generator(device=device).manual_seed(seed)

    # prefill each distinct prompt once, then give every row its prompt's cache
    rows_in = prompt_ids if n else [[pad_id]]  # no prompts: one dummy row joins the collectives
    distinct: dict[tuple[int, ...], int] = {}
    source = [distinct.setdefault(tuple(p), len(distinct)) for p in rows_in]
    ids, mask = left_pad([list(p) for p in distinct], pad_id)
    ids, mask = ids.to(device), mask.to(device)
    capacity = ids.shape[1] + max_new_tokens
    out, cache = prefill(model, ids, mask, capacity)
    rows = torch.tensor(source, device=device)
    cache.reorder_cache(rows)
    logits = out.logits[:, -1][rows]
    mask = mask[rows]
    positions = mask.sum(-1)
    seq_ids = ids[rows] if updates is not None else None  # every row's tokens in the cache (a re-prefill)

    tokens: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list[float]] = [[] for _ in range(n)]
    if updates is not None:
        updates.versions = [[] for _ in range(n)]
    active = list(range(len(rows_in)))  # batch row -> output row
    finished = [False] * len(active)  # by batch row
    reported = 0  # rows ended by EOS or a stop string so far
    idle = n == 0  # every row of this rank is done; under FSDP2 it may still have to join forwards
    for step in range(max_new_tokens):
        next_tokens, next_logprobs = choose_tokens(
            logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
        )
        if not idle:
            pairs = zip(next_tokens.tolist(), next_logprobs.tolist(), strict=True)
            was_done = sum(finished)
            for b, (token, logprob) in enumerate(pairs):
                if finished[b]:
                    continue
                row = active[b]
                tokens[row].append(token)
                logprobs[row].append(logprob)
                if updates is not None:
                    updates.versions[row].append(updates.version)
                finished[b] = token in eos_ids or bool(
                    stop_strings and _hits_stop_string(tokens[row], stop_strings, tokenizer)
                )
            reported += sum(finished) - was_done
            report("reply", sum(finished) - was_done)  # the console's bar advances as replies end
            idle = all(finished)
        if step == max_new_tokens - 1:
            break
        if group is None:
            if idle:
                break
        elif all_ranks_max(0 if idle else 1, group, device) == 0:  # every rank is done
            break
        if idle:  # keep one row to run the forwards the other ranks need; its tokens are thrown away
            keep = [0]
        elif sum(finished) >= COMPACT_FRACTION * len(finished):
            keep = [b for b, done in enumerate(finished) if not done]
        else:
            keep = None
        if keep is not None and len(keep) < len(active):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            next_tokens, mask, positions = next_tokens[index], mask[index], positions[index]
            active = [active[b] for b in keep]
            finished = [finished[b] for b in keep]
            if seq_ids is not None:
                seq_ids = seq_ids[index]
        if updates is not None:
            cache = _take_new_weights(model, updates, seq_ids, mask, capacity, cache)
            seq_ids = torch.cat([seq_ids, next_tokens[:, None]], dim=-1)
        mask = torch.cat([mask, mask.new_ones(len(active), 1)], dim=-1)
        out = model(
            input_ids=next_tokens[:, None],
            attention_mask=mask,
            position_ids=positions[:, None],
            past_key_values=cache,
            use_cache=True,
        )
        logits = out.logits[:, -1]
        positions = positions + 1
    report("reply", n - reported)  # the rows cut at max_new_tokens
    return tokens, logprobs


def _take_new_weights(
    model: torch.nn.Module,
    updates: WeightUpdates,
    seq_ids: torch.Tensor,
    mask: torch.Tensor,
    capacity: int,
    cache: DynamicCache,
) -> DynamicCache:
    """Between two decode steps: if `updates.poll()` loaded newer weights, the KV cache of the tokens so
    far (`seq_ids`, left-padded by `mask`) computed again with them; else `cache` as it is."""
    version = updates.poll()
    if version is None:
        return cache
    updates.version = version
    return prefill(model, seq_ids, mask, capacity)[1]
