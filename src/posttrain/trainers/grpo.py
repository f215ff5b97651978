"""Group Relative Policy Optimisation (and its DAPO / GSPO / Dr.GRPO / RLOO variants).

One step:
  1. sample `prompts_per_step` problems and generate G = `generations_per_prompt` answers each;
  2. score them in the environment: reward r_i (math: 1 if the \\boxed{} answer is right);
  3. advantages per group, e.g. GRPO: A_i = (r_i - mean_g r) / (std_g r + eps);
  4. maximise the clipped surrogate  min(ρ_t A, clip(ρ_t, 1-ε_low, 1+ε_high) A) - β KL(π || π_ref)
     over generated tokens, ρ_t = π(y_t|·) / π_old(y_t|·), normalised by the GLOBAL token count.
     With one update per batch π_old is the current policy (ρ = 1 in value, the on-policy
     shortcut: no extra forward pass).
Generation uses the training weights in place (colocated) or separate workers refitted after
every update (split).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from posttrain.algorithms.advantages import (
    clip_advantages,
    message_advantage_penalties,
    trainable_samples,
)
from posttrain.algorithms.dapo import overlong_filter_mask
from posttrain.algorithms.estimators import AdvantageInputs, estimate_advantages
from posttrain.algorithms.metrics import component_reward_metrics, scored_reward_metrics
from posttrain.config.loss import AdvantageConfig
from posttrain.config.rl import GRPOConfig
from posttrain.data.trajectory import Trajectory
from posttrain.distributed.actor_group import ActorGroup
from posttrain.errors import UserError
from posttrain.rollout.rollout import RLBatch, Rollouts, build_rl_batch, context_rows, flagged_turn_tokens
from posttrain.trainers.loop import RunResult, run_loop
from posttrain.trainers.rl.asynchronous import behaviour_ratio_metrics, exactly_on_policy, logprob_gap_metrics
from posttrain.trainers.rl.batch import (
    batch_stats,
    filter_logprob_errors,
    policy_updates,
    reward_kl,
    shaped_rewards,
)
from posttrain.trainers.rl.collect import collect_groups
from posttrain.trainers.rl.protocol import PolicyWorkers, RLAlgorithm
from posttrain.trainers.rl.runtime import RLRuntime

PLOTS = [
    "reward/mean",
    "env/accuracy",
    "env/solved_rate",
    "env/pass_rate",
    "env/tool_call_rate",
    "episode/turns_mean",
    "val/accuracy",
    "val/response_length",
    "pg_loss",
    "kl",
    "token_mult_prob_error",
    "gen_kl",
    "response_length",
    "timing/step",
]


def apply_message_penalties(
    adv: AdvantageConfig, advantages: torch.Tensor, mask: torch.Tensor, trajectories: list[Trajectory]
) -> tuple[torch.Tensor, dict[str, float]]:
    """advantage.invalid_tool_call_advantage / malformed_thinking_advantage on the tokens of flagged
    turns (`message_advantage_penalties`), then advantage.clip again (NeMo RL clips after them);
    with both null, the advantages as they are and no metrics. Metrics: invalid_tool_call_rate and
    malformed_thinking_rate, the shares of all assistant turns flagged (NeMo RL's names)."""
    if adv.invalid_tool_call_advantage is None and adv.malformed_thinking_advantage is None:
        return advantages, {}
    invalid, malformed = flagged_turn_tokens(trajectories, tuple(mask.shape))
    penalised = message_advantage_penalties(
        advantages, mask, invalid_tool_call=invalid, malformed_thinking=malformed,
        invalid_tool_call_advantage=adv.invalid_tool_call_advantage,
        malformed_thinking_advantage=adv.malformed_thinking_advantage,
    )  # fmt: skip
    turns = max(sum(t.num_turns for t in trajectories), 1)
    metrics = {
        "invalid_tool_call_rate": sum(sum(t.turn_invalid_tool_call) for t in trajectories) / turns,
        "malformed_thinking_rate": sum(sum(t.turn_malformed_thinking) for t in trajectories) / turns,
    }
    return clip_advantages(penalised, adv.clip, low=adv.clip_low, high=adv.clip_high), metrics


SPLIT_EPISODE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gdpo")
"""The advantage estimators that give one advantage per episode from its reward alone: the ones an
episode of several token sequences (`EnvStepResult.new_context`) can train with."""


def check_split_episodes(cfg: GRPOConfig, teacher: bool) -> None:
    """Raise UserError unless an episode of several token sequences (an environment that restarts the
    conversation) can train under `cfg`: one advantage per episode from its reward alone
    (`SPLIT_EPISODE_ESTIMATORS`), no KL in the reward, no teacher."""
    adv = cfg.advantage
    problems = []
    if adv.estimator not in SPLIT_EPISODE_ESTIMATORS:
        problems.append(f"advantage.estimator={adv.estimator!r} (use one of {SPLIT_EPISODE_ESTIMATORS})")
    if cfg.loss.kl_in_reward and cfg.loss.kl_beta > 0:
        problems.append("loss.kl_in_reward=true (a KL penalty in the loss, the default, works)")
    if teacher:
        problems.append("a teacher")
    if problems:
        raise UserError(
            "the environment restarts the conversation during an episode (new_context), so an episode is "
            "several token sequences trained with one advantage per episode; that does not work with "
            + ", ".join(problems)
        )


class GRPOTrainer(RLAlgorithm):
    """GRPO (and its variants) as an `RLAlgorithm`: the step's groups (dynamic sampling), the batch
    (shaped rewards; π_ref, π_old, the teacher's logprobs and the KL where the advantages need them;
    the advantages; the loss mask) and the clipped policy-gradient update. `GRPOTrainer(cfg)` also
    builds the runtime that runs it (`self.runtime`: workers, rollouts, refits, validation, state, loop)."""

    name = "GRPO"
    run_kind = "grpo"
    plots = PLOTS

    def __init__(self, cfg: GRPOConfig) -> None:
        self.cfg, self.loop, self.async_mode = cfg, cfg.grpo, cfg.grpo.async_mode
        self.runtime = RLRuntime(cfg, self)
        self.tokenizer, self.teacher = self.runtime.tokenizer, self.runtime.teacher

    # ---------------------------------------------------------------- what the runtime builds
    def policy_workers(self, model_path: str) -> PolicyWorkers:
        """Plain policy workers; π_ref with a KL penalty; max_steps × updates_per_batch optimizer steps."""
        steps = self.loop.max_steps * self.loop.updates_per_batch
        return PolicyWorkers(ActorGroup, steps, reference=self.cfg.loss.kl_beta > 0)

    # ---------------------------------------------------------------- phases
    def collect(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """Rollouts for one step; with dynamic sampling, only groups whose rewards differ, refilled
        (see ``collect_groups``: a batch still short after max_generation_rounds trains on what was
        kept; empty trajectories mean: skip this step's update)."""
        g, dapo = self.loop, self.cfg.dapo
        workers = self.cfg.cluster.policy_workers()
        return collect_groups(
            functools.partial(self.runtime.draw, step),
            groups=g.prompts_per_step,
            group_size=g.generations_per_prompt,
            dynamic_sampling=dapo.dynamic_sampling,
            max_rounds=dapo.max_generation_rounds,
            unit=g.updates_per_batch * workers if workers > 1 else 1,
        )

    def needs_old(self, batch: RLBatch) -> bool:
        """Whether the batch needs π_old's logprobs. Skipped (the on-policy shortcut: the current
        policy is π_old) only for one update on a batch that is exactly on-policy, every row sampled by
        the current weights version (`exactly_on_policy`), and without loss.seq_logprob_error_threshold
        (which measures the engine against π_old before training)."""
        on_policy = exactly_on_policy(batch.policy_versions, self.runtime.policy_version)
        threshold = self.cfg.loss.seq_logprob_error_threshold is not None
        return self.loop.updates_per_batch > 1 or not on_policy or threshold

    def add_logprobs(self, batch: RLBatch) -> None:
        """π_ref's logprobs (KL penalty) and π_old's (`needs_old`), unless present."""
        batch.reference_logprobs, batch.old_logprobs = self.runtime.policy_logprobs(
            batch, reference=self.cfg.loss.kl_beta > 0, old=self.needs_old(batch)
        )

    def teacher_logprobs(self, batch: RLBatch) -> torch.Tensor:
        """[N, T] the teacher's log-probability of every generated token (0 elsewhere); only the
        sampled token's value travels (top-1 of the teacher's payload is ignored)."""
        with self.runtime.timer("teacher"):
            scores = self.teacher.topk(batch, 1, self.cfg.advantage.teacher_temperature)
        selected = batch.loss_mask.bool().clone()
        selected[:, 0] = False
        out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
        out[selected] = scores.sampled_logprob.float()
        return out

    def make_batch(self, rollouts: Rollouts) -> tuple[RLBatch, dict[str, float]]:
        """The training batch, built once: first the logprobs the advantages need (π_ref and π_old
        for loss.kl_in_reward, the teacher's and the student's for on_policy_distill; π_old is the
        trainer's when the batch gets several updates, else the sampler's: the same distribution), the
        KL and the advantages; then the loss mask (unscored and lone samples out, the overlong filter).

        An episode whose environment restarted the conversation (`EnvStepResult.new_context`) is
        several token sequences: each is a row of the batch with its episode's advantage, the
        advantages computed over episodes (`context_rows`, `check_split_episodes`)."""
        cfg, loss = self.cfg, self.cfg.loss
        rows, episode_of = context_rows(rollouts.trajectories)
        split = len(rows) != len(rollouts.trajectories)
        if split:
            check_split_episodes(cfg, self.teacher is not None)
        rewards = shaped_rewards(cfg, rollouts)
        tokens = build_rl_batch(rows, None, self.tokenizer.pad_token_id)
        metrics: dict[str, float] = {}
        kl = teacher_lp = student_lp = None
        kl_reward = loss.kl_in_reward and loss.kl_beta > 0
        if kl_reward or self.teacher is not None:
            self.add_logprobs(tokens)
        policy_lp = tokens.old_logprobs if tokens.old_logprobs is not None else tokens.generation_logprobs
        if kl_reward:
            kl = reward_kl(loss, tokens)
            metrics["reward/kl_penalty"] = float(loss.kl_beta * kl.sum(-1).mean())
        if self.teacher is not None:
            teacher_lp, student_lp = self.teacher_logprobs(tokens), policy_lp
            m = tokens.loss_mask
            count = m.sum().clamp(min=1)
            metrics["distill/teacher_logprob"] = float((teacher_lp * m).sum() / count)
            metrics["distill/reverse_kl"] = float(((student_lp - teacher_lp) * m).sum() / count)
        components = rollouts.reward_components() if cfg.advantage.estimator == "gdpo" else None
        if components is not None:
            metrics.update(component_reward_metrics(*components, rollouts.scored))
        names, matrix = components if components is not None else ((), None)
        inputs = AdvantageInputs(
            rewards, rollouts.group_ids, mask=None if split else tokens.loss_mask, scored=rollouts.scored,
            kl=kl, kl_beta=loss.kl_beta, teacher_logprobs=teacher_lp, student_logprobs=student_lp,
            components=matrix, component_names=tuple(names),
        )  # fmt: skip
        advantages = estimate_advantages(cfg.advantage, inputs)[episode_of]
        advantages, penalty_metrics = apply_message_penalties(
            cfg.advantage, advantages, tokens.loss_mask, rows
        )
        metrics.update(penalty_metrics)
        mask = tokens.loss_mask
        if cfg.advantage.estimator != "on_policy_distill":  # the teacher's signal needs no group
            mask = mask * trainable_samples(rollouts.group_ids, rollouts.scored)[episode_of].float()[:, None]
        if cfg.dapo.overlong_filter:
            mask = mask * overlong_filter_mask(rollouts.truncated)[episode_of].float()[:, None]
        batch = dataclasses.replace(tokens, advantages=advantages, loss_mask=mask)
        metrics.update(scored_reward_metrics(rewards, rollouts.scored))
        metrics.update(batch_stats(rollouts, mask, batch.generation_logprobs))
        return batch, metrics

    def train_on(self, batch: RLBatch) -> dict[str, float]:
        """`updates_per_batch` optimizer steps over contiguous minibatches of the rollout batch; metrics
        (the gradient norm included) are means over them, the learning rate the last one's. π_old
        and π_ref join the batch first where only the loss needs them."""
        cfg = self.cfg
        self.add_logprobs(batch)
        metrics = filter_logprob_errors(cfg.loss.seq_logprob_error_threshold, batch)
        minibatches = batch.chunks(self.loop.updates_per_batch)
        with self.runtime.timer("training"):
            metrics.update(policy_updates(self.runtime.policy, cfg, minibatches, len(minibatches)))
        if self.async_mode:
            metrics.update(
                behaviour_ratio_metrics(batch, cfg.loss.importance_min or 0.0, cfg.loss.importance_cap)
            )
            metrics = logprob_gap_metrics(metrics, batch, self.runtime.policy_version)  # π_old's version
        metrics.update(self.runtime.policy_updated())
        return metrics


def run_grpo(cfg: GRPOConfig, *, stop_after: int | None = None) -> RunResult:
    """Train; `stop_after` ends this invocation after that many steps (a later call resumes)."""
    return run_loop(GRPOTrainer(cfg).runtime, stop_after=stop_after)
