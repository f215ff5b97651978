"""Losses as small pure functions.

Normalisation convention (NeMo RL's): a loss is a *sum* over this microbatch divided by a
`normalizer` that the caller computes over the whole global batch (all microbatches on all
data-parallel workers). Summing the per-microbatch losses then gives exactly the mean over
the global batch, so the gradient does not depend on how the batch was split.

``masked_mean`` and ``aggregate`` (token / sequence / Dr. GRPO's constant-length reduction of a
per-token quantity) are shared by the policy, distillation and value losses.
"""

from __future__ import annotations

import difflib
from typing import Literal

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_i values_i * mask_i, with mask cast to the values' dtype."""
    return (values * mask.to(values.dtype)).sum()


def nll_loss(token_logprobs: torch.Tensor, mask: torch.Tensor, *, normalizer: float) -> torch.Tensor:
    """Negative log-likelihood of the target tokens, normalised by a global token count.

        loss = -(1 / N) * sum_{b,t} mask[b,t] * log p(x[b,t+1] | x[b,<=t])

    Args:
        token_logprobs: [B, T] log-probability of each target token (0 where masked).
        mask: [B, T] 1 where the token counts (assistant tokens), 0 elsewhere.
        normalizer: N, the number of counted tokens in the GLOBAL batch (> 0).
    """
    if normalizer <= 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")
    return -masked_sum(token_logprobs, mask) / normalizer


Aggregation = Literal["token", "sequence", "seq_mean_token_sum"]
AGGREGATIONS = ("token", "sequence", "seq_mean_token_sum")


def check_choice(kind: str, value: object, choices) -> None:
    """ValueError naming the choices (and the closest one) unless ``value`` is one of them."""
    if value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown {kind} {value!r}; choose one of {list(choices)}.{hint}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1.

        masked_mean = sum(values * mask) / max(sum(mask), 1)

    Over all elements (dim=None, scalar) or along ``dim``. An all-masked slice gives 0, not NaN.
    Masked positions are zeroed with ``torch.where``, so NaN/inf there does not leak.
    """
    m = mask.to(torch.bool)
    zeroed = torch.where(m, values, torch.zeros_like(values))
    count = m.to(values.dtype)
    if dim is None:
        return zeroed.sum() / count.sum().clamp(min=1)
    return zeroed.sum(dim) / count.sum(dim).clamp(min=1)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, *, aggregation: Aggregation, normalizer: float
) -> torch.Tensor:
    """Reduce a per-token quantity [B, T] to this microbatch's share of a global mean (scalar).

        "token":              sum_{b,t} m_bt x_bt / N       N = valid tokens in the GLOBAL batch
                              (DAPO's token-level loss)
        "sequence":           sum_b [sum_t m_bt x_bt / max(sum_t m_bt, 1)] / N
                              N = sequences in the GLOBAL batch (GRPO's per-sequence token mean)
        "seq_mean_token_sum": sum_{b,t} m_bt x_bt / N       N = (sequences in the GLOBAL batch) * L
                              with L a constant (the generation length budget, max_len), so every
                              sequence's token sum is divided by the same number (Dr. GRPO,
                              arXiv:2503.20783). The sum is the same as "token"; only the caller's
                              normalizer differs.

    Masked positions are zeroed with ``torch.where`` (NaN/inf there does not leak).
    """
    check_choice("aggregation", aggregation, AGGREGATIONS)
    if normalizer <= 0:
        raise ValueError(f"normalizer must be > 0 (a global token or sequence count), got {normalizer}")
    m = mask.to(torch.bool)
    zeroed = torch.where(m, per_token, torch.zeros_like(per_token))
    if aggregation == "sequence":
        lengths = m.to(per_token.dtype).sum(-1).clamp(min=1)
        return (zeroed.sum(-1) / lengths).sum() / normalizer
    return zeroed.sum() / normalizer
