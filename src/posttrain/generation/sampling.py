"""Sampling from a causal LM: prompt token ids in; sampled ids, per-token logprobs and truncation flags out.

`GenerationOutput.logprobs[i][t]` is log softmax(logits / temperature)[token] (temperature 1
when greedy), before top-p and top-k truncation: the distribution that RL trains, which the
training forward pass computes with `policy.logprob_temperature` set to the same temperature,
so the two can be compared token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from posttrain.generation.sampler import WeightUpdates, sample
from posttrain.modeling.fsdp import all_ranks_max, collective_group


@dataclass(frozen=True)
class SamplingParams:
    """`seed`: the seed of one generate call (None: unseeded). Every random stream inside the call (an HF
    sampler batch, a vLLM request) gets its own seed from it, `sampling_seed(seed, seed_stream, index)`;
    `seed_stream` is the generation worker's index when a call is spread over workers (`generate_on`).
    `partial_rollouts`: a generation worker loads newer published weights between decode steps
    (asynchronous GRPO, `grpo.partial_rollouts`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_new_tokens: int = 64
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    seed_stream: int = 0
    partial_rollouts: bool = False


SEED_STREAM_BITS = 12
"""Generation workers one call is spread over: fewer than 2**12."""
SEED_INDEX_BITS = 20
"""Random streams per worker and call (HF sampler batches, vLLM requests): fewer than 2**20."""
_MASK32 = (1 << 32) - 1
_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection of [0, 2**64) that spreads every input bit over the output."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def sampling_seed(base: int, stream: int, index: int) -> int:
    """The seed of random stream `index` of worker `stream` in a generate call seeded with `base`, in
    [0, 2**63) (an int64 everywhere):

        high 31 bits = base mod 2**31
        low 32 bits  = ((stream << 20) | index) XOR h(base),   h = the high half of splitmix64(base)

    Distinct for distinct (base mod 2**31, stream, index) with stream < 2**12 and index < 2**20: the high
    bits give back the base, and for a given base the low half is an XOR with a constant, a bijection
    of (stream, index). So no two workers, batches or requests of one call share a seed, nor two calls
    whose seeds differ by less than 2**31. torch's CPU generator keeps only the low 32 bits of a seed
    (CUDA's Philox keeps all 64): those are distinct within a call on any device, and h(base) moves them
    from call to call."""
    if not 0 <= stream < 1 << SEED_STREAM_BITS:
        raise ValueError(f"generation worker index {stream} out of range [0, {1 << SEED_STREAM_BITS})")
    if not 0 <= index < 1 << SEED_INDEX_BITS:
        raise ValueError(
            f"{index + 1} seeded sampler streams in one generate call on one worker (at most "
            f"{1 << SEED_INDEX_BITS}); raise generation.batch_size or add generation workers"
        )
    base %= 1 << 31
    low = ((stream << SEED_INDEX_BITS) | index) ^ (_mix64(base) >> 32)
    return (base << 32) | (low & _MASK32)


def turn_seed(seed: int, turn: int) -> int:
    """The seed turn `turn` (from 0) of a rollout seeded with `seed` samples with: every turn has one of
    its own, the first turn's is the rollout's."""
    return seed + turn * 1_000_003


@dataclass
class GenerationOutput:
    """Per sequence: generated token ids (ending with EOS or a stop string unless truncated), their
    logprobs, and whether generation hit max_new_tokens before finishing; with partial rollouts,
    `versions`: the policy version of the weights that sampled each token (else empty)."""

    token_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    versions: list[list[int]] = field(default_factory=list)

    def extend(self, other: GenerationOutput) -> None:
        self.token_ids += other.token_ids
        self.logprobs += other.logprobs
        self.truncated += other.truncated
        self.versions += other.versions


def finished_length(
    tokens: list[int], eos_ids: set[int], stop_strings: tuple[str, ...], tokenizer: Any
) -> int | None:
    """Number of tokens up to and including the first EOS or the token that completes a stop string."""
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return i + 1
    if stop_strings:
        text = ""
        for i in range(len(tokens)):
            text = tokenizer.decode(tokens[: i + 1])
            if any(s in text for s in stop_strings):
                return i + 1
    return None


def hf_generate(
    model: torch.nn.Module,
    tokenizer: Any,
    prompt_ids: list[list[int]],
    params: SamplingParams,
    *,
    batch_size: int = 64,
    updates: WeightUpdates | None = None,
) -> GenerationOutput:
    """Sample with `posttrain.generation.sampler.sample` (shared prefill per distinct prompt), `batch_size`
    prompts at a time. Under FSDP2 every rank runs as many batches as the rank with the most (the
    others, a rank without prompts too, on empty batches: `sample` then joins the forwards only).
    `updates` (partial rollouts): newer weights are loaded before each batch and between decode
    steps, and `versions` records the version that sampled each token."""
    out = GenerationOutput()
    was_training = model.training
    model.eval()
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    starts = list(range(0, len(prompt_ids), batch_size))
    group = collective_group(model)
    if group is not None:
        device = next(model.parameters()).device
        starts += [len(prompt_ids)] * (all_ranks_max(len(starts), group, device) - len(starts))
    for index, start in enumerate(starts):
        if updates is not None:
            updates.version = _newest(updates)
        tokens, logprobs = sample(
            model,
            prompt_ids[start : start + batch_size],
            max_new_tokens=params.max_new_tokens,
            eos_ids=eos_ids,
            pad_id=pad_id,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            stop_strings=params.stop_strings,
            tokenizer=tokenizer,
            seed=None if params.seed is None else sampling_seed(params.seed, params.seed_stream, index),
            updates=updates,
        )
        for row, (row_tokens, row_logprobs) in enumerate(zip(tokens, logprobs, strict=True)):
            n = finished_length(row_tokens, eos_ids, params.stop_strings, tokenizer)
            out.truncated.append(n is None)
            n = n or len(row_tokens)
            out.token_ids.append(row_tokens[:n])
            out.logprobs.append(row_logprobs[:n])
            if updates is not None:
                out.versions.append(updates.versions[row][:n])
    model.train(was_training)
    return out


def _newest(updates: WeightUpdates) -> int:
    """The version the model holds after loading newer weights, if any were published."""
    version = updates.poll()
    return updates.version if version is None else version


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    if not ids:
        raise ValueError("the model and tokenizer define no eos_token_id; generation could never finish")
    return ids
