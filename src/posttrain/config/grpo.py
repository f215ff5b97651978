"""`posttrain grpo`: its config and the checks that combine its sections."""

from __future__ import annotations

from pydantic import Field, model_validator

from posttrain.config.common import (
    CheckpointConfig,
    ClusterConfig,
    LoggingConfig,
    PolicyConfig,
    config_warning,
)
from posttrain.config.loss import AdvantageConfig, DAPOConfig, LossConfig
from posttrain.config.rl import (
    RL_CHECKPOINT,
    RL_POLICY,
    GRPODataConfig,
    GRPOTrainerConfig,
    RLChecks,
    TeacherConfig,
)
from posttrain.config.rollout import EnvironmentConfig, GenerationConfig


class GRPOConfig(RLChecks):
    """`posttrain grpo`."""

    policy: PolicyConfig = RL_POLICY
    data: GRPODataConfig = GRPODataConfig()
    generation: GenerationConfig = GenerationConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    loss: LossConfig = LossConfig()
    dapo: DAPOConfig = DAPOConfig()
    grpo: GRPOTrainerConfig = GRPOTrainerConfig()
    teacher: TeacherConfig | None = Field(
        None,
        description="The teacher of advantage.estimator=on_policy_distill (required by it, else unused).",
    )
    cluster: ClusterConfig = ClusterConfig()
    checkpoint: CheckpointConfig = RL_CHECKPOINT
    logging: LoggingConfig = LoggingConfig()

    @model_validator(mode="after")
    def _algorithm_combinations(self) -> GRPOConfig:
        """Warn about half-configured recipes whose sections disagree (see docs/algorithms.md)."""
        estimator, aggregation = self.advantage.estimator, self.loss.aggregation
        if estimator == "dr_grpo" and aggregation != "seq_mean_token_sum":
            config_warning(
                f"advantage.estimator=dr_grpo with loss.aggregation={aggregation}: Dr.GRPO removes both the "
                "std and the per-sequence length normalisation; set loss.aggregation=seq_mean_token_sum"
            )
        return self

    @model_validator(mode="after")
    def _gdpo_takes_the_components_as_given(self) -> GRPOConfig:
        """gdpo normalises the environment's reward components; shaping that moves the scalar reward
        (scaling, truncation and overlong penalties, the KL in the reward) would not reach them."""
        if self.advantage.estimator != "gdpo":
            return self
        shaping = {
            "advantage.reward_scaling.enabled": self.advantage.reward_scaling.enabled,
            "dapo.stop_properly_penalty_coef": self.dapo.stop_properly_penalty_coef is not None,
            "dapo.overlong_buffer": self.dapo.overlong_buffer is not None,
            "loss.kl_in_reward": self.loss.kl_in_reward,
        }
        used = [key for key, on in shaping.items() if on]
        if used:
            raise ValueError(
                f"advantage.estimator=gdpo normalises the environment's reward components as they come; "
                f"{', '.join(used)} shape(s) the scalar reward only and would be ignored: turn it off, "
                "or use estimator=grpo"
            )
        return self

    @model_validator(mode="after")
    def _teacher_for_distill_advantage(self) -> GRPOConfig:
        distill = self.advantage.estimator == "on_policy_distill"
        has_teacher = self.teacher is not None and self.teacher.model_name is not None
        if distill and not has_teacher:
            raise ValueError(
                "advantage.estimator=on_policy_distill needs a teacher: set teacher.model_name (a posttrain "
                "run directory, checkpoint or HF folder with the policy's tokenizer)"
            )
        if self.teacher is not None and not distill:
            raise ValueError(
                "the teacher section is used only by advantage.estimator=on_policy_distill; set that "
                "estimator or remove the teacher"
            )
        return self

    @model_validator(mode="after")
    def _async_mode(self) -> GRPOConfig:
        """Asynchronous GRPO needs generation workers of its own, a snapshot-capable refit and whole
        batches; its importance correction defaults to truncated IS."""
        g = self.grpo
        self._check_partial_rollouts()
        if not g.async_mode:
            return self
        if self.generation.placement != "split":
            raise ValueError(
                "grpo.async_mode=true generates while the policy trains, so generation needs workers of "
                "its own: set generation.placement=split"
            )
        transport = self.generation.resolved_refit_transport(self.cluster, self.policy.split_weights)
        if transport == "collective":
            raise ValueError(
                "grpo.async_mode=true loads weight snapshots between generation batches; the collective "
                "transport needs both sides at once. Set generation.refit_transport=object_store "
                "(or shared_memory on one CPU machine)"
            )
        if self.dapo.dynamic_sampling:
            raise ValueError(
                "grpo.async_mode=true does not combine with dapo.dynamic_sampling yet: set one of them to false"
            )
        if g.async_buffer_groups is not None and g.async_buffer_groups < g.prompts_per_step:
            raise ValueError(
                f"grpo.async_buffer_groups={g.async_buffer_groups} cannot hold one step's "
                f"{g.prompts_per_step} groups (grpo.prompts_per_step); raise it or leave it null"
            )
        if "importance_correction" not in self.loss.model_fields_set:
            self.loss.importance_correction = "truncated"
        return self

    def _check_partial_rollouts(self) -> None:
        """grpo.partial_rollouts: async mode, posttrain's HF sampler, shared-memory snapshots (whose
        version word a worker polls between decode steps), turn-by-turn multi-turn episodes."""
        if not self.grpo.partial_rollouts:
            return
        if not self.grpo.async_mode:
            raise ValueError(
                "grpo.partial_rollouts=true updates a generation's weights while the policy trains: it "
                "needs grpo.async_mode=true"
            )
        if self.generation.backend != "hf":
            raise ValueError(
                f"grpo.partial_rollouts=true is implemented in posttrain's HF sampler, not in "
                f"generation.backend={self.generation.backend}: set generation.backend=hf"
            )
        transport = self.generation.resolved_refit_transport(self.cluster, self.policy.split_weights)
        if transport != "shared_memory":
            raise ValueError(
                f"grpo.partial_rollouts=true polls the policy's shared-memory snapshot between decode steps; "
                f"the refit transport here is {transport}: set generation.refit_transport=shared_memory "
                "(one CPU machine)"
            )
        if self.environment.max_turns > 1 and not self.environment.turn_barrier:
            raise ValueError(
                "grpo.partial_rollouts=true is not implemented in the continuous multi-turn decoder: set "
                "environment.turn_barrier=true"
            )
