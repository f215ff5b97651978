"""Per-token log-probabilities computed only where they are needed.

The decoder runs once; the vocabulary projection runs only on the hidden states of positions
whose next token is a target, a chunk of `chunk_size` positions at a time, so full-vocabulary
fp32 logits never exist for the whole batch at once outside of training.

For a plain `nn.Linear` head (every HF causal LM we train) the projection and the log-softmax are
one autograd function (`posttrain.models.fused_head`) that keeps no logits for backward: it
recomputes each chunk's there, so the head's memory is one chunk's whatever the number of tokens
(`LinearLogprobs`, which keeps every chunk's softmax, serves batches of one chunk). Other heads
(LoRA-wrapped, hooked) take the generic path through the module and autograd, which keeps them.

Some models transform lm_head's output before returning logits (Granite divides by
`logits_scaling`, Cohere multiplies by `logit_scale`, Gemma 2/3 soft-cap with
`final_logit_softcapping`): the sampler sees the transformed logits, so the lean path applies the
same transform (`LogitsTransform`, read from the config). Once per model a probe checks that the
lean path reproduces the model's own logits; a model whose output it does not reproduce (a transform
posttrain does not know) is scored through its own forward instead (`lean_logits_transform`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.modeling.fsdp import all_ranks_max, collective_group
from posttrain.modeling.packing import packed_hidden_states, packed_logits_at
from posttrain.models.fused_head import LinearLogprobs, RecomputedLinearLogprobs, at_least_fp32, head_forward


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] for logits [N, V] and targets [N], computed in fp32 (or fp64)."""
    logits = at_least_fp32(logits)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _plain_linear(lm_head: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) of a hook-free, plain nn.Linear on plain tensors; else None."""
    if type(lm_head) is not torch.nn.Linear:
        return None
    if lm_head._forward_hooks or lm_head._forward_pre_hooks:
        return None
    weight, bias = lm_head.weight, lm_head.bias
    plain = (torch.Tensor, torch.nn.Parameter)  # not e.g. a DTensor under FSDP
    if type(weight) not in plain or (bias is not None and type(bias) not in plain):
        return None
    return weight, bias


@dataclass(frozen=True)
class LogitsTransform:
    """What a causal LM does to its lm_head's output z before returning logits: softcap(z * multiplier),
    softcap(x) = c * tanh(x / c) (none when `softcap` is None)."""

    multiplier: float = 1.0
    softcap: float | None = None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.multiplier != 1.0:
            logits = logits * self.multiplier
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @classmethod
    def of_config(cls, config: Any) -> LogitsTransform:
        """The transform a transformers config declares: Granite's `logits_scaling` (logits / s), Cohere's
        `logit_scale` (logits * s), Gemma 2/3's `final_logit_softcapping` (c * tanh(logits / c))."""
        if hasattr(config, "get_text_config"):
            config = config.get_text_config()
        multiplier = 1.0
        scaling = getattr(config, "logits_scaling", None)
        if isinstance(scaling, int | float) and scaling not in (0, 1):
            multiplier /= scaling
        scale = getattr(config, "logit_scale", None)
        if isinstance(scale, int | float) and not isinstance(scale, bool):
            multiplier *= scale
        cap = getattr(config, "final_logit_softcapping", None)
        return cls(multiplier, float(cap) if isinstance(cap, int | float) and cap > 0 else None)


IDENTITY = LogitsTransform()
_LEAN_TRANSFORM = "_posttrain_lean_logits_transform"  # cached on the model by `lean_logits_transform`


def lean_logits_transform(model: torch.nn.Module) -> LogitsTransform | None:
    """The transform that the lean path (decoder, then lm_head, then this) must apply to reproduce
    `model(...).logits`; None when it cannot (the model transforms its logits in a way its config does
    not declare): score through the model's own forward then. Decided once per model by a probe."""
    cached = model.__dict__.get(_LEAN_TRANSFORM, ...)
    if cached is not ...:
        return cached
    transform = LogitsTransform.of_config(model.config)
    result = transform if _lean_path_matches(model, transform) else None
    model.__dict__[_LEAN_TRANSFORM] = result
    return result


@torch.no_grad()
def _lean_path_matches(model: torch.nn.Module, transform: LogitsTransform) -> bool:
    """Whether transform(lm_head(decoder(x))) equals the model's own logits on a short probe sequence, up
    to rounding (the two compute the same operations, except that the lean path folds the multiplier
    into the hidden states)."""
    device = next(model.parameters()).device
    vocab = int(getattr(model.config.get_text_config(), "vocab_size", 0) or 2)
    ids = (torch.arange(8, device=device) % vocab).unsqueeze(0)
    mask = torch.ones_like(ids)
    was_training = model.training
    model.eval()
    try:
        with torch.autocast(device.type, enabled=False):
            own = model(input_ids=ids, attention_mask=mask).logits
            hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
            lean = transform.apply(model.get_output_embeddings()(hidden))
    finally:
        model.train(was_training)
    if own.shape != lean.shape:
        return False
    rounding = 1e-4 if own.dtype in (torch.float32, torch.float64) else 4 * torch.finfo(own.dtype).eps
    error = float((lean.double() - own.double()).abs().max())
    return math.isfinite(error) and error <= rounding * (1.0 + float(own.double().abs().max()))


def chunked_logprobs(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lm_head: torch.nn.Module,
    chunk_size: int,
    *,
    transform: LogitsTransform = IDENTITY,
    temperature: float = 1.0,
    recompute: bool | None = None,
) -> torch.Tensor:
    """[N, H] hidden states and [N] targets -> [N] log-probabilities of softmax(transform(lm_head(h)) / T),
    `chunk_size` rows at a time.

    A plain linear head takes the fused path (`posttrain.models.fused_head`): with gradients on, each
    chunk's logits are recomputed in backward (`recompute=True`), or all chunks' softmax is kept
    (`recompute=False`, `LinearLogprobs`, no bias or soft-cap); the default (None) keeps it only when
    the rows fit in one chunk, where keeping costs what recomputing does (one [chunk, V] buffer) and
    saves a matmul. Other heads take the generic path through the module and autograd."""
    fused = _fused_head(hidden, lm_head, transform, temperature)
    if fused is None:
        return _generic_head(hidden, targets, lm_head, chunk_size, transform, temperature, False)[0]
    hidden, weight, bias, softcap, temperature = fused
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        return head_forward(hidden, weight, bias, targets, chunk_size, softcap, temperature, False)[0]
    if recompute is None:
        recompute = hidden.shape[0] > chunk_size
    if not recompute and bias is None and softcap is None and temperature == 1.0:
        return LinearLogprobs.apply(hidden, weight, targets, chunk_size)
    args = (hidden, weight, bias, targets, chunk_size, softcap, temperature, False)
    return RecomputedLinearLogprobs.apply(*args)[0]


def chunked_logprobs_and_entropy(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lm_head: torch.nn.Module,
    chunk_size: int,
    *,
    transform: LogitsTransform = IDENTITY,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunked_logprobs` and the entropy -Σ_v p_v log p_v of each row's full distribution, [N] each,
    both differentiable; a plain linear head recomputes each chunk's logits in backward."""
    fused = _fused_head(hidden, lm_head, transform, temperature)
    if fused is None:
        return _generic_head(hidden, targets, lm_head, chunk_size, transform, temperature, True)
    hidden, weight, bias, softcap, temperature = fused
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        lp, _, ent = head_forward(hidden, weight, bias, targets, chunk_size, softcap, temperature, True)
        return lp, ent
    return RecomputedLinearLogprobs.apply(
        hidden, weight, bias, targets, chunk_size, softcap, temperature, True
    )


def _fused_head(
    hidden: torch.Tensor, lm_head: torch.nn.Module, transform: LogitsTransform, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, float | None, float] | None:
    """(hidden, weight, bias, softcap, temperature) for the fused path, None for the generic one.

    Without a bias the multiplier folds into the hidden states (lm_head(h) * m == lm_head(h * m)), and
    so does the temperature when nothing non-linear (a soft-cap) comes between; what is returned is the
    temperature left to apply after the soft-cap (1.0 when folded). A biased head with a multiplier,
    and an empty batch, take the generic path."""
    linear = _plain_linear(lm_head)
    if linear is None or hidden.shape[0] == 0:
        return None
    weight, bias = linear
    if bias is not None and transform.multiplier != 1.0:
        return None
    if bias is None:
        if transform.multiplier != 1.0:
            hidden = hidden * transform.multiplier
        if transform.softcap is None and temperature != 1.0:
            hidden, temperature = hidden / temperature, 1.0
    return hidden, weight, bias, transform.softcap, temperature


def _generic_head(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lm_head: torch.nn.Module,
    chunk_size: int,
    transform: LogitsTransform,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(lp, entropy or None) through the module and autograd, `chunk_size` rows at a time (autograd
    keeps every chunk's logits for backward)."""

    def chunk(start: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = transform.apply(lm_head(hidden[start : start + chunk_size]))
        if temperature != 1.0:
            logits = logits / temperature
        lp = gather_logprobs(logits, targets[start : start + chunk_size])
        if not with_entropy:
            return lp, None
        logp = torch.log_softmax(at_least_fp32(logits), dim=-1)
        return lp, -(logp.exp() * logp).sum(dim=-1)

    if hidden.shape[0] <= chunk_size:
        return chunk(0)
    lps, ents = zip(*(chunk(i) for i in range(0, hidden.shape[0], chunk_size)), strict=True)
    return torch.cat(lps), torch.cat(ents) if with_entropy else None


def is_fsdp_module(model: torch.nn.Module) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _root_forward_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    selected: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    packed: bool,
) -> torch.Tensor:
    """Log-probabilities [K] of `targets` from a call of the whole model (FSDP2: the root module's
    forward is what gathers the embedding, final norm and lm_head, and its backward what
    reduce-scatters their gradients, so the decoder and head cannot be called apart)."""
    predictors = torch.nn.functional.pad(selected, (0, 1))  # [B, T]: position t predicts t + 1
    if packed:
        logits = packed_logits_at(model, input_ids, attention_mask, predictors)
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[predictors]
    return gather_logprobs(logits / temperature if temperature != 1.0 else logits, targets)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    target_mask: torch.Tensor,
    *,
    chunk_size: int = 2048,
    temperature: float = 1.0,
    packed: bool = False,
) -> torch.Tensor:
    """[B, T] tensor whose [b, t] is log p(input_ids[b, t] | input_ids[b, <t]) where target_mask is set, else 0.

    p is softmax(logits / temperature): RL trains the distribution it samples from.

    `model` is a Hugging Face causal LM; its decoder (`base_model`) and `lm_head` are called
    separately so that the projection skips positions that are not targets, and the model's output
    transform is applied after lm_head (`lean_logits_transform`; a model sharded with FSDP2, or whose
    transform is unknown, is called whole). `packed`: the decoder runs on the real tokens only
    (`posttrain.modeling.packing`), not on the padding.
    """
    selected = target_mask[:, 1:].bool()
    targets = input_ids[:, 1:][selected]
    transform = None if is_fsdp_module(model) else lean_logits_transform(model)
    if transform is None:  # FSDP2, or an output transform the lean path cannot reproduce
        lp = _root_forward_logprobs(model, input_ids, attention_mask, selected, targets, temperature, packed)
    else:
        if packed:
            hidden = packed_hidden_states(model, input_ids, attention_mask)
        else:
            hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        hidden = hidden[:, :-1][selected]
        lp = chunked_logprobs(
            hidden,
            targets,
            model.get_output_embeddings(),
            chunk_size,
            transform=transform,
            temperature=temperature,
        )
    rows, cols = selected.nonzero(as_tuple=True)
    out = torch.zeros(input_ids.shape, dtype=lp.dtype, device=lp.device)
    return out.index_put((rows, cols + 1), lp)


@torch.no_grad()
def batched_logprobs(
    model: torch.nn.Module,
    batch: Any,
    target_mask: str,
    *,
    batch_size: int,
    chunk_size: int,
    temperature: float = 1.0,
    packed: bool = False,
) -> torch.Tensor:
    """[B, T] log-probabilities (CPU, fp32) of the tokens where `batch.<target_mask>` is set.

    Under FSDP2 every forward is a collective: all ranks run as many forwards as the rank with the most
    microbatches, the others (an empty batch too) on a dummy row."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    starts = range(0, len(batch), batch_size)
    group = collective_group(model)
    if group is not None:
        for _ in range(all_ranks_max(len(starts), group, device) - len(starts)):
            dummy = torch.zeros((1, 2), dtype=torch.long, device=device)
            token_logprobs(model, dummy, torch.ones_like(dummy), torch.zeros_like(dummy), packed=packed)
    for start in starts:
        micro = batch.select(start, min(start + batch_size, len(batch)))
        lp = token_logprobs(
            model,
            micro.input_ids.to(device),
            micro.attention_mask.to(device),
            getattr(micro, target_mask).to(device),
            chunk_size=chunk_size,
            temperature=temperature,
            packed=packed,
        )
        out[start : start + len(micro), : lp.shape[1]] = lp.float().cpu()
    model.train(was_training)
    return out
