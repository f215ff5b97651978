"""KL(π || π_ref) from sampled tokens: Schulman's k1 / k2 / k3 estimators (``kl_estimate``, the
value) and the loss term with the right gradient (``kl_penalty``), as pure torch functions.

Shapes: B sequences, T token positions, elementwise [B, T]; mask the result yourself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from posttrain.algorithms.losses import check_choice

KLEstimator = Literal["k1", "k2", "k3"]
KLGradient = Literal["exact", "plain"]


def _k1(log_r: torch.Tensor) -> torch.Tensor:
    return -log_r


def _k2(log_r: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_r**2


def _k3(log_r: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_r) - log_r - 1


# each maps log r = log π_ref(x) - log π(x) of a token x sampled from π to a per-token estimate
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "k2": _k2,
    "k3": _k3,
}

KL_GRADIENTS = ("exact", "plain")


def kl_estimate(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: KLEstimator = "k3",
    *,
    input_clamp: float | None = None,
    output_clamp: float | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(π || π_ref) from tokens sampled from π (Schulman 2020,
    "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html).

    With log r = log π_ref(x) - log π(x) for the sampled token x:
        k1 = -log r = log π - log π_ref          unbiased, high variance, can be negative
        k2 = 0.5 * (log r)^2                     biased, low variance, >= 0
        k3 = exp(log r) - log r - 1              unbiased, low variance, >= 0 (GRPO's choice)

    Clamps (NeMo RL's, there 20 and 10; None: off): log r is clamped to [-input_clamp,
    input_clamp] before the estimator (exp(log r) cannot overflow), the estimate to
    [-output_clamp, output_clamp] after it. A clamped token has no gradient through the estimate.

    This is the VALUE of the estimate; its gradient is not ∇KL(π || π_ref) for k1 and k3, see
    ``kl_penalty`` for the loss term. Shapes: [B, T] x2 -> [B, T] (elementwise; mask it yourself).
    """
    kl, _ = _clamped_estimate(logprobs, ref_logprobs, estimator, input_clamp, output_clamp)
    return kl


def _clamped_estimate(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: str,
    input_clamp: float | None,
    output_clamp: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(``kl_estimate``, inside): inside[b, t] is True where neither clamp cut the token, i.e.
    |log r| <= input_clamp and |k| <= output_clamp (torch's clamp passes the gradient at the bound
    itself, so a token exactly at a bound counts as inside). Shapes: [B, T] x2 -> [B, T] x2."""
    check_choice("kl estimator", estimator, KL_ESTIMATORS)
    log_r = ref_logprobs - logprobs
    inside = torch.ones_like(log_r, dtype=torch.bool)
    if input_clamp is not None:
        inside = inside & (log_r.detach().abs() <= input_clamp)
        log_r = log_r.clamp(min=-input_clamp, max=input_clamp)
    kl = KL_ESTIMATORS[estimator](log_r)
    if output_clamp is not None:
        inside = inside & (kl.detach().abs() <= output_clamp)
        kl = kl.clamp(min=-output_clamp, max=output_clamp)
    return kl, inside


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: KLEstimator = "k3",
    *,
    gradient: KLGradient = "exact",
    input_clamp: float | None = 20.0,
    output_clamp: float | None = 10.0,
    sampling_logprobs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL loss term: the value of ``kl_estimate``, the gradient of KL(π || π_ref).

    The tokens x are sampled from π and held fixed, so a loss term k(x) has expected gradient
    E_π[∇k(x)], not ∇E_π[k(x)]: the score-function part E_π[k(x) ∇log π(x)] is missing. With
    d = log π(x) - log π_ref(x) (= -log r) and ∇KL(π || π_ref) = E_π[d ∇log π]:

        k1: ∇k1 = ∇log π,         E_π[∇log π] = 0             (no expected gradient at all)
        k2: ∇k2 = d ∇log π,       E_π = ∇KL(π || π_ref)       (already right)
        k3: ∇k3 = (1 - r) ∇log π, E_π = -Σ_x π_ref ∇log π = ∇KL(π_ref || π)   (the reverse KL)

    gradient="exact" multiplies k1 and k3 by the score-function factor exp(log π - sg(log π))
    (value 1, gradient ∇log π; as NeMo RL does), adding k ∇log π: both then have the per-token
    gradient d ∇log π, like k2, and every estimator's expected gradient is ∇KL(π || π_ref).
    gradient="plain" adds the estimate as is: DeepSeekMath's GRPO (arXiv:2402.03300, k3 as a
    plain loss term; its expected gradient is that of KL(π_ref || π)); with k1 it is a no-op in
    expectation. k2 is the same in both modes.

    Clamps as in ``kl_estimate`` (defaults: NeMo RL's 20 / 10). A token either clamp cut has the
    clamp's constant as its value and NO gradient, in both modes: the score-function factor is
    applied only to tokens inside the bounds (applied to a clamped token it would leave the
    gradient c ∇log π, c the clamp's constant: for k3 at log r > 2.6, where π_ref ≫ π, that pushes
    log π down, away from π_ref). Shapes: [B, T] x2 -> [B, T].

    On-policy KL approximation (``sampling_logprobs`` = log π_gen of the engine that drew the
    tokens; NeMo RL's ``use_on_policy_kl_approximation``): the tokens come from π_gen, not π, so
    every term is importance-weighted by w = exp(log π - log π_gen), held fixed (no gradient):

        value = clamp(w k, ±output_clamp)       (the clamp after the weight, as NeMo RL does)
        E_{π_gen}[w ∇(k · s)] = E_π[∇(k · s)] = ∇KL(π || π_ref)    (s: the score factor above)

    For k1 and k3 with gradient="exact" the gradient equals NeMo RL's ∇(w k) with w not held fixed
    (w ∇k + k w ∇log π is exactly w ∇(k s)); for k2 NeMo RL's adds the biased k2 w ∇log π, which
    is left out here. A NaN/inf weight is 0 (NeMo RL's nan_to_num).
    """
    check_choice("kl gradient", gradient, KL_GRADIENTS)
    if sampling_logprobs is not None:
        return _on_policy_kl_penalty(
            logprobs, ref_logprobs, sampling_logprobs, estimator, gradient, input_clamp, output_clamp
        )
    kl, inside = _clamped_estimate(logprobs, ref_logprobs, estimator, input_clamp, output_clamp)
    if gradient == "exact" and estimator in ("k1", "k3"):
        score = torch.exp(logprobs - logprobs.detach())
        kl = kl * torch.where(inside, score, torch.ones_like(score))
    return kl


def _on_policy_kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    estimator: str,
    gradient: str,
    input_clamp: float | None,
    output_clamp: float | None,
) -> torch.Tensor:
    """``kl_penalty`` for tokens drawn from π_gen: w k with w = sg(exp(log π - log π_gen)) (NaN/inf
    weights: 0), the output clamp applied to w k (NeMo RL's order), the score factor as in
    ``kl_penalty``; a token either clamp cut has no gradient. Shapes: [B, T] x3 -> [B, T]."""
    kl, inside = _clamped_estimate(logprobs, ref_logprobs, estimator, input_clamp, None)
    log_w = logprobs.detach() - sampling_logprobs.detach().to(logprobs.dtype)
    weight = torch.nan_to_num(torch.exp(log_w), nan=0.0, posinf=0.0, neginf=0.0)
    kl = weight * kl
    if output_clamp is not None:
        inside = inside & (kl.detach().abs() <= output_clamp)
    if gradient == "exact" and estimator in ("k1", "k3"):
        score = torch.exp(logprobs - logprobs.detach())
        kl = kl * torch.where(inside, score, torch.ones_like(score))
    if output_clamp is not None:
        kl = kl.clamp(min=-output_clamp, max=output_clamp)
    return kl
