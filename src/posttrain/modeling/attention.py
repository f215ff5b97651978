"""Attention functions posttrain registers with transformers, and a way to select one for a while.

transformers dispatches every decoder's attention through `AttentionInterface` by the name in
`config._attn_implementation`, and builds masks through `AttentionMaskInterface` by the same name.
posttrain adds two:

- `PACKED_ATTENTION` (`posttrain.modeling.packing.packed_attention`): sequences packed end to end in
  one row attend only to themselves; no mask is built. `packing` passes its function to
  `attention_implementation`, so this module imports nothing of `packing` (no import circle).
- `GQA_SDPA_ATTENTION`: `torch.nn.functional.scaled_dot_product_attention` with grouped-query heads
  handled by the kernel (`enable_gqa`), also when there is a padding mask. transformers' own "sdpa"
  copies K and V to every query head whenever a mask is given (`repeat_kv`); when decoding a
  left-padded batch that is a copy of the whole KV cache in every layer at every token. Same
  mask as "sdpa", same result.

transformers' "sdpa" attention silently drops Gemma 2's `attn_logit_softcapping` (its scores are
soft-capped only by "eager"), so `use_eager_for_softcapping` switches such a model to "eager" when
posttrain loads it; the packed path applies the soft-cap itself (`posttrain.modeling.packing`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

PACKED_ATTENTION = "posttrain_packed"
GQA_SDPA_ATTENTION = "posttrain_sdpa_gqa"

log = logging.getLogger(__name__)


def gqa_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query [B, Hq, q, D], key/value [B, Hkv, k, D], HF's sdpa mask -> output [B, q, Hq, D]."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
        is_causal=bool(causal and attention_mask is None and query.shape[2] > 1),
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def use_eager_for_softcapping(model: torch.nn.Module) -> None:
    """Switch `model` to transformers' "eager" attention if its config soft-caps attention logits
    (`attn_logit_softcapping`, Gemma 2) and it runs "sdpa", which would ignore the soft-cap."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "attn_logit_softcapping", None) is None or config._attn_implementation != "sdpa":
        return
    log.info("%s soft-caps attention logits, which sdpa ignores: using eager attention", type(model).__name__)
    model.set_attn_implementation("eager")


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None


def register(name: str | None = None, function: Callable[..., Any] | None = None) -> None:
    """Make posttrain's GQA SDPA attention known to transformers, and `function` (an attention function
    that builds no mask, e.g. `packing.packed_attention`) under `name` if given (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if name is not None and function is not None:
        AttentionInterface.register(name, function)
        AttentionMaskInterface.register(name, _no_mask)
    AttentionInterface.register(GQA_SDPA_ATTENTION, gqa_sdpa_attention)
    AttentionMaskInterface.register(GQA_SDPA_ATTENTION, sdpa_mask)


@contextmanager
def attention_implementation(
    model: torch.nn.Module, name: str, function: Callable[..., Any] | None = None
) -> Iterator[None]:
    """Run every attention layer of `model` with the attention function `name` while the block runs;
    `function` registers it first (a posttrain function that transformers does not know yet)."""
    register(name, function)
    with _implementation_as(model.config, name):
        yield


def _recompute_contexts(
    config: Any,
) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """`torch.utils.checkpoint`'s `context_fn`: called when a checkpointed layer runs forward, it
    returns (the forward's context, the recomputation's). The recomputation, in backward, runs with
    the attention implementation the forward ran with: a packed forward selects packed attention only
    while it runs (`attention_implementation`), and recomputing a packed layer with the model's own
    "sdpa" would attend across the packed sequences (torch refuses: a different number of tensors
    saved)."""
    return contextlib.nullcontext(), _implementation_as(config, config._attn_implementation)


@contextmanager
def _implementation_as(config: Any, name: str) -> Iterator[None]:
    """The block runs with `config._attn_implementation = name`; the previous one is restored."""
    previous = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = previous


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant `torch.utils.checkpoint`),
    with the attention implementation of the forward being recomputed (`_recompute_contexts`)."""
    import functools

    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={
            "use_reentrant": False,
            "context_fn": functools.partial(_recompute_contexts, model.config),
        }
    )
