"""PPO with a learned critic: per-token rewards, generalised advantage estimation, value loss.

Shapes: B sequences, T token positions. ``mask[b, t] = 1`` marks an assistant (generated) token:
an action of the policy, whose state is everything before it. Masked positions (the prompt,
environment observations, padding) are not actions: GAE skips them, carrying the next valid
token's value and advantage across, so inserting observation tokens between two turns changes
no assistant token's advantage, and no discount is applied for them.

``values[b, t]`` is the critic's V(s_t), the value of the state just before token t (the
critic reads tokens < t), aligned with the token whose action it values.

Everything is computed in float64 and returned in the values' dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class GAEOutput(NamedTuple):
    """advantages [B, T] and returns (value targets, A + V) [B, T]; 0 where mask is 0."""

    advantages: torch.Tensor
    returns: torch.Tensor


def _check_shapes(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1 or any(len(s) != 2 for s in shapes.values()):
        raise ValueError(f"expected equal [B, T] shapes, got {shapes}")


def _per_sequence(lam: float | torch.Tensor, batch: int) -> torch.Tensor:
    lam = torch.as_tensor(lam, dtype=torch.float64)
    if lam.dim() == 0:
        lam = lam.expand(batch)
    if lam.shape != (batch,):
        raise ValueError(f"lam must be a float or a [B] tensor (B = {batch}), got {tuple(lam.shape)}")
    if bool(((lam < 0) | (lam > 1)).any()):
        raise ValueError(f"lam must lie in [0, 1], got {lam.tolist()}")
    return lam


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    lam: float | torch.Tensor,
) -> GAEOutput:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv:1506.02438) over valid tokens.

    For each sequence, let t_1 < t_2 < ... < t_n be its valid positions (mask = 1). With
    next(t_k) = t_{k+1} and V(next(t_n)) = 0 (the episode ends after its last assistant token):

        δ_t = r_t + γ V(next(t)) − V_t
        A_t = δ_t + γ λ A(next(t))          (A(next(t_n)) = 0)
        R_t = A_t + V_t                     (the value target; with λ = 1, R_t = Σ_k γ^k r_{t+k})

    Masked positions are skipped (no reward, no value, no discount): rewards and values there are
    ignored. λ = 1, γ = 1 give A_t = Σ_{s ≥ t} r_s − V_t; λ = 0 gives A_t = δ_t.

    Args:
        rewards: [B, T] per-token rewards (see ``token_rewards``).
        values: [B, T] V(s_t) from the critic (no gradient is taken).
        mask: [B, T] 1 on assistant tokens.
        gamma: discount γ in [0, 1].
        lam: λ in [0, 1], a float or [B] per sequence (``length_adaptive_lambda``).
    Returns:
        GAEOutput(advantages [B, T], returns [B, T]), 0 at masked positions.
    """
    _check_shapes(rewards=rewards, values=values, mask=mask)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    b, t = values.shape
    lam64 = _per_sequence(lam, b)
    valid = mask.to(torch.bool)
    r = torch.where(valid, rewards.detach().to(torch.float64), 0.0)
    v = torch.where(valid, values.detach().to(torch.float64), 0.0)
    advantages = torch.zeros(b, t, dtype=torch.float64)
    next_value = torch.zeros(b, dtype=torch.float64)
    next_advantage = torch.zeros(b, dtype=torch.float64)
    for i in range(t - 1, -1, -1):  # one vectorised step per position, carried across masked ones
        m = valid[:, i]
        delta = r[:, i] + gamma * next_value - v[:, i]
        a = delta + gamma * lam64 * next_advantage
        advantages[:, i] = torch.where(m, a, 0.0)
        next_value = torch.where(m, v[:, i], next_value)
        next_advantage = torch.where(m, a, next_advantage)
    returns = torch.where(valid, advantages + v, 0.0)
    return GAEOutput(advantages.to(values.dtype), returns.to(values.dtype))


def length_adaptive_lambda(lengths: torch.Tensor, *, alpha: float) -> torch.Tensor:
    """VAPO's length-adaptive GAE λ for the policy (Yue et al. 2025, arXiv:2504.05118, eq. 7):

        λ_policy = 1 − 1 / (α · l)

    with l the sequence's number of assistant tokens, clamped to [0, 1] (l ≤ 1/α gives 0: a short
    answer is credited by TD errors; long ones approach λ = 1, Monte Carlo). VAPO uses α = 0.05.
    Shapes: lengths [B] -> [B] float64.
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    length = lengths.to(torch.float64).clamp(min=1.0)
    return (1.0 - 1.0 / (alpha * length)).clamp(min=0.0, max=1.0)


def whiten(
    values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Standardise over the valid entries of the whole batch (call it on the global batch):

        x' = (x − mean) / sqrt(var + eps)        (shift_mean=False: x' = x / sqrt(var + eps), mean kept)

    mean and var (population, divide by the count) over entries where mask = 1; 0 at masked
    entries. Fewer than two valid entries: returned centred (or unchanged), not divided.
    Shapes: [B, T] x2 -> [B, T].
    """
    _check_shapes(values=values, mask=mask)
    valid = mask.to(torch.bool)
    x = values.detach().to(torch.float64)
    selected = x[valid]
    if selected.numel() == 0:
        return torch.zeros_like(values)
    mean = selected.mean()
    var = ((selected - mean) ** 2).mean()
    out = x - mean if shift_mean else x.clone()
    if selected.numel() > 1:
        out = out / torch.sqrt(var + eps)
    return torch.where(valid, out, 0.0).to(values.dtype)


def token_rewards(
    turn_rewards: list[list[float]],
    turn_ends: list[list[int]],
    shape: tuple[int, int],
    mask: torch.Tensor,
    *,
    extra: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    kl_beta: float = 0.0,
) -> torch.Tensor:
    """Per-token rewards of a batch of episodes, on assistant tokens only:

        r_t = Σ_{turns k ending at t} reward_k + [t = last assistant token] · extra_b − β KL_t

    Each turn's environment reward lands on that turn's last assistant token: the last valid
    position < `turn_ends[b][k]` (a turn that generated nothing credits the latest assistant token
    before it; with none, or a reward without a turn end, the sequence's last one). ``extra`` ([B], e.g. the reward shaping that
    the trainer adds to a sequence's total) lands on the sequence's last assistant token.
    ``kl`` ([B, T] per-token KL(π || π_ref) estimates) with ``kl_beta`` is the KL penalty as a
    reward (PPO-RLHF, InstructGPT). A sequence without assistant tokens gets no reward.

    Args:
        turn_rewards: per sequence, its turns' rewards.
        turn_ends: per sequence, the end (exclusive) position of each turn's generated tokens.
        shape: (B, T).
        mask: [B, T] 1 on assistant tokens.
    Returns:
        [B, T] float64 rewards, 0 where mask is 0.
    """
    b, t = shape
    if mask.shape != (b, t) or len(turn_rewards) != b or len(turn_ends) != b:
        raise ValueError(
            f"token_rewards: mask {tuple(mask.shape)} and {len(turn_rewards)} sequences vs {shape}"
        )
    valid = mask.to(torch.bool)
    out = torch.zeros(b, t, dtype=torch.float64)
    for i in range(b):
        positions = valid[i].nonzero().flatten().tolist()
        if not positions:
            continue
        for k, reward in enumerate(turn_rewards[i]):
            end = turn_ends[i][k] if k < len(turn_ends[i]) else t
            before = [p for p in positions if p < end]
            out[i, before[-1] if before else positions[-1]] += reward
        if extra is not None:
            out[i, positions[-1]] += float(extra[i])
    if kl is not None and kl_beta:
        out = out - kl_beta * torch.where(valid, kl.detach().to(torch.float64), 0.0)
    return out
