"""Distillation divergences between a teacher's and a student's next-token distributions, computed
over the teacher's top-k tokens; and the sampled-token variant of on-policy distillation as an
advantage.

Shapes: N positions (the generated tokens of a batch, flattened), k teacher tokens per position.
Inputs of ``distillation_loss``:

    student_topk_logits   [N, k]  z_j, the student's logits (over its temperature) at the teacher's
                                  top-k token ids
    student_logsumexp     [N]     L = log Σ_v exp z_v over the FULL vocabulary
    teacher_topk_logprobs [N, k]  log p_j, the teacher's log-probabilities at its top-k ids,
                                  normalised over the full vocabulary, at the teacher's temperature τ
                                  (p = softmax(z_T / τ), applied by the teacher, where the whole
                                  vocabulary is at hand)
    mask [N]; normalizer: the GLOBAL count of valid positions (see ``losses.py``)

so the student's log-probabilities at the k tokens are exact, log q_j = z_j - L, without any
full-vocabulary tensor in the loss.

From the k tokens, two distributions over the same outcomes (``top_k_mode``):

``renormalized``: p̃_j = p_j / Σ_i p_i and q̃_j = q_j / Σ_i q_i over the k tokens (NeMo RL's and
    TRL's top-k distillation). Blind to how much mass the student keeps outside the set: top-k
    reverse KL can shrink the student's top-k mass unchecked (a known instability).
``tail``: k + 1 outcomes, the k tokens and a tail bucket holding the rest of the mass,
    p_tail = 1 - Σ_j p_j, q_tail = 1 - Σ_j q_j. Both are distributions over the same k + 1 outcomes,
    so each divergence below is a valid divergence of them (>= 0, 0 iff they are equal), and, the
    bucketing being a deterministic map, it bounds the full-vocabulary divergence from below (data
    processing inequality), with equality when k is the vocabulary size. log(1 - Σ_j p_j) loses
    precision when the tail is tiny (1 - Σ rounds); callers that can compute it over the vocabulary
    pass it exactly: ``teacher_tail_logprob`` = log p_tail and ``student_tail_logsumexp`` =
    R = log Σ_{v ∉ top-k} exp z_v (then log q_tail = R - L). Otherwise the tail is computed from the
    k values, floored at the dtype's epsilon.

With k = V both modes give the exact full-vocabulary divergences.

Divergences per position, over the outcomes b (``DISTILLATION_LOSSES[name]``, on log-distributions):

    forward_kl:  KL(p ‖ q) = Σ_b p_b (log p_b - log q_b)            mode-covering (Hinton et al. 2015)
    reverse_kl:  KL(q ‖ p) = Σ_b q_b (log q_b - log p_b)            mode-seeking (MiniLLM, Gu et al.
                 2024; on-policy distillation, Agarwal et al. 2024, Lu et al. 2025)
    mixed_kl:    w KL(p ‖ q) + (1 - w) KL(q ‖ p)                     (NeMo RL's mixed_kl_weight = w)
    jsd:         JSD_β = β KL(p ‖ m) + (1 - β) KL(q ‖ m), m = β p + (1 - β) q, 0 < β < 1
                 (generalised Jensen-Shannon, GKD: Agarwal et al. 2024, "On-Policy Distillation of
                 Language Models: Learning from Self-Generated Mistakes"). JSD_β / β -> KL(p ‖ q)
                 as β -> 0 and JSD_β / (1 - β) -> KL(q ‖ p) as β -> 1: use forward_kl / reverse_kl.

    loss = Σ_n mask_n D_n / normalizer

Terms with p_b = 0 (q_b = 0 for the student's side) count 0, value and gradient. The teacher's
inputs are constants (no gradient flows into them).

``on_policy_distill_advantages``: the sampled-token estimator, A_t = sg[log π_T(a_t) - log π_S(a_t)]
per generated token, a per-token reward whose expectation under the student is -KL(π_S ‖ π_T) (Lu
et al. 2025, "On-Policy Distillation", Thinking Machines); for GRPO's policy-gradient loss, alone or
added to environment advantages (registered as ``on_policy_distill`` in
``posttrain.algorithms.estimators``).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import Literal

import torch

TopKMode = Literal["tail", "renormalized"]
TOP_K_MODES = ("tail", "renormalized")


def _choice(kind: str, value: str, choices) -> None:
    if value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown {kind} {value!r}; choose one of {list(choices)}.{hint}")


# ----------------------------------------------------------------------------- distributions
def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - e^x) for x < 0, accurate over the whole range (Mächler 2012): log(-expm1(x)) for
    x > -log 2, log1p(-e^x) below. Each branch is evaluated on inputs valid for it only, so the
    other branch cannot put NaN into the gradient."""
    near_zero = x > -math.log(2.0)
    a = torch.log(-torch.expm1(torch.where(near_zero, x, torch.full_like(x, -1.0))))
    b = torch.log1p(-torch.exp(torch.where(near_zero, torch.full_like(x, -1.0), x)))
    return torch.where(near_zero, a, b)


def tail_logprob_from_topk(topk_logprobs: torch.Tensor) -> torch.Tensor:
    """log(1 - Σ_j exp(topk_logprobs_j)) per row, [N, k] -> [N]: the log-mass outside the k tokens.

    The top-k mass is capped at 1 - eps (eps of the dtype): a tail that rounds to 0 or below (k = V,
    or a distribution whose top-k holds all but less than eps) counts as eps, finite, with zero
    gradient there."""
    eps = torch.finfo(topk_logprobs.dtype).eps
    mass = torch.logsumexp(topk_logprobs, dim=-1).clamp(max=math.log1p(-eps))
    return log1mexp(mass)


def topk_log_distributions(
    student_topk_logits: torch.Tensor,
    student_logsumexp: torch.Tensor,
    teacher_topk_logprobs: torch.Tensor,
    *,
    top_k_mode: TopKMode = "tail",
    student_tail_logsumexp: torch.Tensor | None = None,
    teacher_tail_logprob: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p, log q): the teacher's and the student's log-distributions over the same outcomes.

    renormalized: [N, k], log p̃ = log_softmax(log p), log q̃ = log_softmax(z) (L cancels).
    tail: [N, k + 1], the k exact log-probabilities (log p_j, z_j - L) and the tail's, log p_tail
    (``teacher_tail_logprob`` or ``tail_logprob_from_topk``) and log q_tail (R - L with
    R = ``student_tail_logsumexp``, or ``tail_logprob_from_topk`` of z - L).
    """
    _choice("top_k_mode", top_k_mode, TOP_K_MODES)
    log_p = teacher_topk_logprobs.detach()
    if top_k_mode == "renormalized":
        return torch.log_softmax(log_p, dim=-1), torch.log_softmax(student_topk_logits, dim=-1)
    log_q = student_topk_logits - student_logsumexp.unsqueeze(-1)
    if teacher_tail_logprob is None:
        p_tail = tail_logprob_from_topk(log_p)
    else:
        p_tail = teacher_tail_logprob.detach().to(log_p.dtype)
    if student_tail_logsumexp is None:
        q_tail = tail_logprob_from_topk(log_q)
    else:
        q_tail = student_tail_logsumexp - student_logsumexp
    return torch.cat([log_p, p_tail.unsqueeze(-1)], dim=-1), torch.cat([log_q, q_tail.unsqueeze(-1)], dim=-1)


# ----------------------------------------------------------------------------- divergences
def kl_rows(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """KL(a ‖ b) = Σ_j a_j (log a_j - log b_j) along the last dim, [N, m] -> [N], 0 · log 0 = 0.

    Outcomes with a_j = 0 (log a_j = -inf) contribute 0 to the value and the gradient, even where
    b_j = 0 too; a_j > 0 with b_j = 0 gives +inf (the divergence is infinite)."""
    present = log_a > -math.inf
    zero = torch.zeros_like(log_a)
    safe_a = torch.where(present, log_a, zero)
    safe_b = torch.where(present, log_b, zero)
    return (torch.where(present, safe_a.exp(), zero) * (safe_a - safe_b)).sum(-1)


def forward_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) = Σ_b p_b (log p_b - log q_b) per position: teacher p, student q. [N, m] -> [N]."""
    return kl_rows(log_p, log_q)


def reverse_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(q ‖ p) = Σ_b q_b (log q_b - log p_b) per position: teacher p, student q. [N, m] -> [N]."""
    return kl_rows(log_q, log_p)


def mixed_kl(log_p: torch.Tensor, log_q: torch.Tensor, *, mixed_kl_weight: float = 0.5) -> torch.Tensor:
    """w KL(p ‖ q) + (1 - w) KL(q ‖ p) per position, w = ``mixed_kl_weight`` in [0, 1]. [N, m] -> [N]."""
    if not 0.0 <= mixed_kl_weight <= 1.0:
        raise ValueError(f"mixed_kl_weight must be in [0, 1], got {mixed_kl_weight}")
    w = mixed_kl_weight
    return w * kl_rows(log_p, log_q) + (1.0 - w) * kl_rows(log_q, log_p)


def generalized_jsd(log_p: torch.Tensor, log_q: torch.Tensor, *, jsd_beta: float = 0.5) -> torch.Tensor:
    """JSD_β(p ‖ q) = β KL(p ‖ m) + (1 - β) KL(q ‖ m), m = β p + (1 - β) q, per position (GKD,
    Agarwal et al. 2024). 0 < β < 1; β = 1/2 is the Jensen-Shannon divergence. [N, m] -> [N].

    log m = logaddexp(log β + log p, log(1 - β) + log q), with outcomes where p = q = 0 left at
    m = 0 (they count 0 in both KLs)."""
    if not 0.0 < jsd_beta < 1.0:
        raise ValueError(
            f"jsd_beta must be in (0, 1), got {jsd_beta}; its limits are forward_kl (β -> 0, divided "
            "by β) and reverse_kl (β -> 1, divided by 1 - β)"
        )
    both_zero = (log_p == -math.inf) & (log_q == -math.inf)
    zero = torch.zeros_like(log_p)
    lp, lq = torch.where(both_zero, zero, log_p), torch.where(both_zero, zero, log_q)
    log_m = torch.logaddexp(lp + math.log(jsd_beta), lq + math.log1p(-jsd_beta))
    log_m = torch.where(both_zero, torch.full_like(log_m, -math.inf), log_m)
    return jsd_beta * kl_rows(log_p, log_m) + (1.0 - jsd_beta) * kl_rows(log_q, log_m)


DISTILLATION_LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "forward_kl": forward_kl,
    "reverse_kl": reverse_kl,
    "mixed_kl": mixed_kl,
    "jsd": generalized_jsd,
}
"""Per-position divergences D(log p, log q, **hyper) -> [N] between teacher p and student q."""

DIVERGENCE_KNOBS = {"mixed_kl": ("mixed_kl_weight",), "jsd": ("jsd_beta",)}
"""The keyword hyper-parameters each divergence takes (the others take none)."""


def distillation_loss(
    student_topk_logits: torch.Tensor,
    student_logsumexp: torch.Tensor,
    teacher_topk_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    normalizer: float,
    divergence: str = "forward_kl",
    top_k_mode: TopKMode = "tail",
    student_tail_logsumexp: torch.Tensor | None = None,
    teacher_tail_logprob: torch.Tensor | None = None,
    mixed_kl_weight: float = 0.5,
    jsd_beta: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ_n mask_n D(p_n, q_n) / normalizer with D = ``DISTILLATION_LOSSES[divergence]`` over the
    top-k distributions of ``topk_log_distributions`` (see the module docstring for the inputs).

    Returns (loss, per-position divergence [N], detached, 0 where masked). ``mixed_kl_weight`` is
    used by mixed_kl, ``jsd_beta`` by jsd.
    """
    _choice("distillation loss", divergence, DISTILLATION_LOSSES)
    if normalizer <= 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")
    log_p, log_q = topk_log_distributions(
        student_topk_logits,
        student_logsumexp,
        teacher_topk_logprobs,
        top_k_mode=top_k_mode,
        student_tail_logsumexp=student_tail_logsumexp,
        teacher_tail_logprob=teacher_tail_logprob,
    )
    knobs = {"mixed_kl_weight": mixed_kl_weight, "jsd_beta": jsd_beta}
    kwargs = {name: knobs[name] for name in DIVERGENCE_KNOBS.get(divergence, ())}
    per_position = DISTILLATION_LOSSES[divergence](log_p, log_q, **kwargs)
    valid = mask.to(torch.bool)
    per_position = torch.where(valid, per_position, torch.zeros_like(per_position))
    weighted = per_position * mask.to(per_position.dtype)
    return weighted.sum() / normalizer, per_position.detach()


# ----------------------------------------------------------------------------- advantages
def on_policy_distill_advantages(
    teacher_logprobs: torch.Tensor,
    student_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    advantages: torch.Tensor | None = None,
    coefficient: float = 1.0,
) -> torch.Tensor:
    """Per-token advantages A_t = A_env + c · sg[log π_T(a_t) - log π_S(a_t)], [B, T], 0 where masked.

    The sampled-token variant of on-policy distillation: the student samples a_t, the teacher scores
    it; the per-token reward log π_T(a_t) - log π_S(a_t) has expectation -KL(π_S ‖ π_T) under the
    student (reverse KL, one sample). ``student_logprobs`` are those of the distribution the tokens
    were sampled from (generation logprobs, or π_old). ``advantages`` ([B] per sequence or [B, T]),
    if given, are environment advantages the teacher signal is added to; c = ``coefficient``.

    Args:
        teacher_logprobs: [B, T] the teacher's log-probabilities of the sampled tokens.
        student_logprobs: [B, T] the student's (the sampling distribution's) log-probabilities of them.
        mask: [B, T], 1 on generated tokens.
        advantages: environment advantages, [B] or [B, T], added to the teacher signal (None: none).
        coefficient: c.
    """
    m = mask.to(torch.bool)
    dtype = torch.promote_types(teacher_logprobs.dtype, torch.float32)  # fp32, or fp64 when given
    delta = teacher_logprobs.detach().to(dtype) - student_logprobs.detach().to(dtype)
    out = coefficient * delta
    if advantages is not None:
        env = advantages.detach().to(out.dtype)
        out = out + (env.unsqueeze(-1) if env.dim() == 1 else env)
    return torch.where(m, out, torch.zeros_like(out))
