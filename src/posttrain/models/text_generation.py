"""Offline generation for evaluation: a model folder and prompt token ids in, completions out.

`generate_texts` is the one place that picks a backend for `posttrain eval`. `hf` loads the
model with transformers and samples with `hf_generate` (the code GRPO rollouts use); other
backends (vLLM) plug in here with the same signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from posttrain.models.generation import SamplingParams, hf_generate


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    text: str
    truncated: bool


def pick_eval_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but CUDA is not available; set device=cpu or device=auto")
    return torch.device(device)


def _hf_generate_texts(
    model_dir: str,
    tokenizer: Any,
    prompt_ids: list[list[int]],
    params: SamplingParams,
    *,
    batch_size: int,
    dtype: str,
    device: str,
) -> list[Completion]:
    from posttrain.models.policy import DTYPES, load_causal_lm

    model = load_causal_lm(model_dir, DTYPES[dtype]).to(pick_eval_device(device))
    out = hf_generate(model, tokenizer, prompt_ids, params, batch_size=batch_size)
    return [
        Completion(ids, tokenizer.decode(ids, skip_special_tokens=True), truncated)
        for ids, truncated in zip(out.token_ids, out.truncated, strict=True)
    ]


def generate_texts(
    model_dir: str,
    tokenizer: Any,
    prompt_ids: list[list[int]],
    params: SamplingParams,
    *,
    backend: str = "hf",
    batch_size: int = 64,
    dtype: str = "float32",
    device: str = "auto",
) -> list[Completion]:
    """One completion per prompt (repeat a prompt n times for n samples), in prompt order.

    `params.seed` seeds the sampler once for the whole call, so a run is reproducible.
    """
    if backend == "hf":
        return _hf_generate_texts(
            model_dir, tokenizer, prompt_ids, params, batch_size=batch_size, dtype=dtype, device=device
        )
    raise ValueError(
        f"generation.backend={backend!r} is not available to `posttrain eval` in this version; "
        "use generation.backend=hf"
    )
