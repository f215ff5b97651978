"""Pure torch math: losses, advantages and metrics. Imports nothing but torch (no ray, vllm or transformers)."""

from posttrain.algorithms.losses import masked_sum, nll_loss

__all__ = ["masked_sum", "nll_loss"]
