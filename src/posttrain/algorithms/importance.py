"""Importance ratios between the policies that sampled and that train: GSPO's sequence-level ratio
(``sequence_log_ratio``), the engine-mismatch corrections (``importance_weights``: plain,
truncated, ICE-POP, sequence-masked) and the ratio extremes reported as metrics.

Shapes: B sequences, T token positions; ``mask[b, t] = 1`` marks a token that counts.
"""

from __future__ import annotations

from typing import Literal

import torch

from posttrain.algorithms.losses import check_choice, masked_mean

ImportanceCorrection = Literal["plain", "truncated", "icepop", "seq_mask"]
IMPORTANCE_CORRECTIONS = (None, "plain", "truncated", "icepop", "seq_mask")


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """GSPO's length-normalised sequence log importance ratio (Zheng et al. 2025, arXiv:2507.18071).

        log s_b = (1/|y_b|) sum_t m_bt (log π_bt - log π_old_bt)

    Shapes: [B, T] x3 -> [B]. Sequences with no valid token get log s = 0.
    """
    return masked_mean(logprobs - old_logprobs, mask, dim=-1)


def importance_weights(
    old_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    correction: ImportanceCorrection,
    cap: float = 2.0,
    min_ratio: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights that correct for the inference engine's sampler differing from the trainer's π_old.

    Per valid token, w_bt = π_old(x_bt) / π_gen(x_bt) = exp(log π_old_bt - log π_gen_bt), with
    bounds [lo, hi] = [min_ratio (0 if None), cap]:

        "plain"      w as is (unbiased, unbounded variance)
        "truncated"  clamp(w, lo, hi): truncated IS (TIS; Yao et al. 2025, "Your efficient RL
                     framework secretly brings you off-policy RL training"); lo > 0 also lifts
                     tiny weights
        "icepop"     w if lo <= w <= hi, else 0: tokens whose engine and trainer disagree too
                     much are dropped (ICE-POP, Ling team 2025, "Every step evolves"; NeMo RL's
                     reference bounds 0.5 / 5)
        "seq_mask"   w (not truncated) if lo <= g_b <= hi, else 0 for the whole sequence b, with
                     g_b = exp(mean_t log w_bt) the sequence's geometric-mean ratio
                     (sequence-masked TIS; NeMo RL's reference bounds 0.999 / 1.002)

    Returns (weights, out_of_bounds), both [B, T]: the weights without gradient (0 at masked
    positions), and a bool mask of valid tokens whose ratio (for "seq_mask": whose sequence's
    ratio) lies outside [lo, hi] (all False for "plain").
    """
    check_choice("importance_correction", correction, IMPORTANCE_CORRECTIONS[1:])
    if cap <= 0:
        raise ValueError(f"importance_cap must be > 0, got {cap}")
    lo = 0.0 if min_ratio is None else min_ratio
    if lo < 0 or lo >= cap:
        raise ValueError(f"need 0 <= importance_min < importance_cap, got {min_ratio} and {cap}")
    valid = mask.to(torch.bool)
    zero = torch.zeros_like(old_logprobs)
    gen = generation_logprobs.detach().to(old_logprobs.dtype)
    log_w = torch.where(valid, old_logprobs.detach() - gen, zero)
    w = torch.where(valid, torch.exp(log_w), zero)
    if correction == "plain":
        return w, torch.zeros_like(valid)
    if correction == "seq_mask":
        geo = torch.exp(masked_mean(log_w, valid, dim=-1)).unsqueeze(-1)
        out = ((geo < lo) | (geo > cap)) & valid
    else:
        out = ((w < lo) | (w > cap)) & valid
    if correction == "truncated":
        w = torch.where(valid, w.clamp(min=lo, max=cap), zero)
    else:
        w = torch.where(out, zero, w)
    return w, out


def ratio_extremes(ratio: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """probs_ratio_min / probs_ratio_max: the smallest and largest π / π_old over the valid tokens
    (NeMo RL's names); empty when no token is valid. Merged over microbatches and ranks by min / max
    (``posttrain.algorithms.metrics.accumulate_metrics``), never summed."""
    values = ratio.detach()[valid]
    if values.numel() == 0:
        return {}
    return {"probs_ratio_min": float(values.min()), "probs_ratio_max": float(values.max())}
