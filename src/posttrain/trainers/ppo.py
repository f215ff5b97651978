"""PPO with a learned critic and generalised advantage estimation (GAE).

One step:
  1. sample `prompts_per_step` tasks and G = `generations_per_prompt` episodes each (G = 1 by
     default: the critic is the baseline), with GRPO's rollouts (any environment, several turns);
  2. per-token rewards: each turn's environment reward on that turn's last assistant token (reward
     shaping of the episode's total on its last one), minus β KL_t with `loss.kl_in_reward`;
     observation and prompt tokens get none;
  3. the critic's values V(s_t) of the batch; GAE over the assistant tokens (observation tokens
     skipped): λ_critic gives the value targets R = A + V, λ_actor (or VAPO's length-adaptive λ)
     the policy's advantages, whitened over the batch's assistant tokens;
  4. passes over the batch in `updates_per_batch` minibatches: the critic minimises the clipped
     value loss for `critic_epochs` passes (default `ppo_epochs`), on this batch and the last
     `critic_replay_batches` ones (value replay); after `critic_warmup_steps` steps the policy also
     minimises the clipped surrogate for `ppo_epochs` passes over this batch (GRPO's `grpo_loss`
     with per-token advantages, all of `loss.*`). advantage.estimator=raw_reward: A = the episode
     reward on every assistant token instead of GAE (the critic still trains).
Everything else (generation, refits, validation, checkpoints, the loop) is the RL runtime's
(`posttrain.trainers.rl.runtime`); PPOTrainer is GRPOTrainer's sibling, not its subclass.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posttrain.algorithms.dapo import overlong_filter_mask
from posttrain.algorithms.estimators import AdvantageInputs, advantage_estimator, finish_advantages
from posttrain.algorithms.gae import gae_advantages, length_adaptive_lambda, token_rewards
from posttrain.algorithms.metrics import scored_reward_metrics
from posttrain.algorithms.value_loss import clipped_value_loss, explained_variance, last_token_mask
from posttrain.config.ppo import PPOConfig
from posttrain.data.batching import concat_batches
from posttrain.distributed.critic_group import (
    ColocatedCritic,
    PPOActorGroup,
    SplitCritic,
    split_critic_cluster,
)
from posttrain.rollout.rollout import RLBatch, Rollouts, build_rl_batch
from posttrain.trainers.loop import RunResult, run_loop
from posttrain.trainers.rl.batch import (
    add_mean,
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
    "val/accuracy",
    "val/response_length",
    "critic/explained_variance",
    "critic/value_loss",
    "returns/mean",
    "pg_loss",
    "response_length",
    "timing/step",
]


@dataclass
class PPOBatch(RLBatch):
    """An RL batch with the critic's side, per token [B, T]: `values` V(s_t) when the batch was
    collected (the clipped value loss's V_old) and `returns`, the value targets."""

    values: torch.Tensor | None = None
    returns: torch.Tensor | None = None


def value_loss_fn(
    values: torch.Tensor, batch: PPOBatch, normalizer: float, *, clip: float | None, scale: float = 1.0
) -> tuple[torch.Tensor, dict[str, float]]:
    """The critic's loss on a microbatch (`clipped_value_loss`, normalised by the global token count,
    times `scale`: critic.value_loss_scale)."""
    return clipped_value_loss(
        values, batch.values, batch.returns, batch.loss_mask, normalizer=normalizer, clip=clip, scale=scale
    )


def value_targets(batch: PPOBatch) -> PPOBatch:
    """The critic's side of a batch: its tokens, masks, `values` and `returns` (nothing of the policy's)."""
    return PPOBatch(
        batch.input_ids, batch.attention_mask, batch.loss_mask, values=batch.values, returns=batch.returns
    )


def masked_stats(x: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(mean, population std) of x over mask = 1 (0, 0 when empty)."""
    selected = x.detach().double()[mask.bool()]
    if selected.numel() == 0:
        return 0.0, 0.0
    return float(selected.mean()), float(selected.std(unbiased=False))


class PPOTrainer(RLAlgorithm):
    """PPO as an `RLAlgorithm`: a critic beside the policy (held by its workers, or workers of its
    own), a batch with per-token rewards, values, GAE returns and advantages, and updates of both.
    `PPOTrainer(cfg)` builds the runtime that runs it (`self.runtime`) and then the critic."""

    name = "PPO"
    run_kind = "ppo"
    plots = PLOTS

    def __init__(self, cfg: PPOConfig) -> None:
        self.cfg, self.loop = cfg, cfg.ppo
        self.current_step = 0
        # value replay: the critic's side of the last `ppo.critic_replay_batches` batches (returns, no values)
        self.value_replay: collections.deque[PPOBatch] = collections.deque(
            maxlen=cfg.ppo.critic_replay_batches
        )
        self.runtime = RLRuntime(cfg, self)
        self.tokenizer = self.runtime.tokenizer
        self.critic: SplitCritic | ColocatedCritic = (
            ColocatedCritic(self.runtime.policy)  # type: ignore[arg-type]
            if cfg.critic.placement == "colocated"
            else SplitCritic(
                cfg.critic.policy_config(cfg.policy),
                split_critic_cluster(
                    cfg.cluster,
                    num_workers=cfg.critic.num_workers,
                    cpus_per_worker=cfg.critic.cpus_per_worker,
                ),
                **self.critic_kwargs(),
            )
        )

    # ---------------------------------------------------------------- what the runtime builds
    def policy_workers(self, model_path: str) -> PolicyWorkers:
        """PPO's workers (colocated: every policy worker builds and holds a critic rank); π_ref with a
        KL penalty; the policy steps after the critic's warm-up."""
        p = self.cfg.ppo
        steps = max(1, (p.max_steps - p.critic_warmup_steps) * p.ppo_epochs * p.updates_per_batch)
        kwargs = {}
        if self.cfg.critic.placement == "colocated":
            critic = {"cfg": self.cfg.critic.policy_config(self.cfg.policy), **self.critic_kwargs(model_path)}
            kwargs = {"critic": critic}
        return PolicyWorkers(PPOActorGroup, steps, reference=self.cfg.loss.kl_beta > 0, kwargs=kwargs)

    def critic_kwargs(self, model_path: str | None = None) -> dict[str, Any]:
        """The critic's model (critic.model_name, else the policy's: `model_path`, default the
        runtime's) and scheduler length (optimizer steps over the whole run)."""
        from posttrain.models.hub import resolve_model

        cfg = self.cfg
        policy_model = model_path or self.runtime.model_path
        model = resolve_model(cfg.critic.model_name) if cfg.critic.model_name else policy_model
        updates = self.critic_epochs() * cfg.ppo.updates_per_batch * (1 + cfg.ppo.critic_replay_batches)
        return {"model_path": model, "total_steps": cfg.ppo.max_steps * updates}

    def critic_epochs(self) -> int:
        """The critic's passes over each batch: `ppo.critic_epochs`, else `ppo.ppo_epochs`."""
        return self.cfg.ppo.critic_epochs or self.cfg.ppo.ppo_epochs

    # ---------------------------------------------------------------- phases
    def collect(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """One round of rollouts (no dynamic sampling: the critic is the baseline)."""
        self.current_step = step
        p = self.cfg.ppo
        rollouts, stats = collect_groups(
            functools.partial(self.runtime.draw, step),
            groups=p.prompts_per_step,
            group_size=p.generations_per_prompt,
            dynamic_sampling=False,
            max_rounds=1,
        )
        if p.generations_per_prompt == 1:
            stats.pop("reward/zero_variance_fraction", None)  # every group of one has no spread
        return rollouts, stats

    def add_logprobs(self, batch: RLBatch) -> None:
        """π_ref's logprobs (KL penalty) and π_old's (when the batch gets several policy updates, or
        for loss.seq_logprob_error_threshold), unless present."""
        p, loss = self.cfg.ppo, self.cfg.loss
        needs_old = p.ppo_epochs * p.updates_per_batch > 1 or loss.seq_logprob_error_threshold is not None
        batch.reference_logprobs, batch.old_logprobs = self.runtime.policy_logprobs(
            batch, reference=loss.kl_beta > 0, old=needs_old
        )

    def token_kl(self, batch: RLBatch) -> torch.Tensor | None:
        """[B, T] KL(π_old || π_ref) estimates on assistant tokens for the KL reward, else None."""
        loss = self.cfg.loss
        if not (loss.kl_in_reward and loss.kl_beta > 0):
            return None
        self.add_logprobs(batch)
        return reward_kl(loss, batch)

    def make_batch(self, rollouts: Rollouts) -> tuple[PPOBatch, dict[str, float]]:
        """The batch, built once after its parts: per-token rewards (the KL reward's logprobs first),
        the critic's values, GAE returns and (whitened) advantages."""
        cfg, adv = self.cfg, self.cfg.advantage
        rewards = shaped_rewards(cfg, rollouts)  # scaled + overlong-shaped episode totals
        trajectories = rollouts.trajectories
        tokens = build_rl_batch(trajectories, None, self.tokenizer.pad_token_id)
        mask = tokens.loss_mask
        kl = self.token_kl(tokens)
        env_totals = torch.tensor([sum(t.turn_rewards) for t in trajectories], dtype=torch.float64)
        per_token = token_rewards(
            [t.turn_rewards for t in trajectories],
            [[end for _, end in t.turn_spans] for t in trajectories],
            tuple(mask.shape),
            mask,
            extra=rewards.double() - env_totals,
            kl=kl,
            kl_beta=cfg.loss.kl_beta,
        )
        with self.runtime.timer("values"):
            values = self.critic.values(tokens)
        # the value targets R = A + V (λ_critic); the policy's advantages from the registry (gae, raw_reward)
        critic_side = gae_advantages(per_token, values.double(), mask, gamma=adv.gamma, lam=adv.lam_critic)
        inputs = AdvantageInputs(
            rewards, rollouts.group_ids, mask=mask, token_rewards=per_token, values=values
        )
        raw = advantage_estimator(adv.estimator)(inputs, adv)  # before whitening: advantages/mean, std
        advantages = finish_advantages(raw, inputs, adv).float()
        loss_mask = (
            mask * overlong_filter_mask(rollouts.truncated).float()[:, None]
            if cfg.dapo.overlong_filter
            else mask
        )
        batch = PPOBatch(
            **{**vars(tokens), "advantages": advantages, "loss_mask": loss_mask},
            values=values,
            returns=critic_side.returns.float(),
        )
        metrics = self.batch_metrics(rollouts, rewards, tokens, values, critic_side.returns, raw)
        if kl is not None:
            metrics["reward/kl_penalty"] = float(cfg.loss.kl_beta * kl.sum(-1).mean())
        if adv.lam_actor_alpha is not None:
            lam_actor = length_adaptive_lambda(mask.sum(-1), alpha=adv.lam_actor_alpha)
            metrics["advantages/lam_actor_mean"] = float(torch.as_tensor(lam_actor).double().mean())
        return batch, metrics

    def batch_metrics(
        self,
        rollouts: Rollouts,
        rewards: torch.Tensor,
        tokens: RLBatch,
        values: torch.Tensor,
        returns: torch.Tensor,
        raw: torch.Tensor,
    ) -> dict[str, float]:
        """Rewards, lengths, entropy, the critic's fit (explained variance), returns and advantages
        (`raw`: before whitening) over the batch's assistant tokens (before the overlong filter)."""
        mask = tokens.loss_mask
        returns_mean, returns_std = masked_stats(returns, mask)
        adv_mean, adv_std = masked_stats(raw, mask)
        return {
            **scored_reward_metrics(rewards, rollouts.scored),
            **batch_stats(rollouts, mask, tokens.generation_logprobs),
            "critic/explained_variance": explained_variance(values, returns, mask),
            "critic/explained_variance_last": explained_variance(values, returns, last_token_mask(mask)),
            "critic/values_mean": masked_stats(values, mask)[0],
            "returns/mean": returns_mean,
            "returns/std": returns_std,
            "advantages/mean": adv_mean,
            "advantages/std": adv_std,
        }

    def epoch_minibatches(
        self, batch: PPOBatch, epoch: int, parts: int | None = None, *, shuffle_first: bool = False
    ) -> list[PPOBatch]:
        """The minibatches of one PPO epoch: `parts` (default `updates_per_batch`) contiguous pieces of
        the batch, its rows reshuffled for every epoch after the first (and the first too with
        `shuffle_first`): a permutation seeded by (seed, step, epoch), so a resumed run draws the same
        ones. With one minibatch the order changes nothing."""
        p = self.cfg.ppo
        parts = parts or p.updates_per_batch
        if (epoch > 0 or shuffle_first) and parts > 1:
            seed = p.seed * 1_000_003 + self.current_step * 101 + epoch
            order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(seed)).tolist()
            batch = batch.reorder(order)
        return batch.chunks(parts)

    def critic_data(self, batch: PPOBatch) -> tuple[PPOBatch, int]:
        """The critic's training rows this step and their number of batches: this batch, then the
        replayed ones, whose V_old (the clipped loss's anchor) the current critic recomputes; their
        returns stay those computed when they were collected."""
        own = value_targets(batch)
        if not self.value_replay:
            return own, 1
        pad = self.tokenizer.pad_token_id
        replayed = concat_batches(list(self.value_replay), pad)
        with self.runtime.timer("replay_values"):
            replayed.values = self.critic.values(replayed)
        return concat_batches([own, replayed], pad), 1 + len(self.value_replay)  # type: ignore[return-value]

    def train_critic(self, batch: PPOBatch) -> dict[str, float]:
        """`critic_epochs` passes over the critic's data in `updates_per_batch` minibatches per batch;
        metrics are means over the updates, the learning rate the last one's. Then the batch joins
        the value replay."""
        data, batches = self.critic_data(batch)
        epochs, parts = self.critic_epochs(), self.cfg.ppo.updates_per_batch * batches
        updates = epochs * min(parts, len(data))  # `chunks` makes no empty minibatch
        critic = self.cfg.critic
        value_fn = functools.partial(value_loss_fn, clip=critic.value_clip, scale=critic.value_loss_scale)
        metrics: dict[str, float] = {}
        for epoch in range(epochs):
            for mb in self.epoch_minibatches(data, epoch, parts, shuffle_first=batches > 1):
                out = self.critic.train(mb, value_fn, max(1.0, float(mb.loss_mask.sum())))
                add_mean(metrics, out, updates, prefix="critic/")
        if self.value_replay.maxlen:
            self.value_replay.appendleft(dataclasses.replace(value_targets(batch), values=None))
            metrics["critic/replayed_batches"] = float(batches - 1)
        return metrics

    def train_policy(self, batch: PPOBatch) -> dict[str, float]:
        """`ppo_epochs` passes over the batch in `updates_per_batch` minibatches: a policy step on the
        clipped surrogate with per-token advantages on each; metrics are means over the updates."""
        p = self.cfg.ppo
        updates = p.ppo_epochs * min(p.updates_per_batch, len(batch))
        minibatches = (mb for epoch in range(p.ppo_epochs) for mb in self.epoch_minibatches(batch, epoch))
        return policy_updates(self.runtime.policy, self.cfg, minibatches, updates)

    def train_on(self, batch: PPOBatch) -> dict[str, float]:
        """The critic's epochs, then, once the warm-up is over, the policy's (the two models are
        independent: the advantages were computed from the values before either trains)."""
        train_policy = self.current_step >= self.cfg.ppo.critic_warmup_steps
        metrics: dict[str, float] = {"critic/warmup": float(not train_policy)}
        if train_policy:
            self.add_logprobs(batch)  # π_old before any update
            # out of the policy's and critic's losses
            metrics.update(filter_logprob_errors(self.cfg.loss.seq_logprob_error_threshold, batch))
        with self.runtime.timer("training"):
            metrics.update(self.train_critic(batch))
            if train_policy:
                metrics.update(self.train_policy(batch))
        if train_policy:
            metrics.update(self.runtime.policy_updated())
        return metrics

    # ---------------------------------------------------------------- state
    def save_state(self, directory: Path) -> None:
        """The critic's checkpoint (weights, optimizer, scheduler) in `critic/`, and the value replay."""
        self.critic.save_checkpoint(directory / "critic")
        if self.value_replay.maxlen:
            torch.save([vars(b) for b in self.value_replay], directory / "critic_replay.pt")

    def load_state(self, directory: Path, step: int) -> None:
        self.critic.load_checkpoint(directory / "critic")
        self.value_replay.clear()
        if self.value_replay.maxlen:
            replay = directory / "critic_replay.pt"
            saved = torch.load(replay, weights_only=True) if replay.exists() else []
            self.value_replay.extend(PPOBatch(**fields) for fields in saved)
        self.current_step = step

    def close(self) -> None:
        self.critic.shutdown()


def run_ppo(cfg: PPOConfig, *, stop_after: int | None = None) -> RunResult:
    """Train; `stop_after` ends this invocation after that many steps (a later call resumes)."""
    return run_loop(PPOTrainer(cfg).runtime, stop_after=stop_after)
