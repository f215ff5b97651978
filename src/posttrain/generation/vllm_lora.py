"""Serving the policy's LoRA adapter with vLLM's LoRA support (`generation.vllm.lora_adapter`).

The engine runs the base weights with `enable_lora` (one adapter slot, `max_lora_rank` the smallest
rank vLLM accepts that holds the policy's). A refit receives only the adapter tensors (A and B under
peft's file names, `posttrain.models.lora.adapter_weights`), writes them with their adapter config as
a peft adapter folder (vLLM 0.32 loads adapters from a folder only), registers them as a new adapter
(a new `lora_int_id` per refit, the previous one removed) and deletes the folder (vLLM has read it
into memory). Every generate call then passes the current `LoRARequest`.

The checksum refit check fingerprints the adapter vLLM registered (`served_fingerprint`): Σ and Σ of
squares over its A and s·B tensors, the same quantity the policy computes from its own adapters
(`posttrain.models.lora.adapter_fingerprint`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from posttrain.config.common import LoraConfig
from posttrain.errors import UserError

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM 0.32 accepts for `max_lora_rank`."""


def max_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that serves adapters of rank `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise UserError(f"vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; policy.lora.rank={rank}")


def target_modules(names: Iterable[str]) -> list[str]:
    """The module leaf names (q_proj, ...) of peft adapter tensor names (`...q_proj.lora_A.weight`)."""
    return sorted({name.rsplit(".", 3)[-3] for name in names})


class ServedAdapter:
    """The adapter a vLLM engine serves: refits replace it, generate calls pass `request`."""

    def __init__(self, lora: LoraConfig) -> None:
        self.lora = lora
        self.request: Any = None  # vllm.lora.request.LoRARequest of the adapter served now
        self.version = 0

    def engine_kwargs(self) -> dict[str, Any]:
        return dict(enable_lora=True, max_lora_rank=max_lora_rank(self.lora.rank), max_loras=1)

    def load(self, llm: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Serve `weights` (peft file name, tensor) as a new adapter in place of the current one."""
        from vllm.lora.request import LoRARequest

        from posttrain.modeling.peft import peft_lora_config

        tensors = {name: t.detach().cpu().contiguous() for name, t in weights}
        folder = Path(tempfile.mkdtemp(prefix="posttrain-lora-"))
        try:
            from safetensors.torch import save_file

            save_file(tensors, str(folder / "adapter_model.safetensors"))
            config = peft_lora_config(
                self.lora.model_copy(update={"target_modules": target_modules(tensors)})
            )
            config.save_pretrained(str(folder))
            if self.request is not None:
                llm.llm_engine.remove_lora(self.request.lora_int_id)
                self.request = None
            self.version += 1
            request = LoRARequest(f"posttrain-policy-{self.version}", self.version, str(folder))
            try:
                llm.llm_engine.add_lora(request)
            except ValueError as e:
                raise UserError(
                    f"vLLM cannot serve the policy's LoRA adapter ({e}). vLLM's LoRA covers only some "
                    "layers of each model (for Llama-like models the attention and MLP projections); "
                    "narrow policy.lora.target_modules to those or set generation.vllm.lora_adapter=false "
                    "(merged-weight refits)"
                ) from e
            self.request = request
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return len(tensors)

    def fingerprint(self, llm: Any) -> tuple[float, float]:
        """`served_fingerprint` of the adapter served now, (0, 0) before the first refit."""
        if self.request is None:
            return 0.0, 0.0
        return llm.collective_rpc(served_fingerprint, args=(self.request.lora_int_id,))[0]


def served_fingerprint(worker: Any, lora_id: int) -> tuple[float, float]:
    """Runs inside vLLM's worker: (Σ, Σ of squares) in float64 over the A and s·B tensors of the
    registered adapter `lora_id` (vLLM folds the scale s into B; packed layers hold lists of them)."""
    adapter = worker.model_runner.lora_manager._adapter_manager.get_adapter(lora_id)
    if adapter is None:
        return 0.0, 0.0
    total, squares = 0.0, 0.0
    for layer in adapter.loras.values():
        pairs = _as_list(layer.lora_a), _as_list(layer.lora_b), _as_list(layer.scaling)
        for a, b, scale in zip(*pairs, strict=True):
            if a is None:
                continue
            for t in (a, b if scale == 1 else b * scale):
                t = t.double()
                total += float(t.sum())
                squares += float((t * t).sum())
    return total, squares


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]
