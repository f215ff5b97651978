"""Offline generation for evaluation: a model folder and prompt token ids in, completions out.

`generate_texts` is the one place that picks a backend for `posttrain eval`: `hf` loads the
model with transformers and samples with `hf_generate`, `vllm` starts a vLLM engine; both are
the code GRPO rollouts use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from posttrain.config.schema import VLLMConfig
from posttrain.models.generation import GenerationOutput, SamplingParams, hf_generate


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


def _sample(
    model_dir: str,
    tokenizer: Any,
    prompt_ids: list[list[int]],
    params: SamplingParams,
    *,
    backend: str,
    batch_size: int,
    dtype: str,
    device: torch.device,
    vllm: VLLMConfig,
) -> GenerationOutput:
    if backend == "hf":
        from posttrain.models.policy import DTYPES, load_causal_lm

        model = load_causal_lm(model_dir, DTYPES[dtype]).to(device)
        return hf_generate(model, tokenizer, prompt_ids, params, batch_size=batch_size)
    if backend == "vllm":
        from posttrain.models.vllm_engine import VLLMGenerator

        engine = VLLMGenerator(
            vllm,
            model_path=model_dir,
            tokenizer_path=model_dir,
            dtype=dtype if vllm.dtype == "auto" else vllm.dtype,
            max_model_len=max(map(len, prompt_ids)) + params.max_new_tokens,
            seed=params.seed or 0,
            device=device,
        )
        return engine.generate(prompt_ids, params)
    raise ValueError(f"unknown generation.backend {backend!r}; use hf or vllm")


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
    vllm: VLLMConfig | None = None,
) -> list[Completion]:
    """One completion per prompt (repeat a prompt n times for n samples), in prompt order, with
    posttrain's HF sampler or a vLLM engine.

    `params.seed` seeds the sampler once for the whole call, so a run is reproducible.
    """
    out = _sample(
        model_dir,
        tokenizer,
        prompt_ids,
        params,
        backend=backend,
        batch_size=batch_size,
        dtype=dtype,
        device=pick_eval_device(device),
        vllm=vllm or VLLMConfig(),
    )
    return [
        Completion(ids, tokenizer.decode(ids, skip_special_tokens=True), truncated)
        for ids, truncated in zip(out.token_ids, out.truncated, strict=True)
    ]
