"""The PPO critic: a causal LM's decoder with a scalar value head, trained by its own optimizer.

The value model is the backbone of a Hugging Face causal LM (``AutoModel``: the decoder without its
language-model head) with ``value_head``, a ``Linear(hidden, 1)`` initialised to zero (every value
starts at 0, so the first advantages are the plain returns), computed in fp32. ``values[b, t]`` is
V(s_t), the value of the state before token t: the head on the hidden state at position t − 1 (the
position that predicts token t, like the policy's log-probability of token t), 0 at t = 0.

A `Critic` is a `Policy` (a data-parallel rank with its optimizer, scheduler, checkpoints) whose
`loss_inputs` are these values. It runs in workers of its own (`critic.placement: split`) or inside
the policy's workers (`colocated`: `posttrain.distributed.critic_group.PPOActor` holds it on the
policy's device, like the reference).
Its checkpoint is a Policy checkpoint: an HF folder of the backbone and value head (fp32), the
optimizer, the scheduler; resuming is exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from posttrain.config.common import PolicyConfig
from posttrain.data.batching import TokenBatch
from posttrain.modeling.attention import use_eager_for_softcapping
from posttrain.modeling.loading import MASTER_DTYPE
from posttrain.modeling.packing import packed_hidden_states
from posttrain.models.policy import (
    Policy,
    check_weights_match,
    copy_into,
    read_safetensors,
)


def load_value_model(path: str, dtype: torch.dtype) -> torch.nn.Module:
    """The decoder of the causal LM at `path` (``AutoModel``) with a zero-initialised ``value_head``."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "lm_head.weight not used": the critic has no language-model head
    try:
        model = AutoModel.from_pretrained(path, dtype=dtype)
    finally:
        hf_logging.set_verbosity(verbosity)
    use_eager_for_softcapping(model)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    model.value_head = torch.nn.Linear(config.hidden_size, 1, dtype=dtype)
    torch.nn.init.zeros_(model.value_head.weight)
    torch.nn.init.zeros_(model.value_head.bias)
    return model


def load_trained_value_model(checkpoint: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A trained critic from a PPO checkpoint's `critic/` folder (or its `model/` inside): the decoder
    and its value head, as saved (fp32). Raises CheckpointMismatchError when the weights are missing
    or do not fit."""
    folder = Path(checkpoint)
    folder = folder / "model" if (folder / "model").is_dir() else folder
    saved = read_safetensors(folder, what="critic")
    model = load_value_model(str(folder), dtype)
    check_weights_match(model, saved, where=str(folder))
    copy_into(model, saved)
    return model.eval()


def token_values(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, packed: bool = True
) -> torch.Tensor:
    """[B, T] fp32 values V(s_t): the value head on the hidden state at t − 1; 0 at t = 0 and on padding.

    `packed`: the decoder runs on the real tokens only (`posttrain.modeling.packing`)."""
    if packed:
        hidden = packed_hidden_states(model, input_ids, attention_mask)
    else:
        hidden = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    head = model.value_head
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        v = torch.nn.functional.linear(hidden.float(), head.weight.float(), head.bias.float()).squeeze(-1)
    values = torch.zeros_like(v)
    values[:, 1:] = v[:, :-1]
    return values * attention_mask.to(values.dtype)


class Critic(Policy):
    """One data-parallel rank of the value model. `train(batch, loss_fn, normalizer)` hands the loss
    the values [B, T] (``token_values``); `values(batch)` scores a batch without gradients."""

    def __init__(self, cfg: PolicyConfig, **kwargs: Any) -> None:
        if cfg.fsdp:  # the decoder and the value head are called apart, which FSDP2's root does not allow
            raise ValueError("the PPO critic does not support FSDP2 yet; set critic.fsdp=false")
        super().__init__(cfg, **kwargs)

    def load_model(self, model_path: str) -> torch.nn.Module:
        return load_value_model(model_path, MASTER_DTYPE)

    def loss_inputs(self, micro: TokenBatch) -> torch.Tensor:
        return token_values(
            self.model, micro.input_ids, micro.attention_mask, packed=self.cfg.packed_sequences
        )

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> torch.Tensor:
        """[B, T] values on CPU, `logprob_batch_size` sequences per forward, in eval mode."""
        self.model.eval()
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        size = self.cfg.logprob_batch_size
        for start in range(0, len(batch), size):
            micro = self._to_device(batch.select(start, min(start + size, len(batch))))
            with self.autocast():
                v = self.loss_inputs(micro)
            out[start : start + len(micro), : v.shape[1]] = v.float().cpu()
        return out
