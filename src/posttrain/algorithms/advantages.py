"""Advantage estimators for group-sampled RL (GRPO and its variants), as pure torch functions.

Every estimator maps per-sample scalar rewards ``[N]`` and group ids ``[N]`` (samples that share a
prompt share a group id) to per-sample advantages ``[N]``. Groups are found by value, so they need
not be contiguous, numbered from 0, or of equal size. Everything is vectorised (``index_add_`` over
the group index), no Python loop over groups.

Standard deviation convention: the *sample* standard deviation with Bessel's correction
(divide by G - 1), as ``torch.std`` does by default and as GRPO implementations (TRL, verl) use.
A group of one sample has no spread; its std is defined as 0 here (``torch.std`` would give NaN).

Registry: ``ADVANTAGE_ESTIMATORS[name]`` with ``name`` in ``"grpo"``, ``"dr_grpo"``, ``"rloo"``,
``"reinforce_pp"``; ``compute_advantages(name, rewards, group_ids, **kwargs)`` dispatches.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import NamedTuple

import torch


class GroupStats(NamedTuple):
    """Per-sample statistics of each sample's group, all ``[N]`` (broadcast back to the samples).

    count: G, the size of the sample's group (float).
    sum: sum of the group's values.
    mean: sum / G.
    std: sample std of the group (Bessel: sqrt(sum (x - mean)^2 / (G - 1))), 0 for G = 1.
    """

    count: torch.Tensor
    sum: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor


def _as_float(rewards: torch.Tensor) -> torch.Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must have shape [N], got {tuple(rewards.shape)}")
    return rewards if rewards.is_floating_point() else rewards.to(torch.float32)


def group_statistics(values: torch.Tensor, group_ids: torch.Tensor) -> GroupStats:
    """Count, sum, mean and sample std of each sample's group, vectorised.

    Args:
        values: [N] float values (rewards).
        group_ids: [N] integer group ids; any values, in any order.
    Returns:
        GroupStats of four [N] tensors (see its docstring). The variance is computed in two
        passes (mean first, then squared deviations) for numerical stability.
    """
    values = _as_float(values)
    if group_ids.shape != values.shape:
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} != rewards shape {tuple(values.shape)}")
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    zeros = values.new_zeros(num_groups)
    count = zeros.index_add(0, inverse, torch.ones_like(values))
    total = zeros.index_add(0, inverse, values)
    mean = total / count
    sq_dev = zeros.index_add(0, inverse, (values - mean[inverse]) ** 2)
    var = torch.where(count > 1, sq_dev / (count - 1).clamp(min=1), torch.zeros_like(sq_dev))
    return GroupStats(count[inverse], total[inverse], mean[inverse], var.sqrt()[inverse])


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    normalize_std: bool = True,
    leave_one_out: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO's group-relative advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

        A_i = (r_i - b_i) / (std_g + eps)     if normalize_std
        A_i =  r_i - b_i                      otherwise
        b_i = mean_g = (1/G) sum_{j in g} r_j                   (default)
        b_i = (1/(G-1)) sum_{j in g, j != i} r_j                (leave_one_out; 0 advantage if G = 1)

    where g is sample i's group, G its size and std_g the group's sample std (Bessel, G - 1; 0 for
    G = 1). With leave_one_out the std is still the whole group's std.

    Args:
        rewards: [N] scalar reward per sample.
        group_ids: [N] integer id of each sample's group (prompt).
    Returns:
        [N] advantages, the rewards' float dtype.
    """
    rewards = _as_float(rewards)
    stats = group_statistics(rewards, group_ids)
    if leave_one_out:
        others = torch.where(stats.count > 1, stats.count - 1, torch.ones_like(stats.count))
        baseline = torch.where(stats.count > 1, (stats.sum - rewards) / others, rewards)
    else:
        baseline = stats.mean
    advantages = rewards - baseline
    if normalize_std:
        # a zero-spread group (all rewards equal, or a singleton) has no signal: exactly 0, even
        # with eps = 0 or when float rounding leaves r - mean = 1e-17
        spread = stats.std > 0
        advantages = torch.where(spread, advantages / (stats.std + eps), torch.zeros_like(advantages))
    return advantages


def dr_grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783).

        A_i = r_i - mean_g

    GRPO without the division by the group std (which up-weights near-solved or near-failed
    prompts). Shapes: rewards [N], group_ids [N] -> [N].
    """
    return grpo_advantages(rewards, group_ids, normalize_std=False)


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740).

        A_i = r_i - (1/(G-1)) sum_{j in g, j != i} r_j = G/(G-1) * (r_i - mean_g)

    A group of one sample (G = 1) has no other member and gets advantage 0.
    Shapes: rewards [N], group_ids [N] -> [N].
    """
    return grpo_advantages(rewards, group_ids, normalize_std=False, leave_one_out=True)


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    *,
    group_baseline: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """REINFORCE++ advantage (Hu 2025, arXiv:2501.03262): global batch normalisation.

        a_i = r_i - mean_batch(r)           (default: batch baseline)
        a_i = r_i - mean_g(r)               (group_baseline=True: "REINFORCE++-baseline")
        A_i = (a_i - mean_batch(a)) / (std_batch(a) + eps)

    With the batch baseline the second centring is a no-op (a already has mean 0). std_batch is
    the sample std over the whole batch passed in (Bessel, N - 1; 0 for N = 1), so call this on
    the full global batch, not per microbatch. group_ids is only used with group_baseline.
    Shapes: rewards [N], group_ids [N] -> [N].
    """
    rewards = _as_float(rewards)
    if group_baseline:
        if group_ids is None:
            raise ValueError("reinforce_pp_advantages(group_baseline=True) needs group_ids")
        centred = rewards - group_statistics(rewards, group_ids).mean
    else:
        centred = rewards
    centred = centred - centred.mean()
    std = centred.std() if centred.numel() > 1 else centred.new_zeros(())
    return centred / (std + eps)


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
}


def compute_advantages(name: str, rewards: torch.Tensor, group_ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """Advantages by estimator name (a key of ADVANTAGE_ESTIMATORS); kwargs go to the estimator."""
    try:
        fn = ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(ADVANTAGE_ESTIMATORS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of {sorted(ADVANTAGE_ESTIMATORS)}.{hint}"
        ) from None
    return fn(rewards, group_ids, **kwargs)
