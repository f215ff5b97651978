"""Reward shaping before the advantages, as pure torch functions (DAPO's soft overlong penalty lives
in ``posttrain.algorithms.dapo``)."""

from __future__ import annotations

import torch


def stop_properly_penalty(rewards: torch.Tensor, truncated: torch.Tensor, *, coef: float) -> torch.Tensor:
    """NeMo RL's ``stop_properly_penalty_coef``: the reward of a sample that did not stop on its own
    (truncated: no stop token within the length budget) is scaled by ``coef``:

        r'_i = coef * r_i   if truncated_i
        r'_i = r_i          otherwise

    coef = 1 changes nothing; coef = 0 gives every truncated sample reward 0 (NeMo RL's boundary
    cases); an all-truncated batch is scaled throughout. With rewards >= 0 a truncated sample never
    earns more than the same answer stopped; a negative reward is scaled towards 0 (as in NeMo RL),
    so with rewards below 0 truncation is penalised LESS than stopping with the same reward.
    Shapes: rewards [N] (float), truncated [N] (bool) -> [N] in the rewards' dtype.
    """
    if not 0.0 <= coef <= 1.0:
        raise ValueError(f"stop_properly_penalty_coef must be in [0, 1], got {coef}")
    if truncated.shape != rewards.shape:
        raise ValueError(f"truncated {tuple(truncated.shape)} must match rewards {tuple(rewards.shape)}")
    return torch.where(truncated.to(torch.bool), rewards * coef, rewards)
