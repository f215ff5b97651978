"""Supervised fine-tuning.

For each step: sample `global_batch_size` sequences, split them over the data-parallel
policy workers, and minimise the token-level negative log-likelihood of assistant tokens,

    L = -(1 / N) * sum_{b,t} m[b,t] * log pi(x[b,t] | x[b,<t]),   N = sum_{b,t} m[b,t],

where m masks everything but assistant tokens and N counts the whole global batch, so the
gradient does not depend on microbatching or on the number of workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from posttrain.algorithms.losses import nll_loss
from posttrain.config.supervised import SFTConfig
from posttrain.data.batching import TokenBatch, collate
from posttrain.data.sft import SFTDataset, build_sft_dataset
from posttrain.distributed.policy_group import PolicyGroup
from posttrain.logging.progress import phase, stage
from posttrain.trainers.epoch import EpochTrainer
from posttrain.trainers.loop import RunPlan, RunResult, run_loop

PLOTS = ("loss", "val/loss", "grad_norm", "lr", "tokens_per_s", "timing/step")


def sft_loss(token_logprobs: torch.Tensor, batch: TokenBatch, normalizer: float) -> tuple[torch.Tensor, dict]:
    loss = nll_loss(token_logprobs, batch.loss_mask, normalizer=normalizer)
    return loss, {"loss": loss.item()}


def validation_loss(policy: PolicyGroup, data: SFTDataset, batch_size: int, max_batches: int | None) -> float:
    """Mean NLL over the assistant tokens of the validation set (one global token mean)."""
    total, count = 0.0, 0.0
    starts = list(range(0, len(data), batch_size))[:max_batches]
    with phase("validation", total=len(starts)) as bar:
        for start in starts:
            batch = collate(data.examples[start : start + batch_size])
            lp = policy.logprobs(batch)
            total += -(lp * batch.loss_mask).sum().item()
            count += batch.loss_mask.sum().item()
            bar.advance()
    return total / max(count, 1.0)


class SFTTrainer(EpochTrainer):
    """One SFT run: its data, data order, policy workers and checkpoints (a `Trainer` of the run loop)."""

    build_dataset = staticmethod(build_sft_dataset)
    unit = "sequences"

    def __init__(self, cfg: SFTConfig) -> None:
        super().__init__(cfg, "sft", cfg.sft)
        self.policy = PolicyGroup(
            cfg.policy, cfg.cluster, model_path=self.model_path, total_steps=self.total_steps
        )
        self.plan = RunPlan(self.total_steps, cfg.sft.val_every, cfg.sft.val_at_start, PLOTS)

    def check_batch_layout(self) -> None:
        if self.loop.global_batch_size % self.workers:
            raise ValueError(
                f"sft.global_batch_size={self.loop.global_batch_size} must be a multiple of the "
                f"{self.workers} policy workers"
            )

    def train_step(self, step: int, info: Callable[[str], None]) -> dict[str, float]:
        """One optimizer step on the next `global_batch_size` sequences, its loss normalised by the
        batch's target tokens."""
        start = time.perf_counter()
        batch = collate([self.train_data.examples[i] for i in self.sampler.next_batch()])
        with stage("train"):
            out = self.policy.train(batch, sft_loss, normalizer=batch.num_target_tokens)
        elapsed = time.perf_counter() - start
        return {
            **out.loss_metrics,
            "grad_norm": out.grad_norm,
            "lr": out.lr,
            "tokens": out.num_tokens,
            "tokens_per_s": out.num_tokens / elapsed,
            "timing/step": elapsed,
            "epoch": self.sampler.epoch,
        }

    def validate(self) -> dict[str, float]:
        if self.val_data is None:
            return {}
        sft = self.cfg.sft
        return {
            "val/loss": validation_loss(self.policy, self.val_data, sft.global_batch_size, sft.val_batches)
        }


def run_sft(cfg: SFTConfig, *, stop_after: int | None = None) -> RunResult:
    """Train; `stop_after` ends this invocation after that many steps (a later call resumes)."""
    return run_loop(SFTTrainer(cfg), stop_after=stop_after)
