"""posttrain: post-training for language models (SFT, DPO, reward models, GRPO) on a laptop CPU or a Ray cluster."""

__version__ = "0.1.0"
