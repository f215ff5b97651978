"""The clipped policy-gradient loss of PPO / GRPO with its variants' knobs, as pure torch functions.

One function, ``clipped_pg_loss``, covers GRPO, DAPO (clip-higher), dual-clip PPO, GSPO
(sequence-level ratio), Dr. GRPO (constant-length aggregation), a KL penalty to a reference
policy, and truncated importance sampling against the inference engine's logprobs.

Normalisation convention (see ``losses.py``): the loss is a *sum* over this microbatch divided
by ``normalizer``, a count over the GLOBAL batch (all microbatches, all data-parallel ranks), so
summing the microbatch losses gives the global mean and the gradient does not depend on how the
batch was split. The metrics returned are likewise this microbatch's share of the global means.

Shapes: B sequences, T token positions. ``mask[b, t] = 1`` marks a token that counts (a sampled
assistant token); masked positions may hold anything (they are zeroed before any ``exp``).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Literal

import torch

RatioLevel = Literal["token", "sequence"]
Aggregation = Literal["token", "sequence", "seq_mean_token_sum"]
KLEstimator = Literal["k1", "k2", "k3"]
ImportanceCorrection = Literal["plain", "truncated"]

AGGREGATIONS = ("token", "sequence", "seq_mean_token_sum")


def _check_choice(kind: str, value: object, choices) -> None:
    if value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown {kind} {value!r}; choose one of {list(choices)}.{hint}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1.

        masked_mean = sum(values * mask) / max(sum(mask), 1)

    Over all elements (dim=None, scalar) or along ``dim``. An all-masked slice gives 0, not NaN.
    Masked positions are zeroed with ``torch.where``, so NaN/inf there does not leak.
    """
    m = mask.to(torch.bool)
    zeroed = torch.where(m, values, torch.zeros_like(values))
    count = m.to(values.dtype)
    if dim is None:
        return zeroed.sum() / count.sum().clamp(min=1)
    return zeroed.sum(dim) / count.sum(dim).clamp(min=1)


def _k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return logprobs - ref_logprobs


def _k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


def _k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    log_r = ref_logprobs - logprobs
    return torch.exp(log_r) - log_r - 1


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "k2": _k2,
    "k3": _k3,
}


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(π || π_ref) from tokens sampled from π (Schulman 2020,
    "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html).

    With log r = log π_ref(x) - log π(x) for the sampled token x:
        k1 = -log r = log π - log π_ref          unbiased, high variance, can be negative
        k2 = 0.5 * (log r)^2                     biased, low variance, >= 0
        k3 = exp(log r) - log r - 1              unbiased, low variance, >= 0 (GRPO's choice)

    Shapes: logprobs [B, T], ref_logprobs [B, T] -> [B, T] (elementwise; mask it yourself).
    """
    _check_choice("kl estimator", estimator, KL_ESTIMATORS)
    return KL_ESTIMATORS[estimator](logprobs, ref_logprobs)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, *, aggregation: Aggregation, normalizer: float
) -> torch.Tensor:
    """Reduce a per-token quantity [B, T] to this microbatch's share of a global mean (scalar).

        "token":              sum_{b,t} m_bt x_bt / N       N = valid tokens in the GLOBAL batch
                              (DAPO's token-level loss)
        "sequence":           sum_b [sum_t m_bt x_bt / max(sum_t m_bt, 1)] / N
                              N = sequences in the GLOBAL batch (GRPO's per-sequence token mean)
        "seq_mean_token_sum": sum_{b,t} m_bt x_bt / N       N = (sequences in the GLOBAL batch) * L
                              with L a constant (the generation length budget, max_len), so every
                              sequence's token sum is divided by the same number (Dr. GRPO,
                              arXiv:2503.20783). The sum is the same as "token"; only the caller's
                              normalizer differs.

    Masked positions are zeroed with ``torch.where`` (NaN/inf there does not leak).
    """
    _check_choice("aggregation", aggregation, AGGREGATIONS)
    if normalizer <= 0:
        raise ValueError(f"normalizer must be > 0 (a global token or sequence count), got {normalizer}")
    m = mask.to(torch.bool)
    zeroed = torch.where(m, per_token, torch.zeros_like(per_token))
    if aggregation == "sequence":
        lengths = m.to(per_token.dtype).sum(-1).clamp(min=1)
        return (zeroed.sum(-1) / lengths).sum() / normalizer
    return zeroed.sum() / normalizer


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """GSPO's length-normalised sequence log importance ratio (Zheng et al. 2025, arXiv:2507.18071).

        log s_b = (1/|y_b|) sum_t m_bt (log π_bt - log π_old_bt)

    Shapes: [B, T] x3 -> [B]. Sequences with no valid token get log s = 0.
    """
    return masked_mean(logprobs - old_logprobs, mask, dim=-1)


def clipped_pg_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    normalizer: float,
    generation_logprobs: torch.Tensor | None = None,
    reference_logprobs: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    ratio_level: RatioLevel = "token",
    aggregation: Aggregation = "token",
    kl_beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    importance_correction: ImportanceCorrection | None = None,
    importance_cap: float = 2.0,
    token_normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate policy-gradient loss (PPO, Schulman et al. 2017, arXiv:1707.06347; GRPO,
    arXiv:2402.03300) with the knobs of its variants.

    Per valid token (b, t), with A = advantages[b] (or advantages[b, t] if given per token):

        ratio   r_bt = exp(log π_bt - log π_old_bt)                              ratio_level="token"
                r_bt = sg(s_b) * π_bt / sg(π_bt),  s_b = exp(sequence_log_ratio)  ratio_level="sequence"
                       (GSPO, arXiv:2507.18071: the value is s_b, the gradient is that of s_b
                        w.r.t. each token, so with aggregation="sequence" the gradient is
                        s_b * A_b * (1/|y_b|) sum_t ∇log π_bt, GSPO's eq.)
        l_bt    = max(-A r_bt, -A clip(r_bt, 1 - clip_low, 1 + clip_high))
                  (clip_high > clip_low is DAPO's clip-higher, arXiv:2503.14476, e.g. 0.28 / 0.2)
        dual    if dual_clip = c and A < 0:  l_bt = min(l_bt, -c A)
                  (dual-clip PPO, Ye et al. 2020, arXiv:1912.09729; c > 1)
        TIS     l_bt *= w_bt,  w_bt = sg(exp(log π_old_bt - log π_gen_bt)), truncated at
                  importance_cap if importance_correction == "truncated" (Yao et al. 2025,
                  "Your efficient RL framework secretly brings you off-policy RL training").
                  Corrects the gap between the inference engine's sampler and the trainer's
                  π_old. Applied to the policy-gradient term only, not the KL term.
        KL      l_bt += kl_beta * kl_estimate(log π_bt, log π_ref_bt, kl_estimator)

        loss    = aggregate(l, mask, aggregation, normalizer)      (see ``aggregate``)

    On-policy shortcut: when the batch gets exactly one update pass, π_old = π and one passes
    ``old_logprobs=logprobs.detach()``; then r = 1 in value and ∇r = ∇log π.

    Args:
        logprobs: [B, T] log π of the sampled tokens under the current policy (with grad).
        old_logprobs: [B, T] log π_old (no grad is taken through it).
        advantages: [B] per-sequence (broadcast over tokens) or [B, T] per-token advantages.
        mask: [B, T] 1 where the token counts.
        normalizer: global count for ``aggregation`` (tokens; sequences; sequences * max_len).
        generation_logprobs: [B, T] log π_gen from the inference engine (needed for
            importance_correction).
        reference_logprobs: [B, T] log π_ref (needed if kl_beta > 0; if given with kl_beta = 0
            the KL is still reported as a metric).
        token_normalizer: optional global valid-token count; when given, ``clip_fraction`` and
            ``ratio_mean`` are token means (sum / token_normalizer) whatever the aggregation;
            otherwise they use the loss's aggregation and normalizer (then for
            "seq_mean_token_sum" they are diluted by the padding up to max_len).

    Returns:
        loss: scalar tensor.
        metrics: floats, this microbatch's share of the global means (sum them over microbatches):
            pg_loss (the loss without the KL term), kl (if kl_beta > 0 or reference given; the
            unscaled KL), clip_fraction (fraction of valid tokens where the clipped branch is
            strictly the larger: the gradient is cut), ratio_mean, and dual_clip_fraction (if
            dual_clip), importance_weight_mean (if importance_correction).
    """
    _check_choice("ratio_level", ratio_level, ("token", "sequence"))
    _check_choice("aggregation", aggregation, AGGREGATIONS)
    _check_choice("importance_correction", importance_correction, (None, "plain", "truncated"))
    _check_choice("kl estimator", kl_estimator, KL_ESTIMATORS)
    if normalizer <= 0:
        raise ValueError(f"normalizer must be > 0 (a global token or sequence count), got {normalizer}")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low} and {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (e.g. 3.0) or None to disable it, got {dual_clip}")
    if kl_beta < 0:
        raise ValueError(f"kl_beta must be >= 0, got {kl_beta}")
    if kl_beta > 0 and reference_logprobs is None:
        raise ValueError("kl_beta > 0 needs reference_logprobs; pass them or set kl_beta=0")
    if importance_correction is not None and generation_logprobs is None:
        raise ValueError(
            f"importance_correction={importance_correction!r} needs generation_logprobs "
            "(the inference engine's logprobs); pass them or set importance_correction=None"
        )
    if importance_correction == "truncated" and importance_cap <= 0:
        raise ValueError(f"importance_cap must be > 0, got {importance_cap}")
    if logprobs.shape != mask.shape or old_logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must all be [B, T]"
        )

    valid = mask.to(torch.bool)
    zero = torch.zeros_like(logprobs)
    logprobs_z = torch.where(valid, logprobs, zero)
    old_z = torch.where(valid, old_logprobs.detach().to(logprobs.dtype), zero)
    adv = advantages.detach().to(logprobs.dtype)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv

    if ratio_level == "token":
        ratio = torch.exp(logprobs_z - old_z)
    else:
        seq_ratio = torch.exp(sequence_log_ratio(logprobs_z, old_z, valid)).unsqueeze(-1)
        ratio = seq_ratio.detach() * torch.exp(logprobs_z - logprobs_z.detach())

    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    clip_active = (clipped > unclipped).to(logprobs.dtype)
    if dual_clip is not None:
        cap = -adv * dual_clip
        dual_active = ((adv < 0) & (per_token > cap)).to(logprobs.dtype)
        per_token = torch.where(adv < 0, torch.minimum(per_token, cap), per_token)

    if importance_correction is not None:
        gen_z = torch.where(valid, generation_logprobs.detach().to(logprobs.dtype), zero)
        weight = torch.exp(old_z - gen_z)
        if importance_correction == "truncated":
            weight = weight.clamp(max=importance_cap)
        per_token = per_token * weight

    def agg(x: torch.Tensor) -> torch.Tensor:
        return aggregate(x, valid, aggregation=aggregation, normalizer=normalizer)

    def agg_metric(x: torch.Tensor) -> float:
        if token_normalizer is not None:
            return aggregate(x, valid, aggregation="token", normalizer=token_normalizer).item()
        return agg(x).item()

    pg_loss = agg(per_token)
    loss = pg_loss
    metrics: dict[str, float] = {"pg_loss": pg_loss.item()}
    if reference_logprobs is not None:
        ref_z = torch.where(valid, reference_logprobs.detach().to(logprobs.dtype), zero)
        kl = agg(kl_estimate(logprobs_z, ref_z, kl_estimator))
        if kl_beta > 0:
            loss = loss + kl_beta * kl
        metrics["kl"] = kl.item()
    metrics["clip_fraction"] = agg_metric(clip_active)
    metrics["ratio_mean"] = agg_metric(ratio.detach())
    if dual_clip is not None:
        metrics["dual_clip_fraction"] = agg_metric(dual_active)
    if importance_correction is not None:
        metrics["importance_weight_mean"] = agg_metric(weight)
    return loss, metrics


POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, dict[str, float]]]] = {
    "clipped_pg": clipped_pg_loss,
}
