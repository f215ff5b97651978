"""DAPO's data-side techniques (Yu et al. 2025, arXiv:2503.14476) as pure torch functions:
dynamic sampling (drop groups whose rewards are all equal), overlong filtering and soft overlong
punishment. (DAPO's clip-higher and token-level loss live in ``policy_loss.clipped_pg_loss``.)
"""

from __future__ import annotations

import torch

from posttrain.algorithms.advantages import group_range, trainable_samples


def zero_variance_groups(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    atol: float = 0.0,
    scored: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mask of samples whose group has all-equal rewards (DAPO dynamic sampling filters them out).

        zero_var_i = (max_{j in g(i)} r_j - min_{j in g(i)} r_j) <= atol

    Such a group has zero group-relative advantage, so it gives no policy gradient. A group of
    one sample counts as zero-variance. Groups need not be contiguous.
    With ``scored`` ([N] bool) j runs over the group's ``trainable_samples`` only (scored, in a
    group with >= 2 scored): the reward 0 of an unscored sample never makes a spread, and a group
    with fewer than two scored samples is zero-variance (all its members, scored or not).
    Shapes: rewards [N], group_ids [N] -> bool [N]. The keep mask is ``~zero_variance_groups(...)``.
    """
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be [N]")
    where = None if scored is None else trainable_samples(group_ids, scored)
    return group_range(rewards, group_ids, where=where) <= atol


def overlong_filter_mask(truncated: torch.Tensor) -> torch.Tensor:
    """DAPO overlong filtering: keep mask [N] (bool) that drops truncated samples from the loss.

        keep_i = not truncated_i

    A truncated response has no final answer, so its (usually negative) reward is noise.
    """
    return ~truncated.to(torch.bool)


def overlong_reward_shaping(
    lengths: torch.Tensor, *, max_len: int, buffer_len: int, penalty: float = 1.0
) -> torch.Tensor:
    """DAPO's soft overlong punishment, a length-dependent reward added to the task reward.

        R(L) = 0                                        L <= max_len - buffer_len
        R(L) = (max_len - buffer_len - L) / buffer_len * penalty    max_len - buffer_len < L <= max_len
        R(L) = -penalty                                 L > max_len

    (L = max_len gives -penalty on both sides.) ``max_len`` is the generation budget L_max,
    ``buffer_len`` the punishment interval L_cache (paper: 20480 and 4096).
    Shapes: lengths [N] (ints or floats) -> float [N].
    """
    if buffer_len < 0 or buffer_len > max_len:
        raise ValueError(f"need 0 <= buffer_len <= max_len, got buffer_len={buffer_len}, max_len={max_len}")
    if penalty < 0:
        raise ValueError(f"penalty must be >= 0 (it is subtracted), got {penalty}")
    L = lengths.to(torch.float32) if not lengths.is_floating_point() else lengths
    start = max_len - buffer_len
    in_buffer = (start - L) / max(buffer_len, 1) * penalty
    out = torch.where(L <= start, torch.zeros_like(L), in_buffer)
    return torch.where(L > max_len, torch.full_like(L, -penalty), out)
