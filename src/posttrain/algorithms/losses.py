"""Losses as small pure functions.

Normalisation convention (NeMo RL's): a loss is a *sum* over this microbatch divided by a
`normalizer` that the caller computes over the whole global batch (all microbatches on all
data-parallel workers). Summing the per-microbatch losses then gives exactly the mean over
the global batch, so the gradient does not depend on how the batch was split.
"""

from __future__ import annotations

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
