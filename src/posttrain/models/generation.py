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


def left_pad(
    prompt_ids: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), length), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, length - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, length - len(p) :] = 1
    return ids.to(device), mask.to(device)


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


@torch.no_grad()
def hf_generate(
    model: torch.nn.Module,
    tokenizer: Any,
    prompt_ids: list[list[int]],
    params: SamplingParams,
    *,
    batch_size: int = 64,
) -> GenerationOutput:
    """Sample with transformers' `generate`, `batch_size` prompts at a time."""
    out = GenerationOutput()
    was_training = model.training
    model.eval()
    if params.seed is not None:
        torch.manual_seed(params.seed)
    device = next(model.parameters()).device
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    for start in range(0, len(prompt_ids), batch_size):
        chunk = prompt_ids[start : start + batch_size]
        ids, mask = left_pad(chunk, pad_id, device)
        sample = params.temperature > 0
        result = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None,
            top_k=(params.top_k or 0) if sample else None,
            max_new_tokens=params.max_new_tokens,
            stop_strings=list(params.stop_strings) or None,
            tokenizer=tokenizer if params.stop_strings else None,
            eos_token_id=sorted(eos_ids),
            pad_token_id=pad_id,
            use_cache=True,
            return_dict_in_generate=True,
            output_logits=True,
        )
        generated = result.sequences[:, ids.shape[1] :]
        logits = torch.stack(result.logits, dim=1).float()  # [B, N, V] raw logits
        if sample and params.temperature != 1.0:
            logits = logits / params.temperature  # the distribution sampled from (before top-p / top-k)
        logprobs = (
            logits.gather(-1, generated[:, : logits.shape[1], None]).squeeze(-1) - logits.logsumexp(-1)
        ).cpu()
        for row in range(generated.shape[0]):
            tokens = generated[row].tolist()
            n = finished_length(tokens, eos_ids, params.stop_strings, tokenizer)
            out.truncated.append(n is None)
            n = n or len(tokens)
            out.token_ids.append(tokens[:n])
            out.logprobs.append(logprobs[row, :n].tolist())
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
