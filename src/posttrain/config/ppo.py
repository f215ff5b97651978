"""`posttrain ppo`: the critic, GAE and PPO loop sections and the config."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from posttrain.config.common import LoggingConfig, OptimizerConfig, PolicyConfig, SchedulerConfig, Strict
from posttrain.config.loss import DAPOConfig, LossConfig, RewardScalingConfig
from posttrain.config.rl import RLConfig, RLLoopConfig, check_local_workers, check_minibatches


class CriticConfig(Strict):
    """The value model of `posttrain ppo`: a causal LM's decoder with a zero-initialised scalar head,
    trained by its own AdamW on the clipped value loss."""

    model_name: str | None = Field(
        None, description="The backbone (an alias, HF folder or hub id); null: the policy's model."
    )
    placement: Literal["colocated", "split"] = Field(
        "colocated",
        description="colocated: the critic is held in every policy worker, on its device (like the "
        "reference model; the policy and the critic never compute at the same time). split: critic "
        "workers of their own (Ray actors with critic.cpus_per_worker CPUs and, with GPUs, one GPU each; "
        "one in-process worker with cluster.backend=local). On a CPU machine leave them room: "
        "cluster.cpus_per_worker defaults to all cores.",
    )
    num_workers: int = Field(1, gt=0, description="Data-parallel critic workers (split placement).")
    cpus_per_worker: int = Field(1, gt=0, description="CPU cores per critic worker (split placement).")
    dtype: Literal["float32", "bfloat16"] | None = Field(
        None, description="Compute dtype (weights and AdamW state stay fp32); null: policy.dtype."
    )
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=5e-5, max_grad_norm=1.0),
        description="The critic's own AdamW and learning rate.",
    )
    scheduler: SchedulerConfig = Field(
        default_factory=lambda: SchedulerConfig(name="constant", warmup_steps=0)
    )
    value_loss_scale: float = Field(
        1.0,
        gt=0,
        description="NeMo RL: value_loss_fn.scale. Multiplies the value loss. The critic has its own AdamW, "
        "so the scale mostly moves the loss against critic.optimizer.max_grad_norm and Adam's eps.",
    )
    value_clip: float | None = Field(
        0.5,
        gt=0,
        description="ε of the clipped value loss: V is kept within ±ε of the values the batch was "
        "collected with (null: plain squared error).",
    )
    train_micro_batch_size: int = Field(8, gt=0, description="Sequences per forward/backward on one worker.")
    batch_size: int = Field(16, gt=0, description="Sequences per forward when computing values.")
    activation_checkpointing: bool = False

    def policy_config(self, policy: PolicyConfig) -> PolicyConfig:
        """The `PolicyConfig` the critic's workers run (sequence length, packing and seed: the policy's)."""
        return PolicyConfig(
            model_name=self.model_name or policy.model_name,
            dtype=self.dtype or policy.dtype,
            max_seq_len=policy.max_seq_len,
            train_micro_batch_size=self.train_micro_batch_size,
            logprob_batch_size=self.batch_size,
            packed_sequences=policy.packed_sequences,
            activation_checkpointing=self.activation_checkpointing,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            seed=policy.seed,
        )


class GAEConfig(Strict):
    """Per-token rewards and generalised advantage estimation (see posttrain.algorithms.gae, docs/ppo.md)."""

    estimator: Literal["gae", "raw_reward"] = Field(
        "gae",
        description="NeMo RL: ppo.adv_estimator.name. gae: the critic's GAE advantages. raw_reward: A = the "
        "episode's (shaped) reward on every assistant token, no critic and no baseline in the advantage "
        "(whitened when whiten is true; the critic still trains); a baseline-free ablation.",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount γ per assistant token.")
    lam_critic: float = Field(
        1.0, ge=0, le=1, description="GAE λ of the value targets R = A + V (1: Monte-Carlo returns)."
    )
    lam_actor: float = Field(0.95, ge=0, le=1, description="GAE λ of the policy's advantages.")
    lam_actor_alpha: float | None = Field(
        None,
        gt=0,
        description="VAPO's length-adaptive λ for the policy: λ = 1 − 1/(α·l), l the sequence's "
        "assistant tokens (clamped to [0, 1]); replaces lam_actor. VAPO: 0.05.",
    )
    whiten: bool = Field(
        True, description="Standardise the policy's advantages over the batch's assistant tokens."
    )
    clip: float | None = Field(
        None, gt=0, description="Clamp the (whitened) advantages to [-clip, clip]; null: off."
    )
    reward_scaling: RewardScalingConfig = Field(
        default_factory=RewardScalingConfig,
        description="Applied to each episode's total reward; the change lands on its last assistant token.",
    )


class PPOTrainerConfig(RLLoopConfig):
    """The PPO loop: prompts and samples per step, critic warm-up, epochs and minibatches (no
    asynchronous rollouts: the critic's values and π_old assume on-policy batches)."""

    prompts_per_step: int = Field(32, gt=0)
    generations_per_prompt: int = Field(
        1, gt=0, description="Samples per prompt (the critic is the baseline: 1 is enough)."
    )
    updates_per_batch: int = Field(
        1, gt=0, description="Minibatches per PPO epoch (optimizer steps per epoch, policy and critic)."
    )
    ppo_epochs: int = Field(2, gt=0, description="Passes over each rollout batch.")
    critic_epochs: int | None = Field(
        None,
        gt=0,
        description="The critic's passes over each rollout batch (null: ppo_epochs). More than the "
        "policy's fit the values to each batch better without taking the policy further from the one "
        "that sampled it.",
    )
    critic_warmup_steps: int = Field(
        5, ge=0, description="The first N steps train only the critic (the policy stays as it is)."
    )
    critic_replay_batches: int = Field(
        0,
        ge=0,
        description="The critic also trains on the last N rollout batches (value replay: more samples "
        "per update rather than more passes over one batch). Their stored returns are the targets; the "
        "clipped loss's V_old is recomputed by the current critic. Each critic epoch then has "
        "updates_per_batch x (1 + replayed batches) minibatches, shuffled together.",
    )


class PPOConfig(RLConfig):
    """`posttrain ppo`: PPO with a learned critic and GAE, on GRPO's rollouts, environments and losses."""

    LOOP: ClassVar[str] = "ppo"

    critic: CriticConfig = CriticConfig()
    advantage: GAEConfig = GAEConfig()
    loss: LossConfig = LossConfig()
    dapo: DAPOConfig = Field(
        default_factory=DAPOConfig,
        description="overlong_filter and the soft overlong penalty apply; dynamic sampling does not.",
    )
    ppo: PPOTrainerConfig = PPOTrainerConfig()
    logging: LoggingConfig = LoggingConfig(run_dir="runs/ppo")

    @model_validator(mode="after")
    def _consistent(self) -> PPOConfig:
        if self.dapo.dynamic_sampling:
            raise ValueError(
                "dapo.dynamic_sampling drops groups whose rewards are all equal, which PPO's critic "
                "baseline does not need (and a group of one sample always has): set it to false"
            )
        if self.critic.placement == "split":  # the policy's workers: in check_rl_config
            check_local_workers("critic", self.critic.num_workers, self.cluster)
            check_minibatches("ppo", self.ppo, self.critic.num_workers, "critic")
        return self
