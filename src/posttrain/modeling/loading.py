"""Loading a Hugging Face causal LM: compute dtypes, the device of a worker, `load_causal_lm`.

Used by the training policy (`posttrain.models.policy`), generation workers, offline generation, the
distillation teacher, export and the reward-model environment; it imports nothing of them.
"""

from __future__ import annotations

import contextlib

import torch

from posttrain.modeling.attention import use_eager_for_softcapping

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MASTER_DTYPE = torch.float32
"""The dtype of trained parameters, their gradients and the optimizer state, whatever `policy.dtype` is."""


class CheckpointMismatchError(RuntimeError):
    """A checkpoint that was saved for a different model than the configured policy (raised by
    `posttrain.models.policy` and `posttrain.models.lora` when saved weights do not fit the model)."""


def compute_autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Forward passes of fp32 parameters computed in `dtype`: `torch.autocast` for a dtype narrower
    than fp32 (matmuls in bf16, reductions and norms as autocast keeps them), else nothing."""
    if dtype in (torch.float32, torch.float64):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def set_torch_threads(num_threads: int | None) -> None:
    """Set this thread's torch CPU thread count (None or 0: unchanged) with torch's own setter
    (`torch._C.set_num_threads`): vLLM's CPU worker replaces `torch.set_num_threads` with a no-op for
    the whole process once it binds its OpenMP threads, and a worker may share a process with an engine."""
    if num_threads:
        torch._C.set_num_threads(num_threads)


def pick_device(gpus: int) -> torch.device:
    """The current CUDA device when `gpus > 0` (RuntimeError without CUDA), else the CPU."""
    if gpus > 0:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "cluster.gpus_per_node > 0 but CUDA is not available; set cluster.gpus_per_node=0"
            )
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def load_causal_lm(path: str, dtype: torch.dtype) -> torch.nn.Module:
    """`AutoModelForCausalLM.from_pretrained(path, dtype=dtype)` without a progress bar, switched to
    eager attention if it soft-caps attention logits (`use_eager_for_softcapping`)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    use_eager_for_softcapping(model)
    return model
