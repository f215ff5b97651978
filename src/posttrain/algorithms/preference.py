"""Preference losses as pure functions: DPO (sigmoid, conservative / label-smoothed), IPO, Bradley–Terry.

Every loss takes per-pair tensors of shape [P] and returns per-pair losses [P]; the trainer sums
them over a microbatch and divides by the GLOBAL number of pairs (see `posttrain.algorithms.losses`),
so the gradient does not depend on how the batch is split.

Notation: for a prompt x with a chosen response y_w and a rejected response y_l,

    h = (log π(y_w|x) - log π_ref(y_w|x)) - (log π(y_l|x) - log π_ref(y_l|x))

is the difference of the implicit rewards divided by β (DPO's r(x, y) = β (log π - log π_ref)).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def sequence_logprobs(token_logprobs: torch.Tensor, mask: torch.Tensor, *, average: bool) -> torch.Tensor:
    """Per-sequence log-probability of the masked (response) tokens.

        summed:   s_b = sum_t m[b,t] * lp[b,t]
        averaged: s_b = sum_t m[b,t] * lp[b,t] / max(1, sum_t m[b,t])

    Args:
        token_logprobs: [B, T] log-probabilities (0 where not a target).
        mask: [B, T] 1 on response tokens.
        average: divide by each sequence's own response length (length-normalised, as in IPO/SimPO).
    Returns: [B].
    """
    mask = mask.to(token_logprobs.dtype)
    total = (token_logprobs * mask).sum(dim=-1)
    return total / mask.sum(dim=-1).clamp(min=1.0) if average else total


def preference_logits(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
) -> torch.Tensor:
    """h = (π_c - ref_c) - (π_r - ref_r) for [P] sequence log-probabilities; returns [P]."""
    return (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)


def dpo_sigmoid_loss(h: torch.Tensor, *, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """DPO (Rafailov et al. 2023) with optional label smoothing (conservative DPO, Mitchell 2023).

        loss = -(1 - ε) log σ(β h) - ε log σ(-β h)

    ε = 0 is plain DPO; ε > 0 assumes each label is flipped with probability ε.

    Args:
        h: [P] log-ratio differences (see module docstring).
        beta: β > 0, the strength of the implicit KL constraint.
        label_smoothing: ε in [0, 0.5).
    Returns: [P] per-pair losses.
    """
    z = beta * h
    return -(1.0 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)


def ipo_loss(h: torch.Tensor, *, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """IPO (Azar et al. 2023): regress h onto a fixed margin instead of pushing it to infinity.

        loss = (h - 1 / (2 β))^2

    The paper uses length-averaged log-probabilities (set `average_logprobs`). `label_smoothing`
    is accepted for a uniform signature and must be 0.

    Args:
        h: [P] log-ratio differences.
        beta: β > 0 (the paper's τ); the target margin is 1 / (2 β).
    Returns: [P] per-pair losses.
    """
    if label_smoothing:
        raise ValueError("label smoothing applies to the sigmoid (DPO) loss, not to IPO")
    return (h - 1.0 / (2.0 * beta)) ** 2


def chosen_nll(
    token_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    normalization: str,
    tokens: float,
    pairs: float,
) -> torch.Tensor:
    """This microbatch's share of the SFT term of DPO: the NLL of the chosen responses ([P, T] rows).

        "token":    Σ_b Σ_t m_bt (-lp_bt) / tokens                 (per chosen token of the global batch)
        "sum":      Σ_b [Σ_t m_bt (-lp_bt)] / pairs                 (NeMo RL, sft_average_log_probs=false)
        "average":  Σ_b [Σ_t m_bt (-lp_bt) / max(Σ_t m_bt, 1)] / pairs   (NeMo RL, sft_average_log_probs=true)

    tokens / pairs: the global batch's chosen tokens / pairs, so summing the shares over microbatches
    gives the global value. Returns a scalar.
    """
    if normalization == "token":
        return -(token_logprobs * mask.to(token_logprobs.dtype)).sum() / tokens
    if normalization not in ("sum", "average"):
        raise ValueError(f"unknown SFT normalization {normalization!r}; choose token, sum or average")
    per_sequence = sequence_logprobs(token_logprobs, mask, average=normalization == "average")
    return -per_sequence.sum() / pairs


PREFERENCE_LOSSES: dict[str, Callable[..., torch.Tensor]] = {"sigmoid": dpo_sigmoid_loss, "ipo": ipo_loss}
"""DPO-family losses by name (config: `dpo.loss_type`); each maps h [P] -> per-pair losses [P]."""


def bradley_terry_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> torch.Tensor:
    """Bradley–Terry negative log-likelihood of the observed preference under scalar rewards.

        P(y_w ≻ y_l) = σ(r_w - r_l),   loss = -log σ(r_w - r_l)

    Args:
        chosen_rewards: [P] r_w, the reward model's score of the chosen response.
        rejected_rewards: [P] r_l.
    Returns: [P] per-pair losses.
    """
    return -F.logsigmoid(chosen_rewards - rejected_rewards)


def preference_accuracy_and_margin(
    chosen: torch.Tensor, rejected: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair correctness 1[chosen > rejected] (ties count as wrong) and margin chosen - rejected; [P] each."""
    return (chosen > rejected).to(chosen.dtype), chosen - rejected
