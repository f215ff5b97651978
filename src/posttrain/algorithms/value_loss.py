"""The critic's loss and diagnostics, as pure torch functions.

Normalisation convention (see ``losses.py``): the loss is a *sum* over this microbatch divided by
``normalizer``, the GLOBAL count of valid tokens, so summing microbatch losses gives the global
mean and the gradient does not depend on how the batch was split.
"""

from __future__ import annotations

import torch


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    normalizer: float,
    clip: float | None = None,
    scale: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's (clipped) value loss (Schulman et al. 2017; the form of OpenAI baselines / verl):

        V^clip_t = V_old,t + clamp(V_t − V_old,t, −ε, ε)
        l_t      = ½ max((V_t − R_t)², (V^clip_t − R_t)²)          (clip = ε)
        l_t      = ½ (V_t − R_t)²                                   (clip = None)
        loss     = scale · Σ_t m_t l_t / normalizer          (scale: NeMo RL's value_loss_fn.scale)

    Args:
        values: [B, T] V_t from the critic being trained (with grad).
        old_values: [B, T] the critic's values when the batch was collected (no grad).
        returns: [B, T] value targets R_t (no grad).
        mask: [B, T] 1 on tokens that count.
        normalizer: the global count of valid tokens (> 0).
        clip: ε; None: unclipped.
        scale: multiplies the loss (and value_loss); > 0.
    Returns:
        loss: scalar tensor.
        metrics: this microbatch's shares of global token means: value_loss, value_clip_fraction
            (share of tokens where the clipped branch is strictly the larger: no gradient there),
            value_mean.
    """
    if normalizer <= 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")
    if clip is not None and clip <= 0:
        raise ValueError(f"value clip must be > 0 or None, got {clip}")
    if scale <= 0:
        raise ValueError(f"value loss scale must be > 0, got {scale}")
    valid = mask.to(torch.bool)
    zero = torch.zeros_like(values)
    v = torch.where(valid, values, zero)
    old = torch.where(valid, old_values.detach().to(values.dtype), zero)
    target = torch.where(valid, returns.detach().to(values.dtype), zero)
    unclipped = (v - target) ** 2
    if clip is None:
        per_token = unclipped
        clipped_active = zero
    else:
        v_clipped = old + torch.clamp(v - old, -clip, clip)
        clipped = (v_clipped - target) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clipped_active = (clipped > unclipped).to(values.dtype)
    loss = scale * 0.5 * torch.where(valid, per_token, zero).sum() / normalizer
    metrics = {
        "value_loss": float(loss.detach()),
        "value_clip_fraction": float(torch.where(valid, clipped_active, zero).sum() / normalizer),
        "value_mean": float(v.detach().sum() / normalizer),
    }
    return loss, metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """How much of the returns' variance the values explain, over the valid tokens:

        EV = 1 − Var(R − V) / Var(R)        (population variances)

    1: perfect prediction; 0: no better than a constant; negative: worse than one. Defined as 0
    when Var(R) = 0 or fewer than two tokens are valid. Shapes: [B, T] x3 -> float.
    """
    valid = mask.to(torch.bool)
    r = returns.detach().to(torch.float64)[valid]
    v = values.detach().to(torch.float64)[valid]
    if r.numel() < 2:
        return 0.0
    var_r = r.var(unbiased=False)
    if var_r == 0:
        return 0.0
    return float(1.0 - (r - v).var(unbiased=False) / var_r)


def monte_carlo_explained_variance(
    returns: torch.Tensor, estimates: torch.Tensor, estimate_variances: torch.Tensor
) -> float:
    """The explained variance of the best possible critic, from Monte-Carlo value estimates.

    V*(s) = E[R | s] is what any critic can at best predict. With V̂_j a mean of K returns sampled
    from token j's state (continuations of the same prefix by the same policy), V̂_j = V*_j + ε_j
    with E[ε_j] = 0 and Var(ε_j) = σ²_j / K, and R_j (the episode's own return) independent of ε_j
    given the state, so

        E[Var(R − V̂)] ≈ Var(R − V*) + mean_j Var(ε_j)
        EV* = 1 − (Var(R − V̂) − mean_j Var(ε_j)) / Var(R)

    `estimate_variances` are unbiased estimates of Var(ε_j): s²_j / K, s²_j the sample variance
    (divisor K − 1) of token j's K returns. Population variances over the tokens, in float64; 0 when
    Var(R) = 0 or fewer than two tokens. Shapes: [N] x3 (the valid tokens) -> float.
    """
    r = returns.detach().to(torch.float64).flatten()
    v = estimates.detach().to(torch.float64).flatten()
    noise = estimate_variances.detach().to(torch.float64).flatten()
    if not (r.numel() == v.numel() == noise.numel()):
        raise ValueError(f"need one estimate per return: {r.numel()}, {v.numel()}, {noise.numel()}")
    if r.numel() < 2:
        return 0.0
    var_r = r.var(unbiased=False)
    if var_r == 0:
        return 0.0
    return float(1.0 - ((r - v).var(unbiased=False) - noise.mean()) / var_r)


def last_token_mask(mask: torch.Tensor) -> torch.Tensor:
    """[B, T] mask of each row's last valid token (an all-zero row stays zero)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), positions, torch.full_like(positions, -1)).amax(dim=1, keepdim=True)
    return ((positions == last) & mask.bool()).to(mask.dtype)
