"""Advantage estimators for group-sampled RL (GRPO and its variants), as pure torch functions.

Every estimator maps per-sample scalar rewards ``[N]`` and group ids ``[N]`` (samples that share a
prompt share a group id) to per-sample advantages ``[N]``. Groups are found by value, so they need
not be contiguous, numbered from 0, or of equal size. Everything is vectorised (``index_add_`` over
the group index), no Python loop over groups.

Standard deviation convention: the *sample* standard deviation with Bessel's correction
(divide by G - 1), as ``torch.std`` does by default and as GRPO implementations (TRL, verl) use.
A group of one sample has no spread; its std is defined as 0 here (``torch.std`` would give NaN).

A group whose rewards are all equal (max - min = 0) gets advantage exactly 0 from every group
estimator; the decision is made on the range, never on a rounded std (see ``group_range``).
Group statistics are computed in float64.

Estimators: ``grpo_advantages`` (and ``dr_grpo_advantages``, ``rloo_advantages``),
``reinforce_pp_advantages``, ``gdpo_advantages`` (several named reward components,
``components=[N, K]``), ``raw_reward_advantages``, REINFORCE's moving-average baseline
(``moving_average_baseline``, ``baseline_advantages``: no groups); ``trainable_samples`` says
which samples carry a learning signal. The registry that names them with one signature, and
restricts them to the trainable samples, is ``posttrain.algorithms.estimators`` (docs/algorithms.md).
Around them: ``scale_rewards`` (NeMo RL's reward scaling), ``kl_penalized_rewards`` /
``kl_penalized_returns`` (the KL to a reference as a reward penalty), ``clip_advantages`` and
``message_advantage_penalties``.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def _group_index(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    if group_ids.shape != values.shape:
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} != rewards shape {tuple(values.shape)}")
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max().item()) + 1 if inverse.numel() else 0


def _group_stats64(values: torch.Tensor, group_ids: torch.Tensor):
    """(inverse, count, sum, mean, sq_dev) per group, in float64; mean/count/sum are [num_groups]."""
    r = values.to(torch.float64)
    inverse, num_groups = _group_index(values, group_ids)
    zeros = r.new_zeros(num_groups)
    count = zeros.index_add(0, inverse, torch.ones_like(r))
    total = zeros.index_add(0, inverse, r)
    mean = total / count
    sq_dev = zeros.index_add(0, inverse, (r - mean[inverse]) ** 2)
    return inverse, count, total, mean, sq_dev


def group_statistics(values: torch.Tensor, group_ids: torch.Tensor) -> GroupStats:
    """Count, sum, mean and sample std of each sample's group, vectorised.

    Args:
        values: [N] float values (rewards).
        group_ids: [N] integer group ids; any values, in any order.
    Returns:
        GroupStats of four [N] tensors (see its docstring), in the values' float dtype. Computed
        in float64, the variance in two passes (mean first, then squared deviations).
    """
    values = _as_float(values)
    inverse, count, total, mean, sq_dev = _group_stats64(values, group_ids)
    var = torch.where(count > 1, sq_dev / (count - 1).clamp(min=1), torch.zeros_like(sq_dev))
    out = (count[inverse], total[inverse], mean[inverse], var.sqrt()[inverse])
    return GroupStats(*(x.to(values.dtype) for x in out))


def group_range(
    values: torch.Tensor, group_ids: torch.Tensor, *, where: torch.Tensor | None = None
) -> torch.Tensor:
    """max - min of each sample's group, [N] (exact: no rounding, unlike a std).

    A group whose range is 0 has all-equal rewards: no spread, no learning signal. Deciding by
    the range and not by ``std > 0`` matters: G copies of 0.1 (not exactly representable) have
    a mean that is not exactly 0.1 after rounding, hence a tiny non-zero std.
    With ``where`` ([N] bool) the range is over the group's members where it is True (every member
    of the group gets it); a group with none of them gets -inf.
    """
    r = _as_float(values).to(torch.float64)
    inverse, num_groups = _group_index(values, group_ids)
    take = torch.ones_like(r, dtype=torch.bool) if where is None else where.to(torch.bool)
    hi = r.new_full((num_groups,), -torch.inf).scatter_reduce(0, inverse[take], r[take], reduce="amax")
    lo = r.new_full((num_groups,), torch.inf).scatter_reduce(0, inverse[take], r[take], reduce="amin")
    spread = torch.where(hi >= lo, hi - lo, torch.full_like(hi, -torch.inf))
    return spread[inverse]


def _others_constant(r: torch.Tensor, inverse: torch.Tensor, num_groups: int) -> torch.Tensor:
    """[N] bool: the other members of sample i's group all have the same value (exactly)."""
    hi = r.new_full((num_groups,), -torch.inf).scatter_reduce(0, inverse, r, reduce="amax")[inverse]
    lo = r.new_full((num_groups,), torch.inf).scatter_reduce(0, inverse, r, reduce="amin")[inverse]
    ones = torch.ones_like(r)
    zeros = r.new_zeros(num_groups)
    count = zeros.index_add(0, inverse, ones)[inverse]
    at_hi = zeros.index_add(0, inverse, (r == hi).to(r.dtype))[inverse]
    at_lo = zeros.index_add(0, inverse, (r == lo).to(r.dtype))[inverse]
    # no spread at all, or i is the one sample that differs from all the others
    return (hi == lo) | ((r == hi) & (at_lo == count - 1)) | ((r == lo) & (at_hi == count - 1))


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    normalize_std: bool = True,
    leave_one_out: bool = False,
    leave_one_out_std: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO's group-relative advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

        A_i = (r_i - b_i) / (s_i + eps)     if normalize_std
        A_i =  r_i - b_i                    otherwise
        b_i = mean_g = (1/G) sum_{j in g} r_j                   (default)
        b_i = (1/(G-1)) sum_{j in g, j != i} r_j                (leave_one_out)
        s_i = std_g, the group's sample std (Bessel, G - 1)     (default)
        s_i = sample std of the G - 1 OTHER rewards (Bessel, G - 2)   (leave_one_out_std)

    where g is sample i's group and G its size. leave_one_out with leave_one_out_std is NeMo RL's
    default (``calculate_baseline_and_std_per_prompt``): baseline and std both leave sample i
    out. Where that std is 0 (the others are all equal, or G <= 2) the advantage is r_i - b_i,
    undivided, as NeMo RL does ("don't sharpen the ones with no variation").

    A group with no spread (max - min = 0, see ``group_range``; a singleton too) gets exactly 0
    for every variant, even when float rounding leaves a tiny std (0.1 is not exact in float32).
    Computed in float64, returned in the rewards' float dtype.

    Args:
        rewards: [N] scalar reward per sample.
        group_ids: [N] integer id of each sample's group (prompt).
    Returns:
        [N] advantages.
    """
    if leave_one_out_std and not leave_one_out:
        raise ValueError(
            "leave_one_out_std needs leave_one_out=True (NeMo RL's leave-one-out baseline and std)"
        )
    rewards = _as_float(rewards)
    r = rewards.to(torch.float64)
    inverse, count, total, mean, sq_dev = _group_stats64(rewards, group_ids)
    num_groups = count.numel()
    n, s, m = count[inverse], total[inverse], mean[inverse]
    if leave_one_out:
        baseline = torch.where(n > 1, (s - r) / (n - 1).clamp(min=1), r)
    else:
        baseline = m
    advantages = r - baseline
    if normalize_std:
        if leave_one_out_std:
            # squared deviations of the others about THEIR mean b: the group's about its mean,
            # moved to b (G (mean - b)^2), minus sample i's own term
            others_sq = sq_dev[inverse] + n * (m - baseline) ** 2 - (r - baseline) ** 2
            var = torch.where(n > 2, others_sq.clamp(min=0) / (n - 2).clamp(min=1), torch.zeros_like(r))
            std = torch.where(_others_constant(r, inverse, num_groups), torch.zeros_like(r), var.sqrt())
        else:
            std = torch.where(n > 1, sq_dev[inverse] / (n - 1).clamp(min=1), torch.zeros_like(r)).sqrt()
        advantages = torch.where(std > 0, advantages / (std + eps), advantages)
    no_spread = group_range(rewards, group_ids) == 0
    advantages = torch.where(no_spread, torch.zeros_like(advantages), advantages)
    return advantages.to(rewards.dtype)


def dr_grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783).

        A_i = r_i - mean_g

    GRPO without the division by the group std (which up-weights near-solved or near-failed
    prompts). A group with no spread gets exactly 0. Shapes: rewards [N], group_ids [N] -> [N].
    """
    return grpo_advantages(rewards, group_ids, normalize_std=False)


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740).

        A_i = r_i - (1/(G-1)) sum_{j in g, j != i} r_j = G/(G-1) * (r_i - mean_g)

    A group of one sample (G = 1) has no other member and gets advantage 0; so does a group
    with no spread. Shapes: rewards [N], group_ids [N] -> [N].
    """
    return grpo_advantages(rewards, group_ids, normalize_std=False, leave_one_out=True)


def gdpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    components: torch.Tensor,
    weights: Sequence[float] | None = None,
    normalize_std: bool = True,
    leave_one_out: bool = False,
    leave_one_out_std: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GDPO, the multi-reward estimator (Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization
    Policy Optimization", arXiv:2601.05242; NeMo RL's ``GDPOAdvantageEstimator``).

        A_ik = grpo_advantages(c_k, group_ids, normalize_std, leave_one_out, leave_one_out_std, eps)_i
        S_i  = sum_k w_k A_ik
        A_i  = (S_i - mean(S)) / std(S)          mean and std over the batch passed in (Bessel, N - 1);
                                                 std = 0 or N = 1: A_i = S_i - mean(S), as NeMo RL

    Each reward component c_k = components[:, k] is normalised within its group apart from the
    others, so a component with a small spread (a format reward) is not drowned by a large one
    (correctness), as it is in the group std of their sum (GRPO). A group where a component has no
    spread gets A_ik = 0 for it (``grpo_advantages``); after the batch normalisation a sample of a
    group with no spread in any component gets -mean(S) / std(S), not 0 (NeMo RL's as well).

    ``rewards`` (the scalar reward, the components' sum) is not used: it keeps the registry's
    signature. Call this on the whole batch (the registry's ``on_trainable_rows`` leaves out the
    samples that cannot train first). Computed in float64, returned in the rewards' float dtype.

    Args:
        components: [N, K] float, K >= 2 named parts of each sample's reward.
        weights: K weights w_k (None: all 1); a uniform scale changes nothing after the normalisation.
    Returns:
        [N] advantages.
    """
    out_dtype = _as_float(rewards).dtype
    if components.dim() != 2 or components.shape[0] != group_ids.shape[0]:
        raise ValueError(f"components {tuple(components.shape)} must be [N, K], N = {group_ids.shape[0]}")
    k = components.shape[1]
    if k < 2:
        raise ValueError(
            f"GDPO needs at least two reward components, got {k}; with one, use advantage.estimator=grpo"
        )
    w = [1.0] * k if weights is None else [float(x) for x in weights]
    if len(w) != k:
        raise ValueError(f"{len(w)} GDPO weights for {k} reward components")
    c = components.to(torch.float64)
    total = torch.zeros(c.shape[0], dtype=torch.float64)
    for j in range(k):
        part = grpo_advantages(
            c[:, j], group_ids, normalize_std=normalize_std, leave_one_out=leave_one_out,
            leave_one_out_std=leave_one_out_std, eps=eps,
        )  # fmt: skip
        total = total + w[j] * part
    centred = total - total.mean() if total.numel() else total
    std = centred.std() if centred.numel() > 1 else centred.new_zeros(())
    return (centred / std if std > 0 else centred).to(out_dtype)


def kl_penalized_rewards(
    rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, *, kl_beta: float
) -> torch.Tensor:
    """Sequence reward minus the KL penalty summed over its tokens (the KL as a reward, PPO-RLHF style).

        r'_i = r_i - β sum_t m_it KL_it

    KL_it is a per-token estimate of KL(π || π_ref) (``kl.kl_estimate``, no gradient).
    The sum (not mean) over tokens makes r' the return of the token-level reward
    -β KL_t (+ r at the last token) with γ = 1, as in InstructGPT (arXiv:2203.02155) and PPO-RLHF
    implementations; it grows with length. Shapes: rewards [N], kl [N, T], mask [N, T] -> [N].
    """
    if kl.shape != mask.shape or kl.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"kl {tuple(kl.shape)} and mask {tuple(mask.shape)} must be [N, T], N = {rewards.shape[0]}"
        )
    rewards = _as_float(rewards)
    m = mask.to(torch.bool)
    penalty = torch.where(m, kl.detach().to(torch.float64), kl.new_zeros((), dtype=torch.float64)).sum(-1)
    return (rewards.to(torch.float64) - kl_beta * penalty).to(rewards.dtype)


def kl_penalized_returns(
    rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, *, kl_beta: float
) -> torch.Tensor:
    """Per-token return-to-go of the reward with a per-token KL penalty (REINFORCE++, arXiv:2501.03262).

        G_it = r_i - β sum_{s >= t} m_is KL_is        (γ = 1; 0 where m_it = 0)

    The token-level reward is -β KL_t at every generated token plus r at the last one, and the
    advantage of token t is its return (REINFORCE++'s eq.; OpenRLHF's implementation). Token 0's
    return is ``kl_penalized_rewards``. (NeMo RL's REINFORCE++ subtracts only the token's own
    β KL_t, not the sum over later tokens.) Shapes: rewards [N], kl [N, T], mask [N, T] -> [N, T].
    """
    if kl.shape != mask.shape or kl.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"kl {tuple(kl.shape)} and mask {tuple(mask.shape)} must be [N, T], N = {rewards.shape[0]}"
        )
    rewards = _as_float(rewards)
    m = mask.to(torch.bool)
    k = torch.where(m, kl.detach().to(torch.float64), kl.new_zeros((), dtype=torch.float64))
    to_go = k.flip(-1).cumsum(-1).flip(-1)
    returns = rewards.to(torch.float64).unsqueeze(-1) - kl_beta * to_go
    return torch.where(m, returns, torch.zeros_like(returns)).to(rewards.dtype)


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    *,
    group_baseline: bool = False,
    eps: float = 1e-6,
    kl: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    kl_beta: float = 0.0,
) -> torch.Tensor:
    """REINFORCE++ advantage (Hu 2025, arXiv:2501.03262): global batch normalisation.

        a_i = r_i - mean_batch(r)           (default: batch baseline)
        a_i = r_i - mean_g(r)               (group_baseline=True: "REINFORCE++-baseline")
        A_i = (a_i - mean_batch(a)) / (std_batch(a) + eps)

    With the batch baseline the second centring is a no-op (a already has mean 0). std_batch is
    the sample std over the whole batch passed in (Bessel, N - 1; 0 for N = 1), so call this on
    the full global batch, not per microbatch. group_ids is only used with group_baseline.
    Shapes: rewards [N], group_ids [N] -> [N].

    With ``kl`` ([N, T] per-token KL estimates) and ``mask`` ([N, T]) the KL is a per-token
    reward penalty, as in the paper: a_it = ``kl_penalized_returns(a, kl, mask, kl_beta)``
    (a_i minus β times the KL still to come), normalised over the batch's valid TOKENS (mean and
    Bessel std over all m_it = 1); the result is [N, T], 0 at masked positions.
    """
    rewards = _as_float(rewards)
    r = rewards.to(torch.float64)
    if group_baseline:
        if group_ids is None:
            raise ValueError("reinforce_pp_advantages(group_baseline=True) needs group_ids")
        centred = r - group_statistics(r, group_ids).mean
    else:
        centred = r
    if kl is None:
        centred = centred - centred.mean()
        std = centred.std() if centred.numel() > 1 else centred.new_zeros(())
        return (centred / (std + eps)).to(rewards.dtype)
    if mask is None:
        raise ValueError("reinforce_pp_advantages(kl=...) needs the token mask")
    m = mask.to(torch.bool)
    returns = kl_penalized_returns(centred, kl, mask, kl_beta=kl_beta)
    values = returns[m]
    mean = values.mean() if values.numel() else returns.new_zeros(())
    std = values.std() if values.numel() > 1 else returns.new_zeros(())
    out = torch.where(m, (returns - mean) / (std + eps), torch.zeros_like(returns))
    return out.to(rewards.dtype)


def raw_reward_advantages(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """NeMo RL's ``raw_reward`` estimator: A_bt = r_b on every valid token, 0 elsewhere (no critic,
    no baseline; whitening, if wanted, is the caller's). Shapes: rewards [B], mask [B, T] -> [B, T]."""
    r = _as_float(rewards)
    if mask.dim() != 2 or mask.shape[0] != r.shape[0]:
        raise ValueError(f"mask {tuple(mask.shape)} must be [B, T] with B = {r.shape[0]}")
    return torch.where(mask.to(torch.bool), r.unsqueeze(-1), torch.zeros((), dtype=r.dtype))


def moving_average_baseline(
    baseline: float | None, rewards: torch.Tensor, *, momentum: float, scored: torch.Tensor | None = None
) -> float | None:
    """REINFORCE's moving-average baseline after one batch: b <- m b + (1 - m) mean(r), the mean
    over the batch's scored samples, in float64 (Williams 1992; Sutton & Barto 13.4). The first
    batch (``baseline`` None) sets b = mean(r); a batch without a scored sample leaves b as it is.
    Shapes: rewards [N], scored [N] bool (None: all scored)."""
    r = _as_float(rewards).double()
    if scored is not None:
        r = r[scored.to(torch.bool)]
    if r.numel() == 0:
        return baseline
    mean = float(r.mean())
    return mean if baseline is None else momentum * baseline + (1.0 - momentum) * mean


def baseline_advantages(
    rewards: torch.Tensor, baseline: float | None, *, scored: torch.Tensor | None = None
) -> torch.Tensor:
    """A_i = r_i - b for the scored samples, 0 for the others; [N] float64. ``baseline`` None (no
    batch seen yet): b = this batch's scored mean (``moving_average_baseline(None, ...)``)."""
    r = _as_float(rewards).double()
    b = baseline if baseline is not None else moving_average_baseline(None, r, momentum=0.0, scored=scored)
    keep = torch.ones_like(r, dtype=torch.bool) if scored is None else scored.to(torch.bool)
    return torch.where(keep, r - (0.0 if b is None else b), torch.zeros((), dtype=r.dtype))


def message_advantage_penalties(
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    invalid_tool_call: torch.Tensor,
    malformed_thinking: torch.Tensor,
    invalid_tool_call_advantage: float | None,
    malformed_thinking_advantage: float | None,
) -> torch.Tensor:
    """NeMo RL's message-level advantage penalties for agents (``grpo.invalid_tool_call_advantage``,
    ``grpo.malformed_thinking_advantage``): the tokens of a flagged assistant turn get a fixed
    advantage instead of their episode's.

        A'_bt = invalid_tool_call_advantage      if invalid_tool_call[b, t] and that value is set
              = malformed_thinking_advantage     elif malformed_thinking[b, t] and that value is set
              = A_bt (A_b for [B] advantages)    otherwise

    An invalid tool call takes precedence over malformed thinking (NeMo RL's order). Only valid
    tokens (``mask`` 1) change. Both None: ``advantages`` returned as they are (same object, shape).
    NeMo RL clips after the penalties: clip the result (``clip_advantages``; clipping twice is the
    same as once). Shapes: advantages [B] or [B, T], mask / flags [B, T] -> [B, T].
    """
    if invalid_tool_call_advantage is None and malformed_thinking_advantage is None:
        return advantages
    if not (invalid_tool_call.shape == malformed_thinking.shape == mask.shape):
        raise ValueError(
            f"flags {tuple(invalid_tool_call.shape)} / {tuple(malformed_thinking.shape)} must match "
            f"mask {tuple(mask.shape)}"
        )
    out = advantages.unsqueeze(-1).expand(mask.shape) if advantages.dim() == 1 else advantages
    out = out.clone()
    valid = mask.to(torch.bool)
    if malformed_thinking_advantage is not None:
        out[valid & malformed_thinking.to(torch.bool)] = malformed_thinking_advantage
    if invalid_tool_call_advantage is not None:
        out[valid & invalid_tool_call.to(torch.bool)] = invalid_tool_call_advantage
    return out


def clip_advantages(
    advantages: torch.Tensor,
    clip: float | None,
    *,
    low: float | None = None,
    high: float | None = None,
) -> torch.Tensor:
    """A clamped to [-clip, clip] (None: unchanged). Bounds the weight a single sample gets, e.g. a
    lone success among G binary rewards, whose GRPO advantage is (G - 1) / sqrt(G) (7.9 for G = 64).

    Asymmetric bounds (NeMo RL's advantage_clip_low / advantage_clip_high): A >= low, then A <= high,
    each only where given (None: that side open). Not combined with ``clip``; needs low < high.
    """
    if clip is not None and (low is not None or high is not None):
        raise ValueError("give either the symmetric clip or the low / high bounds, not both")
    if low is not None and high is not None and low >= high:
        raise ValueError(f"advantage clip low ({low}) must be below high ({high})")
    if low is not None or high is not None:
        return advantages.clamp(min=low, max=high)
    if clip is None:
        return advantages
    if clip <= 0:
        raise ValueError(f"advantage clip must be > 0, got {clip}")
    return advantages.clamp(min=-clip, max=clip)


def scale_rewards(
    rewards: torch.Tensor,
    *,
    source_min: float,
    source_max: float,
    target_min: float,
    target_max: float,
) -> torch.Tensor:
    """NeMo RL's reward scaling: clamp to [source_min, source_max], then map linearly onto
    [target_min, target_max].

        r' = target_min + (clamp(r, source_min, source_max) - source_min)
                          * (target_max - target_min) / (source_max - source_min)

    Shapes: [N] -> [N] (the rewards' float dtype).
    """
    if source_max <= source_min:
        raise ValueError(f"need source_min < source_max, got {source_min} and {source_max}")
    r = rewards if rewards.is_floating_point() else rewards.float()
    clamped = r.clamp(min=source_min, max=source_max)
    return target_min + (clamped - source_min) * ((target_max - target_min) / (source_max - source_min))


def trainable_samples(group_ids: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """[N] bool: the samples that carry a learning signal: scored, in a group with >= 2 scored samples.

    A sample the environment could not score (``scored`` False) has no reward to compare; a group
    left with fewer than two scored samples has no baseline, so its scored sample trains on nothing
    too. Shapes: group_ids [N], scored [N] (bool) -> bool [N].
    """
    keep = scored.to(torch.bool)
    inverse, num_groups = _group_index(keep, group_ids)
    count = torch.zeros(num_groups, dtype=torch.long).index_add(0, inverse, keep.long())
    return keep & (count[inverse] >= 2)
