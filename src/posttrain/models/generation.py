"""Sampling from a causal LM: prompt token ids in; sampled ids, per-token logprobs and truncation flags out.

`GenerationOutput.logprobs[i][t]` is log softmax(logits / temperature)[token] (temperature 1
when greedy), before top-p and top-k truncation: the distribution that RL trains, which the
training forward pass computes with `policy.logprob_temperature` set to the same temperature,
so the two can be compared token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from posttrain.models.sampler import sample


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_new_tokens: int = 64
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class GenerationOutput:
    """Per sequence: generated token ids (ending with EOS or a stop string unless truncated), their
    logprobs, and whether generation hit max_new_tokens before finishing."""

    token_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)

    def extend(self, other: GenerationOutput) -> None:
        self.token_ids += other.token_ids
        self.logprobs += other.logprobs
        self.truncated += other.truncated


class Generator(Protocol):
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> GenerationOutput: ...


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
) -> GenerationOutput:
    """Sample with `posttrain.models.sampler.sample` (shared prefill per distinct prompt), `batch_size`
    prompts at a time."""
    out = GenerationOutput()
    was_training = model.training
    model.eval()
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    for index, start in enumerate(range(0, len(prompt_ids), batch_size)):
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
            seed=None if params.seed is None else params.seed + index,
        )
        for row_tokens, row_logprobs in zip(tokens, logprobs, strict=True):
            n = finished_length(row_tokens, eos_ids, params.stop_strings, tokenizer)
            out.truncated.append(n is None)
            n = n or len(row_tokens)
            out.token_ids.append(row_tokens[:n])
            out.logprobs.append(row_logprobs[:n])
    model.train(was_training)
    return out


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
