"""REINFORCE with a moving-average baseline (REINFORCE-MA): the smallest sibling behind `RLAlgorithm`.

One step:
  1. sample `prompts_per_step` tasks and `generations_per_prompt` episodes each (1 is enough: the
     baseline spans batches, not groups);
  2. the environment scores them: reward r_i;
  3. advantages A_i = r_i - b, b the moving average of past batches' mean rewards (the first batch:
     its own mean); then b <- m·b + (1 - m)·mean(r), m = `reinforce_ma.baseline_momentum`;
  4. GRPO's clipped surrogate (`grpo_loss`, every loss.* knob) over the generated tokens.
Unscored samples are out of the loss and of mean(r). b is saved in every checkpoint (reinforce_ma.json)
and restored on resume. The rest (workers, rollouts, refits, validation, state, the loop) is the RL
runtime's (`posttrain.trainers.rl.runtime`). docs/architecture.md: "Add an RL algorithm in one file".
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from posttrain.algorithms.advantages import baseline_advantages, moving_average_baseline
from posttrain.algorithms.metrics import scored_reward_metrics
from posttrain.config.reinforce_ma import ReinforceMAConfig
from posttrain.distributed.actor_group import ActorGroup
from posttrain.rollout.rollout import RLBatch, Rollouts, build_rl_batch
from posttrain.trainers.loop import RunResult, run_loop
from posttrain.trainers.rl.batch import batch_stats, filter_logprob_errors, policy_updates
from posttrain.trainers.rl.protocol import PolicyWorkers, RLAlgorithm
from posttrain.trainers.rl.runtime import RLRuntime

STATE_FILE = "reinforce_ma.json"


class ReinforceMATrainer(RLAlgorithm):
    """REINFORCE-MA as an `RLAlgorithm` (the protocol's defaults: synchronous, no teacher, no workers
    of its own); `ReinforceMATrainer(cfg).runtime` runs it. `baseline` is b (None before the first batch)."""

    name = "REINFORCE-MA"
    run_kind = "reinforce_ma"
    plots = [
        "reward/mean",
        "reinforce_ma/baseline",
        "val/accuracy",
        "val/response_length",
        "pg_loss",
        "response_length",
    ]

    def __init__(self, cfg: ReinforceMAConfig) -> None:
        self.cfg, self.loop = cfg, cfg.reinforce_ma
        self.baseline: float | None = None
        self.runtime = RLRuntime(cfg, self)

    def policy_workers(self, model_path: str) -> PolicyWorkers:
        """Plain policy workers; π_ref with a KL penalty (loss.kl_beta > 0)."""
        steps = self.loop.max_steps * self.loop.updates_per_batch
        return PolicyWorkers(ActorGroup, steps, reference=self.cfg.loss.kl_beta > 0)

    def describe(self) -> str:
        return f"baseline momentum {self.loop.baseline_momentum}; "

    def save_state(self, directory: Path) -> None:
        (directory / STATE_FILE).write_text(json.dumps({"baseline": self.baseline}))

    def load_state(self, directory: Path, step: int) -> None:
        self.baseline = json.loads((directory / STATE_FILE).read_text())["baseline"]

    def collect(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        return self.runtime.draw(step), {}

    def make_batch(self, rollouts: Rollouts) -> tuple[RLBatch, dict[str, float]]:
        """A = r - b on the batch, then b moves (metrics: reinforce_ma/advantage_mean over the scored
        samples, reinforce_ma/baseline after the move, what a checkpoint now holds)."""
        rewards, scored = rollouts.rewards, rollouts.scored
        advantages = baseline_advantages(rewards, self.baseline, scored=scored)
        self.baseline = moving_average_baseline(
            self.baseline, rewards, momentum=self.loop.baseline_momentum, scored=scored
        )
        tokens = build_rl_batch(rollouts.trajectories, None, self.runtime.tokenizer.pad_token_id)
        batch = dataclasses.replace(tokens, advantages=advantages.float())  # unscored: out of loss_mask
        metrics = {
            **scored_reward_metrics(rewards, scored),
            **batch_stats(rollouts, batch.loss_mask, batch.generation_logprobs),
            "reinforce_ma/advantage_mean": float(advantages[scored].mean()) if scored.any() else 0.0,
        }
        if self.baseline is not None:
            metrics["reinforce_ma/baseline"] = self.baseline
        return batch, metrics

    def train_on(self, batch: RLBatch) -> dict[str, float]:
        """`updates_per_batch` optimizer steps on contiguous minibatches (π_old computed when there
        are several, or for loss.seq_logprob_error_threshold); metrics are means over them."""
        loss, updates = self.cfg.loss, self.loop.updates_per_batch
        old = updates > 1 or loss.seq_logprob_error_threshold is not None
        batch.reference_logprobs, batch.old_logprobs = self.runtime.policy_logprobs(
            batch, reference=loss.kl_beta > 0, old=old
        )
        metrics = filter_logprob_errors(loss.seq_logprob_error_threshold, batch)
        minibatches = batch.chunks(updates)
        with self.runtime.timer("training"):
            metrics.update(policy_updates(self.runtime.policy, self.cfg, minibatches, len(minibatches)))
        return {**metrics, **self.runtime.policy_updated()}


def run_reinforce_ma(cfg: ReinforceMAConfig, *, stop_after: int | None = None) -> RunResult:
    """Train; `stop_after` ends this invocation after that many steps (a later call resumes)."""
    return run_loop(ReinforceMATrainer(cfg).runtime, stop_after=stop_after)
