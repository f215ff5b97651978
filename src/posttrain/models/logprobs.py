"""Per-token log-probabilities computed only where they are needed.

The decoder runs once; the vocabulary projection runs only on the hidden states of positions
whose next token is a target, a chunk of `chunk_size` positions at a time, so full-vocabulary
fp32 logits never exist for the whole batch at once outside of training.

For a plain bias-free `nn.Linear` head (every HF causal LM we train) the projection and the
log-softmax are one autograd function, `LinearLogprobs`, whose backward costs the two matmuls
it must and little else (see its docstring). Other heads (LoRA-wrapped, biased, hooked) take the
generic path through the module and autograd.

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

from posttrain.models.fsdp import all_ranks_max, collective_group
from posttrain.models.packing import packed_hidden_states, packed_logits_at


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """x in fp32 when it is a narrower float (bf16, fp16); fp32 and fp64 stay as they are (no copy)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] for logits [N, V] and targets [N], computed in fp32 (or fp64)."""
    logits = at_least_fp32(logits)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _linear_logprobs_chunk(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, keep_probs: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(hidden @ weight.T)[target] in fp32 ([n]) and, if `keep_probs`, the softmax [n, V].

    One [n, V] buffer: the logits, turned in place into exp(logits - max) and then probabilities.
    lp = logit[target] - (max + log sum exp(logits - max)), the same sum as torch.logsumexp.
    """
    logits = at_least_fp32(hidden @ weight.T)
    target_logits = logits.gather(1, targets.unsqueeze(1)).squeeze(1)
    row_max = logits.amax(dim=1, keepdim=True)
    exp = logits.sub_(row_max).exp_()
    row_sum = exp.sum(dim=1, keepdim=True)
    lp = target_logits - (row_max + row_sum.log()).squeeze(1)
    return lp, exp.div_(row_sum) if keep_probs else None


class LinearLogprobs(torch.autograd.Function):
    """lp[i] = log softmax(hidden @ weight.T)[i, targets[i]] with a lean backward.

    Shapes: hidden [N, H], weight [V, H] (a bias-free lm_head), targets [N] -> lp [N] in fp32.
    Forward keeps only the softmax P [N, V] (as autograd would keep the logits). With upstream
    gradient g [N], d lp_i / d logits_ij = 1[j = t_i] - P_ij, so

        d hidden = -g * (P @ W) + g * W[t]           (row-wise scaling, a row gather)
        d weight = P.T @ (-g * hidden) + scatter_add(t, g * hidden)

    i.e. two matmuls and no elementwise pass over the [N, V] matrix. P is not modified, so a
    second backward (retain_graph) is correct too. Chunks of `chunk_size` rows bound the size
    of one matmul and its temporary; all chunks' P are kept for backward.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size):  # type: ignore[override]
        # under autocast (bf16 compute over fp32 weights) the forward matmul runs in the autocast dtype;
        # backward, which autocast does not cover, runs its two matmuls in that dtype too
        device_type = hidden.device.type
        ctx.compute_dtype = (
            torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        )
        lps, probs = [], []
        for start in range(0, hidden.shape[0], chunk_size):
            stop = start + chunk_size
            lp, p = _linear_logprobs_chunk(hidden[start:stop], weight, targets[start:stop], keep_probs=True)
            lps.append(lp)
            probs.append(p)
        ctx.chunk_size = chunk_size
        ctx.save_for_backward(hidden, weight, targets, *probs)
        return torch.cat(lps) if len(lps) > 1 else lps[0]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_lp):  # type: ignore[override]
        hidden, weight, targets, *probs = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        g = grad_lp.to(hidden.dtype).unsqueeze(1)  # [N, 1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = None
        compute = ctx.compute_dtype
        if compute is not None and compute != weight.dtype:  # autocast: the matmuls in its dtype
            w_c = weight.to(compute)
            for i, p in enumerate(probs):
                rows = slice(i * ctx.chunk_size, (i + 1) * ctx.chunk_size)
                p = p.to(compute)
                g_c, t_c = g[rows], targets[rows]
                if need_hidden:
                    grad_hidden[rows] = (p @ w_c).to(hidden.dtype)
                    grad_hidden[rows].mul_(-g_c).addcmul_(g_c, w_c[t_c].to(hidden.dtype))
                if need_weight:
                    h_g = hidden[rows] * g_c
                    part = (p.T @ h_g.neg().to(compute)).to(weight.dtype)
                    grad_weight = part if grad_weight is None else grad_weight.add_(part)
                    grad_weight.index_add_(0, t_c, h_g.to(weight.dtype))
            return grad_hidden, grad_weight, None, None
        for i, p in enumerate(probs):
            rows = slice(i * ctx.chunk_size, (i + 1) * ctx.chunk_size)
            p = p.to(weight.dtype)  # no copy when already fp32
            g_c, t_c = g[rows], targets[rows]
            if need_hidden:
                torch.mm(p, weight, out=grad_hidden[rows])
                grad_hidden[rows].mul_(-g_c).addcmul_(g_c, weight[t_c])
            if need_weight:
                h_g = hidden[rows] * g_c
                if grad_weight is None:
                    grad_weight = p.T @ h_g.neg()
                else:
                    grad_weight.addmm_(p.T, h_g, alpha=-1)
                grad_weight.index_add_(0, t_c, h_g)
        return grad_hidden, grad_weight, None, None


def _plain_linear_weight(lm_head: torch.nn.Module) -> torch.Tensor | None:
    """The weight of a bias-free, hook-free, plain nn.Linear on a plain tensor; else None."""
    if type(lm_head) is not torch.nn.Linear or lm_head.bias is not None:
        return None
    if lm_head._forward_hooks or lm_head._forward_pre_hooks:
        return None
    weight = lm_head.weight
    if type(weight) not in (torch.Tensor, torch.nn.Parameter):  # e.g. a DTensor under FSDP
        return None
    return weight


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
) -> torch.Tensor:
    """[N, H] hidden states and [N] targets -> [N] log-probabilities of softmax(transform(lm_head(h)) / T),
    `chunk_size` rows at a time.

    A linear transform and the temperature fold into the hidden states for a bias-free linear head
    (z * m / T == lm_head(h * m / T)); a soft-cap, or another head, takes the generic path."""
    weight = _plain_linear_weight(lm_head)
    if weight is not None and transform.softcap is None and hidden.shape[0] > 0:
        if transform.multiplier != 1.0:
            hidden = hidden * transform.multiplier
        if temperature != 1.0:
            hidden = hidden / temperature
        if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
            return LinearLogprobs.apply(hidden, weight, targets, chunk_size)
        parts = [
            _linear_logprobs_chunk(
                hidden[i : i + chunk_size], weight, targets[i : i + chunk_size], keep_probs=False
            )[0]
            for i in range(0, hidden.shape[0], chunk_size)
        ]
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def chunk_logprobs(start: int) -> torch.Tensor:
        logits = transform.apply(lm_head(hidden[start : start + chunk_size]))
        if temperature != 1.0:
            logits = logits / temperature
        return gather_logprobs(logits, targets[start : start + chunk_size])

    if hidden.shape[0] <= chunk_size:
        return chunk_logprobs(0)
    return torch.cat([chunk_logprobs(i) for i in range(0, hidden.shape[0], chunk_size)])


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
    (`posttrain.models.packing`), not on the padding.
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
