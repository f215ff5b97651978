"""Direct Preference Optimisation (Rafailov et al. 2023), with IPO and conservative DPO as options.

For each step: sample `global_batch_size` pairs (x, y_w, y_l); score both responses once with the
frozen reference policy π_ref; then take one optimizer step on

    L = w_p (1 / P) Σ_pairs ℓ(h) + λ · NLL(y_w),   h = (log π - log π_ref)(y_w) - (log π - log π_ref)(y_l)

with ℓ(h) = -log σ(β h) (DPO; label-smoothed with ε), or (h - 1/(2β))² (IPO); log π summed (or
length-averaged) over response tokens. P counts the global batch's pairs and the NLL is per chosen
token of the global batch (dpo.sft_normalization=token; sum / average: per pair, NeMo RL's two
modes), so the step does not depend on microbatching or data parallelism. w_p:
dpo.preference_loss_weight.
Implicit rewards r = β (log π - log π_ref) give the logged accuracy and margin.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from posttrain.algorithms.preference import (
    PREFERENCE_LOSSES,
    chosen_nll,
    preference_accuracy_and_margin,
    preference_logits,
    sequence_logprobs,
)
from posttrain.config.supervised import DPOConfig, PreferenceTrainerConfig
from posttrain.data.preference import PreferenceBatch
from posttrain.distributed.actor_group import ActorGroup
from posttrain.trainers.loop import RunResult, run_loop
from posttrain.trainers.preference import PreferenceTrainer


def dpo_loss(
    token_logprobs: torch.Tensor,
    batch: PreferenceBatch,
    normalizer: float,
    *,
    loss_type: str,
    beta: float,
    label_smoothing: float,
    average_logprobs: bool,
    sft_weight: float,
    chosen_tokens: float,
    preference_loss_weight: float = 1.0,
    sft_normalization: str = "token",
) -> tuple[torch.Tensor, dict[str, float]]:
    """This microbatch's share of the global DPO loss and metrics (`normalizer` = pairs in the global batch)."""
    seq = sequence_logprobs(token_logprobs, batch.loss_mask, average=average_logprobs)
    ref = batch.reference_logps.to(seq.device, seq.dtype)
    h = preference_logits(seq[0::2], seq[1::2], ref[0::2], ref[1::2])
    pair_losses = PREFERENCE_LOSSES[loss_type](h, beta=beta, label_smoothing=label_smoothing)
    preference_loss = pair_losses.sum() / normalizer
    loss = preference_loss_weight * preference_loss
    chosen_reward = beta * (seq[0::2] - ref[0::2]).detach()
    rejected_reward = beta * (seq[1::2] - ref[1::2]).detach()
    accuracy, margin = preference_accuracy_and_margin(chosen_reward, rejected_reward)
    metrics = {
        "preference_loss": float(preference_loss.detach()),
        "rewards/chosen": float(chosen_reward.sum() / normalizer),
        "rewards/rejected": float(rejected_reward.sum() / normalizer),
        "rewards/accuracy": float(accuracy.sum() / normalizer),
        "rewards/margin": float(margin.sum() / normalizer),
        "logps/chosen": float(seq[0::2].detach().sum() / normalizer),
        "logps/rejected": float(seq[1::2].detach().sum() / normalizer),
    }
    if sft_weight:
        nll = chosen_nll(
            token_logprobs[0::2], batch.loss_mask[0::2], normalization=sft_normalization,
            tokens=chosen_tokens, pairs=normalizer,
        )  # fmt: skip
        loss = loss + sft_weight * nll
        metrics["sft_nll"] = float(nll.detach())
    metrics["loss"] = float(loss.detach())
    return loss, metrics


class DPO:
    """The DPO objective of a `PreferenceTrainer`: an actor group with the frozen reference policy."""

    plots = (
        "loss",
        "rewards/accuracy",
        "rewards/margin",
        "val/preference_accuracy",
        "val/reward_accuracy",
        "val/loss",
    )

    def __init__(self, run: PreferenceTrainer) -> None:
        self.loop = run.cfg.dpo
        self.policy = ActorGroup(
            run.cfg.policy,
            run.cfg.cluster,
            model_path=run.model_path,
            total_steps=run.total_steps,
            tokenizer_path=run.tokenizer_path,
            reference=True,
        )
        self._val_reference: dict[int, torch.Tensor] = {}

    def reference_sequence_logprobs(self, batch: PreferenceBatch) -> torch.Tensor:
        """[2P] sequence log-probabilities of the responses under the frozen reference policy."""
        token_lp = self.policy.reference_logprobs(batch)
        return sequence_logprobs(token_lp, batch.loss_mask, average=self.loop.average_logprobs)

    def loss_fn(self, batch: PreferenceBatch) -> Any:
        knobs = self.loop.model_dump(exclude=set(PreferenceTrainerConfig.model_fields))  # the loss's knobs
        chosen_tokens = max(1.0, float(batch.loss_mask[0::2].sum()))
        return functools.partial(dpo_loss, chosen_tokens=chosen_tokens, **knobs)

    def train_step(self, batch: PreferenceBatch) -> dict[str, float]:
        batch.reference_logps = self.reference_sequence_logprobs(batch)
        out = self.policy.train(batch, self.loss_fn(batch), float(batch.num_pairs))
        return {**out.loss_metrics, "grad_norm": out.grad_norm, "lr": out.lr, "tokens": out.num_tokens}

    def validation_sums(self, k: int, batch: PreferenceBatch) -> dict[str, float]:
        """Held-out loss (the preference term), implicit-reward accuracy and margin, and whether π
        prefers the chosen (likelihood), summed over the batch's pairs."""
        if k not in self._val_reference:  # the reference is frozen: score the held-out set once
            self._val_reference[k] = self.reference_sequence_logprobs(batch)
        batch.reference_logps = self._val_reference[k]
        token_lp = self.policy.logprobs(batch)
        _, metrics = self.loss_fn(batch)(token_lp, batch, 1.0)
        seq = sequence_logprobs(token_lp, batch.loss_mask, average=self.loop.average_logprobs)
        likelihood_accuracy, _ = preference_accuracy_and_margin(seq[0::2], seq[1::2])
        return {
            "loss": metrics["preference_loss"],
            "reward_accuracy": metrics["rewards/accuracy"],
            "reward_margin": metrics["rewards/margin"],
            "preference_accuracy": float(likelihood_accuracy.sum()),
        }


def run_dpo(cfg: DPOConfig, *, stop_after: int | None = None) -> RunResult:
    """Train; `stop_after` ends this invocation after that many steps (a later call resumes)."""
    return run_loop(PreferenceTrainer(cfg, "dpo", cfg.dpo, DPO), stop_after=stop_after)
