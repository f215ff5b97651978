"""Supervised fine-tuning.

For each step: sample `global_batch_size` sequences, split them over the data-parallel
policy workers, and minimise the token-level negative log-likelihood of assistant tokens,

    L = -(1 / N) * sum_{b,t} m[b,t] * log pi(x[b,t] | x[b,<t]),   N = sum_{b,t} m[b,t],

where m masks everything but assistant tokens and N counts the whole global batch, so the
gradient does not depend on microbatching or on the number of workers.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from pathlib import Path

import torch

from posttrain.algorithms.losses import nll_loss
from posttrain.config.common import DatasetConfig
from posttrain.config.supervised import SFTConfig
from posttrain.data.batching import EpochSampler, TokenBatch, collate
from posttrain.data.sft import SFTDataset, build_sft_dataset
from posttrain.distributed.policy_group import PolicyGroup
from posttrain.logging.progress import phase, stage
from posttrain.modeling.tokenizer import training_tokenizer
from posttrain.trainers.common import (
    epochs_notice,
    load_controller_state,
    make_checkpointer,
    prepare_run_dir,
    seed_everything,
    write_policy_checkpoint,
)
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


class SFTTrainer:
    """One SFT run: its data, data order, policy workers and checkpoints (a `Trainer` of the run loop)."""

    def __init__(self, cfg: SFTConfig) -> None:
        from posttrain.models.hub import resolve_model

        model_path = resolve_model(cfg.policy.model_name)  # a missing model fails before the run dir exists
        self.cfg = cfg
        self.run_dir = prepare_run_dir(cfg.logging.run_dir, "sft", cfg)
        seed_everything(cfg.sft.seed)
        self.tokenizer, _ = training_tokenizer(
            cfg.policy.tokenizer_name or model_path,
            cfg.policy.chat_template,
            self.run_dir,
            "policy.chat_template",
        )
        self.train_data = self._dataset(cfg.data.train)
        self.val_data = self._dataset(cfg.data.validation) if cfg.data.validation else None
        self.sampler = EpochSampler(len(self.train_data), cfg.sft.global_batch_size, seed=cfg.sft.seed)
        total_steps = self.sampler.batches_per_epoch * cfg.sft.num_epochs
        if cfg.sft.max_steps:
            total_steps = min(total_steps, cfg.sft.max_steps)
        self.plan = RunPlan(total_steps, cfg.sft.val_every, cfg.sft.val_at_start, PLOTS)
        self.workers = cfg.cluster.policy_workers()
        if cfg.sft.global_batch_size % self.workers:
            raise ValueError(
                f"sft.global_batch_size={cfg.sft.global_batch_size} must be a multiple of the "
                f"{self.workers} policy workers"
            )
        self.checkpointer = make_checkpointer(self.run_dir / "checkpoints", cfg.checkpoint)
        self.policy = PolicyGroup(cfg.policy, cfg.cluster, model_path=model_path, total_steps=total_steps)

    def _dataset(self, data_cfg: DatasetConfig) -> SFTDataset:
        cfg = self.cfg
        return build_sft_dataset(
            data_cfg, self.tokenizer, max_seq_len=cfg.policy.max_seq_len, overlong=cfg.data.overlong
        )

    def describe(self) -> list[str]:
        t, v, cfg = self.train_data, self.val_data, self.cfg
        notice = epochs_notice(
            "sft", cfg.sft.max_steps, cfg.sft.num_epochs, self.sampler.batches_per_epoch, len(t)
        )
        return [
            f"SFT: {len(t)} train sequences ({t.num_truncated} truncated, {t.num_dropped} dropped at "
            f"max_seq_len={cfg.policy.max_seq_len}), {len(v) if v else 0} validation; "
            f"{self.plan.total_steps} steps on {self.workers} worker(s); run dir {self.run_dir}",
            *([notice] if notice else []),
        ]

    def restore(self, checkpoint: Path | None) -> int:
        if checkpoint is None:
            return 0
        self.policy.load_checkpoint(checkpoint)
        state = load_controller_state(checkpoint)
        self.sampler.load_state_dict(state["sampler"])
        return state["step"]

    def running(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

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

    def save(self, step: int, metrics: dict[str, float]) -> Path:
        state = {"sampler": self.sampler.state_dict()}
        write = functools.partial(
            write_policy_checkpoint,
            step=step,
            policy=self.policy,
            tokenizer=self.tokenizer,
            state=state,
            config=self.cfg,
        )
        return self.checkpointer.save(step, write, metrics=metrics)

    def shutdown(self) -> None:
        self.policy.shutdown()


def run_sft(cfg: SFTConfig, *, stop_after: int | None = None) -> RunResult:
    """Train; `stop_after` ends this invocation after that many steps (a later call resumes)."""
    return run_loop(SFTTrainer(cfg), stop_after=stop_after)
