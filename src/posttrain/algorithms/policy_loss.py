"""The policy-gradient losses of PPO / GRPO and their variants' knobs, as pure torch functions.

``clipped_pg_loss`` covers GRPO, DAPO (clip-higher), dual-clip PPO, GSPO (sequence-level ratio),
Dr. GRPO (constant-length aggregation), a KL penalty to a reference policy (``kl_penalty``: value
of a Schulman estimator, expected gradient ∇KL(π || π_ref)), and importance sampling against the
inference engine's logprobs (``importance_weights``: plain, truncated, ICE-POP, sequence-masked).
``cispo_loss`` is MiniMax-M1's CISPO (clipped, stop-gradient IS weight times log π). Registry:
``POLICY_LOSSES[name]``, name in "clipped_pg", "cispo"; both take the same keyword knobs except
``dual_clip`` and ``ratio_level`` (clipped_pg only).

Normalisation convention (see ``losses.py``): the loss is a *sum* over this microbatch divided
by ``normalizer``, a count over the GLOBAL batch (all microbatches, all data-parallel ranks), so
summing the microbatch losses gives the global mean and the gradient does not depend on how the
batch was split. The metrics returned are likewise this microbatch's share of the global means.

Shapes: B sequences, T token positions. ``mask[b, t] = 1`` marks a token that counts (a sampled
assistant token); masked positions may hold anything (they are zeroed before any ``exp``).

The parts live by topic: the KL estimators and penalty in ``kl.py``, the GSPO sequence ratio and
the engine importance corrections in ``importance.py``, ``masked_mean`` / ``aggregate`` in
``losses.py``; the loss on an RL batch and its config mapping (``grpo_loss``, ``loss_knobs``) in
``rl_loss.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from posttrain.algorithms.importance import (
    IMPORTANCE_CORRECTIONS,
    ImportanceCorrection,
    importance_weights,
    ratio_extremes,
    sequence_log_ratio,
)
from posttrain.algorithms.kl import KL_ESTIMATORS, KL_GRADIENTS, KLEstimator, KLGradient, kl_penalty
from posttrain.algorithms.losses import AGGREGATIONS, Aggregation, aggregate, check_choice

RatioLevel = Literal["token", "sequence"]


def _check_common(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    normalizer: float,
    aggregation: str,
    generation_logprobs: torch.Tensor | None,
    reference_logprobs: torch.Tensor | None,
    clip_low: float,
    clip_high: float,
    kl_beta: float,
    kl_estimator: str,
    kl_gradient: str,
    importance_correction: str | None,
) -> None:
    check_choice("aggregation", aggregation, AGGREGATIONS)
    check_choice("importance_correction", importance_correction, IMPORTANCE_CORRECTIONS)
    check_choice("kl estimator", kl_estimator, KL_ESTIMATORS)
    check_choice("kl gradient", kl_gradient, KL_GRADIENTS)
    if normalizer <= 0:
        raise ValueError(f"normalizer must be > 0 (a global token or sequence count), got {normalizer}")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low} and {clip_high}")
    if kl_beta < 0:
        raise ValueError(f"kl_beta must be >= 0, got {kl_beta}")
    if kl_beta > 0 and reference_logprobs is None:
        raise ValueError("kl_beta > 0 needs reference_logprobs; pass them or set kl_beta=0")
    if importance_correction is not None and generation_logprobs is None:
        raise ValueError(
            f"importance_correction={importance_correction!r} needs generation_logprobs "
            "(the inference engine's logprobs); pass them or set importance_correction=None"
        )
    if logprobs.shape != mask.shape or old_logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must all be [B, T]"
        )


def _finish(
    per_token: torch.Tensor,
    logprobs_z: torch.Tensor,
    old_z: torch.Tensor,
    valid: torch.Tensor,
    *,
    normalizer: float,
    aggregation: str,
    token_normalizer: float | None,
    generation_logprobs: torch.Tensor | None,
    reference_logprobs: torch.Tensor | None,
    kl_beta: float,
    kl_estimator: str,
    kl_gradient: str,
    kl_input_clamp: float | None,
    kl_output_clamp: float | None,
    importance_correction: str | None,
    importance_cap: float,
    importance_min: float | None,
    on_policy_kl_approximation: bool = False,
) -> tuple[torch.Tensor, dict[str, float], Callable[[torch.Tensor], float]]:
    """Shared tail of the policy losses: importance weights on the policy-gradient term,
    aggregation, the KL term (weighted by π / π_gen with ``on_policy_kl_approximation``).
    Returns (loss, metrics, agg_metric)."""
    zero = torch.zeros_like(logprobs_z)

    def agg(x: torch.Tensor) -> torch.Tensor:
        return aggregate(x, valid, aggregation=aggregation, normalizer=normalizer)

    def agg_metric(x: torch.Tensor) -> float:
        if token_normalizer is not None:
            return aggregate(x, valid, aggregation="token", normalizer=token_normalizer).item()
        return agg(x).item()

    metrics: dict[str, float] = {}
    if importance_correction is not None:
        weight, out_of_bounds = importance_weights(
            old_z, generation_logprobs, valid, correction=importance_correction,
            cap=importance_cap, min_ratio=importance_min,
        )  # fmt: skip
        per_token = per_token * weight.to(per_token.dtype)
        metrics["importance_weight_mean"] = agg_metric(weight)
        if importance_correction != "plain":
            metrics["is_oob_ratio"] = agg_metric(out_of_bounds.to(per_token.dtype))
    pg_loss = agg(per_token)
    loss = pg_loss
    metrics["pg_loss"] = pg_loss.item()
    if reference_logprobs is not None:
        ref_z = torch.where(valid, reference_logprobs.detach().to(logprobs_z.dtype), zero)
        sampling = None
        if on_policy_kl_approximation:
            sampling = torch.where(valid, generation_logprobs.detach().to(logprobs_z.dtype), zero)
        per_token_kl = kl_penalty(
            logprobs_z, ref_z, kl_estimator, gradient=kl_gradient,
            input_clamp=kl_input_clamp, output_clamp=kl_output_clamp, sampling_logprobs=sampling,
        )  # fmt: skip
        kl = agg(per_token_kl)
        if kl_beta > 0:
            loss = loss + kl_beta * kl
        metrics["kl"] = kl.item()
    return loss, metrics, agg_metric


def _check_knob_combinations(
    generation_logprobs: torch.Tensor | None, on_policy_kl_approximation: bool
) -> None:
    if on_policy_kl_approximation and generation_logprobs is None:
        raise ValueError(
            "on_policy_kl_approximation weights the KL by π / π_gen: it needs generation_logprobs"
        )


def positive_example_nll(
    logprobs: torch.Tensor, mask: torch.Tensor, positive: torch.Tensor, *, normalizer: float
) -> torch.Tensor:
    """VAPO's positive-example NLL (Yue et al. 2025, arXiv:2504.05118, eq. 10; NeMo RL's
    ``positive_example_nll_weight`` term), this microbatch's share of the global mean:

        nll = sum_{b,t} m_bt p_b (-log π_bt) / N_pos

    p_b = 1 for a sample whose reward is > 0, else 0; N_pos = the valid tokens of positive samples in
    the GLOBAL batch (all microbatches, all data-parallel ranks), so the term does not depend on how
    the batch is split (NeMo RL divides by each microbatch's own count). N_pos = 0 (no positive
    sample anywhere) gives 0. Masked positions are zeroed with ``torch.where``.
    Shapes: logprobs [B, T], mask [B, T], positive [B] (bool) -> scalar.
    """
    if normalizer < 0:
        raise ValueError(f"positive-token normalizer must be >= 0, got {normalizer}")
    if positive.shape != logprobs.shape[:1]:
        raise ValueError(f"positive {tuple(positive.shape)} must be [B], B = {logprobs.shape[0]}")
    take = mask.to(torch.bool) & positive.to(torch.bool).unsqueeze(-1)
    total = torch.where(take, -logprobs, torch.zeros_like(logprobs)).sum()
    return total / normalizer if normalizer > 0 else total * 0.0


def _add_positive_nll(
    loss: torch.Tensor,
    metrics: dict[str, float],
    logprobs_z: torch.Tensor,
    valid: torch.Tensor,
    *,
    weight: float,
    positive: torch.Tensor | None,
    normalizer: float | None,
) -> torch.Tensor:
    """loss + weight * ``positive_example_nll`` (metric positive_nll) when weight > 0; loss as is at 0."""
    if weight < 0:
        raise ValueError(f"positive_example_nll_weight must be >= 0, got {weight}")
    if weight == 0:
        return loss
    if positive is None or normalizer is None:
        raise ValueError(
            "positive_example_nll_weight > 0 needs positive_samples ([B] bool: reward > 0) and "
            "positive_normalizer (the global count of their valid tokens)"
        )
    nll = positive_example_nll(logprobs_z, valid, positive, normalizer=normalizer)
    metrics["positive_nll"] = nll.item()
    return loss + weight * nll


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
    disable_ppo_ratio: bool = False,
    aggregation: Aggregation = "token",
    kl_beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    kl_gradient: KLGradient = "exact",
    kl_input_clamp: float | None = 20.0,
    kl_output_clamp: float | None = 10.0,
    importance_correction: ImportanceCorrection | None = None,
    importance_cap: float = 2.0,
    importance_min: float | None = None,
    on_policy_kl_approximation: bool = False,
    token_normalizer: float | None = None,
    positive_example_nll_weight: float = 0.0,
    positive_samples: torch.Tensor | None = None,
    positive_normalizer: float | None = None,
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
        plain   disable_ppo_ratio:  l_bt = -A log π_bt   (REINFORCE / RLOO's surrogate, NeMo RL's
                  disable_ppo_ratio; no ratio, no clip, no dual clip, token ratio_level only).
                  Its gradient is that of the ratio form with π_old = sg(π) (∇r = ∇log π there),
                  but its value is -A log π, not -A, and with several updates per batch it takes
                  no account of π_old (clip_fraction is then 0).
        IS      l_bt *= w_bt, the engine-mismatch weight sg(π_old / π_gen) of
                  ``importance_weights`` (importance_correction: plain, truncated, icepop,
                  seq_mask; bounds [importance_min, importance_cap]). Applied to the
                  policy-gradient term only, not the KL term.
        KL      l_bt += kl_beta * kl_penalty(log π_bt, log π_ref_bt, kl_estimator, kl_gradient)
                  (value: the estimate of KL(π || π_ref); gradient="exact": expected gradient
                  ∇KL(π || π_ref) for every estimator; see ``kl_penalty``). With
                  on_policy_kl_approximation the term is weighted by sg(π / π_gen), the tokens
                  having been drawn by the engine (NeMo RL's use_on_policy_kl_approximation)

        loss    = aggregate(l, mask, aggregation, normalizer)      (see ``aggregate``)
        VAPO    loss += positive_example_nll_weight * ``positive_example_nll`` over the samples
                  flagged in positive_samples ([B] bool, reward > 0), divided by
                  positive_normalizer, their valid tokens in the GLOBAL batch (NeMo RL's
                  positive_example_nll_weight; 0: off, and then the two are not needed)

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
        token_normalizer: optional global valid-token count; when given, ``clip_fraction``,
            ``ratio_mean`` and the importance metrics are token means (sum / token_normalizer)
            whatever the aggregation; otherwise they use the loss's aggregation and normalizer
            (then for "seq_mean_token_sum" they are diluted by the padding up to max_len).

    Returns:
        loss: scalar tensor.
        metrics: floats, this microbatch's share of the global means (sum them over microbatches):
            pg_loss (the loss without the KL term), kl (if kl_beta > 0 or reference given; the
            unscaled, clamped estimate), clip_fraction (fraction of valid tokens where the
            clipped branch is strictly the larger: the gradient is cut), ratio_mean, and
            dual_clip_fraction (if dual_clip), importance_weight_mean (if importance_correction),
            is_oob_ratio (bounded importance corrections: the share of valid tokens whose
            ratio, or sequence's ratio for seq_mask, lies outside the bounds), and
            probs_ratio_min / probs_ratio_max (``ratio_extremes``; not shares: min / max),
            positive_nll (if positive_example_nll_weight > 0: the unweighted VAPO term).
    """
    check_choice("ratio_level", ratio_level, ("token", "sequence"))
    _check_knob_combinations(generation_logprobs, on_policy_kl_approximation)
    if disable_ppo_ratio and (dual_clip is not None or ratio_level != "token"):
        raise ValueError("disable_ppo_ratio (-A log π) takes no dual_clip and only ratio_level='token'")
    _check_common(
        logprobs, old_logprobs, mask, normalizer=normalizer, aggregation=aggregation,
        generation_logprobs=generation_logprobs, reference_logprobs=reference_logprobs,
        clip_low=clip_low, clip_high=clip_high, kl_beta=kl_beta, kl_estimator=kl_estimator,
        kl_gradient=kl_gradient, importance_correction=importance_correction,
    )  # fmt: skip
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (e.g. 3.0) or None to disable it, got {dual_clip}")

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

    if disable_ppo_ratio:
        per_token = -adv * logprobs_z
        clip_active = torch.zeros_like(logprobs_z)
    else:
        unclipped = -adv * ratio
        clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
        per_token = torch.maximum(unclipped, clipped)
        clip_active = (clipped > unclipped).to(logprobs.dtype)
    if dual_clip is not None:
        cap = -adv * dual_clip
        dual_active = ((adv < 0) & (per_token > cap)).to(logprobs.dtype)
        per_token = torch.where(adv < 0, torch.minimum(per_token, cap), per_token)

    loss, metrics, agg_metric = _finish(
        per_token, logprobs_z, old_z, valid, normalizer=normalizer, aggregation=aggregation,
        token_normalizer=token_normalizer, generation_logprobs=generation_logprobs,
        reference_logprobs=reference_logprobs, kl_beta=kl_beta, kl_estimator=kl_estimator,
        kl_gradient=kl_gradient, kl_input_clamp=kl_input_clamp, kl_output_clamp=kl_output_clamp,
        importance_correction=importance_correction, importance_cap=importance_cap,
        importance_min=importance_min, on_policy_kl_approximation=on_policy_kl_approximation,
    )  # fmt: skip
    metrics["clip_fraction"] = agg_metric(clip_active)
    metrics["ratio_mean"] = agg_metric(ratio.detach())
    metrics.update(ratio_extremes(ratio, valid))
    if dual_clip is not None:
        metrics["dual_clip_fraction"] = agg_metric(dual_active)
    loss = _add_positive_nll(
        loss, metrics, logprobs_z, valid, weight=positive_example_nll_weight,
        positive=positive_samples, normalizer=positive_normalizer,
    )  # fmt: skip
    return loss, metrics


def cispo_loss(
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
    aggregation: Aggregation = "token",
    kl_beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    kl_gradient: KLGradient = "exact",
    kl_input_clamp: float | None = 20.0,
    kl_output_clamp: float | None = 10.0,
    importance_correction: ImportanceCorrection | None = None,
    importance_cap: float = 2.0,
    importance_min: float | None = None,
    on_policy_kl_approximation: bool = False,
    token_normalizer: float | None = None,
    positive_example_nll_weight: float = 0.0,
    positive_samples: torch.Tensor | None = None,
    positive_normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: clipped IS-weight policy optimisation (MiniMax-M1, arXiv:2506.13585).

    Instead of clipping the token update away (PPO), CISPO clips the importance-sampling weight
    and keeps every token's gradient, REINFORCE-style:

        r_bt    = exp(log π_bt - log π_old_bt)
        ŵ_bt    = sg(clip(r_bt, 1 - clip_low, 1 + clip_high))
        l_bt    = -A ŵ_bt exp(log π_bt - sg(log π_bt))

    The value of l is -A ŵ (on the scale of PPO's surrogate -A r); its gradient is
    -A ŵ ∇log π, the paper's objective sg(ŵ) A log π. MiniMax-M1 imposes no lower bound on the
    weight (clip_low >= 1 gives 1 - clip_low <= 0: none) and tunes only clip_high. Engine
    importance correction, the KL term and aggregation are as in ``clipped_pg_loss`` (the paper
    uses token-level aggregation). Shapes and normalisation as in ``clipped_pg_loss``.

    Metrics: pg_loss, kl (if reference given), clip_fraction (share of valid tokens whose
    weight was clipped; their gradient is bounded, not cut), ratio_mean, and the importance
    metrics of ``clipped_pg_loss``, probs_ratio_min / probs_ratio_max (``ratio_extremes``);
    ``on_policy_kl_approximation`` and the VAPO term (``positive_example_nll_weight``, metric
    positive_nll) as in ``clipped_pg_loss``.
    """
    _check_knob_combinations(generation_logprobs, on_policy_kl_approximation)
    _check_common(
        logprobs, old_logprobs, mask, normalizer=normalizer, aggregation=aggregation,
        generation_logprobs=generation_logprobs, reference_logprobs=reference_logprobs,
        clip_low=clip_low, clip_high=clip_high, kl_beta=kl_beta, kl_estimator=kl_estimator,
        kl_gradient=kl_gradient, importance_correction=importance_correction,
    )  # fmt: skip
    valid = mask.to(torch.bool)
    zero = torch.zeros_like(logprobs)
    logprobs_z = torch.where(valid, logprobs, zero)
    old_z = torch.where(valid, old_logprobs.detach().to(logprobs.dtype), zero)
    adv = advantages.detach().to(logprobs.dtype)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv

    ratio = torch.exp(logprobs_z - old_z).detach()
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = -adv * weight * torch.exp(logprobs_z - logprobs_z.detach())
    clipped = (weight != ratio).to(logprobs.dtype)

    loss, metrics, agg_metric = _finish(
        per_token, logprobs_z, old_z, valid, normalizer=normalizer, aggregation=aggregation,
        token_normalizer=token_normalizer, generation_logprobs=generation_logprobs,
        reference_logprobs=reference_logprobs, kl_beta=kl_beta, kl_estimator=kl_estimator,
        kl_gradient=kl_gradient, kl_input_clamp=kl_input_clamp, kl_output_clamp=kl_output_clamp,
        importance_correction=importance_correction, importance_cap=importance_cap,
        importance_min=importance_min, on_policy_kl_approximation=on_policy_kl_approximation,
    )  # fmt: skip
    metrics["clip_fraction"] = agg_metric(clipped)
    metrics["ratio_mean"] = agg_metric(ratio)
    metrics.update(ratio_extremes(ratio, valid))
    loss = _add_positive_nll(
        loss, metrics, logprobs_z, valid, weight=positive_example_nll_weight,
        positive=positive_samples, normalizer=positive_normalizer,
    )  # fmt: skip
    return loss, metrics


POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, dict[str, float]]]] = {
    "clipped_pg": clipped_pg_loss,
    "cispo": cispo_loss,
}
