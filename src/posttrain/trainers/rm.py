"""Reward-model training: a scalar head on a language model, fitted to preference pairs (Bradley–Terry).

For each step: sample `global_batch_size` pairs (x, y_w, y_l), score both sequences with the reward
model r (the head read at each sequence's last token) and take one optimizer step on

    L = -(1 / P) Σ_pairs log σ(r(x, y_w) - r(x, y_l)),

P the pairs of the global batch (split-invariant). Logged: loss, accuracy 1[r_w > r_l], margin
r_w - r_l, mean chosen and rejected rewards. A checkpoint's `model/` folder is a transformers
`AutoModelForSequenceClassification` (num_labels=1) with its tokenizer, usable by the
`reward_model` GRPO environment.
"""

from __future__ import annotations

import torch

from posttrain.algorithms.preference import bradley_terry_loss, preference_accuracy_and_margin
from posttrain.config.supervised import RMConfig
from posttrain.data.preference import PreferenceBatch
from posttrain.distributed.policy_group import PolicyGroup
from posttrain.models.reward_model import RewardPolicy
from posttrain.trainers.loop import RunResult, run_loop
from posttrain.trainers.preference import PreferenceTrainer


def rm_loss(
    scores: torch.Tensor, batch: PreferenceBatch, normalizer: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """This microbatch's share of the global Bradley–Terry loss and metrics; `scores` is [2P] interleaved."""
    chosen, rejected = scores[0::2], scores[1::2]
    loss = bradley_terry_loss(chosen, rejected).sum() / normalizer
    accuracy, margin = preference_accuracy_and_margin(chosen.detach(), rejected.detach())
    return loss, {
        "loss": float(loss.detach()),
        "accuracy": float(accuracy.sum() / normalizer),
        "margin": float(margin.sum() / normalizer),
        "rewards/chosen": float(chosen.detach().sum() / normalizer),
        "rewards/rejected": float(rejected.detach().sum() / normalizer),
    }


class RewardModelGroup(PolicyGroup):
    """Data-parallel `RewardPolicy` ranks."""

    worker_cls = RewardPolicy

    def scores(self, batch: PreferenceBatch) -> torch.Tensor:
        """[B] scores, the batch split over ranks."""
        chunks = batch.chunks(self.world_size)
        return torch.cat(self.workers.run(RewardPolicy.scores, [(chunk,) for chunk in chunks]))


class RewardModel:
    """The reward-model objective of a `PreferenceTrainer`: a scalar head fitted by Bradley–Terry."""

    plots = ("loss", "accuracy", "margin", "val/accuracy", "val/margin", "val/loss")

    def __init__(self, run: PreferenceTrainer) -> None:
        self.policy = RewardModelGroup(
            run.cfg.policy,
            run.cfg.cluster,
            model_path=run.model_path,
            total_steps=run.total_steps,
            pad_token_id=run.pad_id,
        )

    def train_step(self, batch: PreferenceBatch) -> dict[str, float]:
        out = self.policy.train(batch, rm_loss, float(batch.num_pairs))
        return {**out.loss_metrics, "grad_norm": out.grad_norm, "lr": out.lr, "tokens": out.num_tokens}

    def validation_sums(self, k: int, batch: PreferenceBatch) -> dict[str, float]:
        """Held-out Bradley–Terry loss, accuracy and margin, summed over the batch's pairs."""
        _, metrics = rm_loss(self.policy.scores(batch), batch, 1.0)
        return {name: metrics[name] for name in ("loss", "accuracy", "margin")}


def run_rm(cfg: RMConfig, *, stop_after: int | None = None) -> RunResult:
    """Train; `stop_after` ends this invocation after that many steps (a later call resumes)."""
    return run_loop(PreferenceTrainer(cfg, "rm", cfg.rm, RewardModel), stop_after=stop_after)
