"""`posttrain distill`: on-policy distillation's loop section and config."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from posttrain.config.common import CheckpointConfig, ClusterConfig, LoggingConfig, PolicyConfig
from posttrain.config.rl import (
    RL_CHECKPOINT,
    RL_POLICY,
    GRPODataConfig,
    RLChecks,
    RLLoopConfig,
    TeacherConfig,
)
from posttrain.config.rollout import EnvironmentConfig, GenerationConfig


class DistillTrainerConfig(RLLoopConfig):
    """The loop and the loss of on-policy distillation (see posttrain.algorithms.distillation)."""

    max_steps: int = Field(20, gt=0)
    loss: Literal["forward_kl", "reverse_kl", "mixed_kl", "jsd"] = Field(
        "mixed_kl",
        description="forward_kl: KL(teacher || student); reverse_kl: KL(student || teacher); mixed_kl: "
        "mixed_kl_weight * forward + (1 - mixed_kl_weight) * reverse (NeMo RL's default); jsd: "
        "generalised Jensen-Shannon with jsd_beta (GKD).",
    )
    topk_logits_k: int = Field(
        64, gt=0, description="Teacher tokens per position sent to the student (never the full vocabulary)."
    )
    top_k_mode: Literal["tail", "renormalized"] = Field(
        "tail",
        description="tail: the k tokens plus a bucket holding the rest of the mass, on both sides (a "
        "valid divergence, which sees the student's mass outside the teacher's top-k); renormalized: "
        "both distributions renormalised over the k tokens.",
    )
    teacher_temperature: float = Field(
        1.0, gt=0, description="The teacher's distribution is softmax(logits / teacher_temperature)."
    )
    mixed_kl_weight: float = Field(0.5, ge=0, le=1, description="mixed_kl: the weight of the forward KL.")
    jsd_beta: float = Field(0.5, gt=0, lt=1, description="jsd: β, the teacher's weight in the mixture.")
    val_every: int = Field(5, gt=0)


class DistillConfig(RLChecks):
    """`posttrain distill`: the student samples, the teacher scores its tokens (top-k), the student
    minimises the divergence on its own tokens. Default task: the GRPO quickstart's."""

    LOOP: ClassVar[str] = "distill"

    policy: PolicyConfig = RL_POLICY
    teacher: TeacherConfig = TeacherConfig()
    data: GRPODataConfig = GRPODataConfig()
    generation: GenerationConfig = GenerationConfig()
    environment: EnvironmentConfig = Field(
        default_factory=EnvironmentConfig,
        description="Runs the episodes (several turns, tools) and scores them for the metrics and "
        "validation; rewards do not enter the loss.",
    )
    distill: DistillTrainerConfig = DistillTrainerConfig()
    cluster: ClusterConfig = ClusterConfig()
    checkpoint: CheckpointConfig = RL_CHECKPOINT
    logging: LoggingConfig = LoggingConfig()
