"""Offline generation for evaluation: a model folder and prompt token ids in, completions out.

`LocalGenerator` is the one place that picks a backend for `posttrain eval`: `hf` loads the
model with transformers and samples with `hf_generate`, `vllm` starts a vLLM engine; both are
the code GRPO rollouts use, behind the same `generate(prompt_ids, params, batch_size)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from posttrain.config.rollout import VLLMConfig
from posttrain.generation.sampling import GenerationOutput, SamplingParams, hf_generate


def pick_eval_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but CUDA is not available; set device=cpu or device=auto")
    return torch.device(device)


class LocalGenerator:
    """A model loaded in this process for `generate(prompt_ids, params, batch_size)`, the interface
    rollouts use: transformers with posttrain's sampler (`hf`) or a vLLM engine (`vllm`). A
    `posttrain.generation.interface.SamplerHost` with one sampler: that model or engine."""

    def __init__(
        self,
        model_dir: str,
        tokenizer: Any,
        *,
        backend: str = "hf",
        dtype: str = "float32",
        device: str = "auto",
        vllm: VLLMConfig | None = None,
        max_model_len: int = 2048,
        seed: int = 0,
    ) -> None:
        self.tokenizer, self.backend = tokenizer, backend
        device_ = pick_eval_device(device)
        vllm = vllm or VLLMConfig()
        if backend == "hf":
            from posttrain.modeling.loading import DTYPES, load_causal_lm

            self.model = load_causal_lm(model_dir, DTYPES[dtype]).to(device_)
        elif backend == "vllm":
            from posttrain.generation.vllm_engine import VLLMGenerator

            self.engine = VLLMGenerator(
                vllm,
                model_path=model_dir,
                tokenizer_path=model_dir,
                dtype=dtype if vllm.dtype == "auto" else vllm.dtype,
                max_model_len=max_model_len,
                seed=seed,
                device=device_,
            )
        else:
            raise ValueError(f"unknown generation.backend {backend!r}; use hf or vllm")

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, batch_size: int
    ) -> GenerationOutput:
        if self.backend == "hf":
            return hf_generate(self.model, self.tokenizer, prompt_ids, params, batch_size=batch_size)
        return self.engine.generate(prompt_ids, params)

    def num_samplers(self) -> int:
        return 1

    def run_on_samplers(self, fn: Callable[..., Any], args: Sequence[tuple]) -> list[Any]:
        """`fn(model or engine, tokenizer, *args[0])`: the one sampler is in this process."""
        sampler = self.model if self.backend == "hf" else self.engine
        return [fn(sampler, self.tokenizer, *a) for a in args]
