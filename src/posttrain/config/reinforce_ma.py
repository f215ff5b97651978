"""REINFORCE with a moving-average baseline (`posttrain.trainers.reinforce_ma`): its loop section
and config. The example of docs/architecture.md, "Add an RL algorithm in one file"."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from posttrain.config.loss import LossConfig
from posttrain.config.rl import RLConfig, RLLoopConfig


class ReinforceMATrainerConfig(RLLoopConfig):
    """The RL loop (`RLLoopConfig`) and the baseline's momentum."""

    prompts_per_step: int = Field(32, gt=0)
    generations_per_prompt: int = Field(
        1, gt=0, description="Samples per prompt (the baseline spans batches, not groups: 1 is enough)."
    )
    baseline_momentum: float = Field(
        0.9,
        ge=0,
        lt=1,
        description="m of the baseline b <- m·b + (1 - m)·mean(r), updated after each batch's advantages "
        "r - b; the first batch's b is its own mean reward. 0: the previous batch's mean.",
    )


class ReinforceMAConfig(RLConfig):
    """REINFORCE with a moving-average baseline: A = r - b, GRPO's clipped surrogate (loss.*)."""

    LOOP: ClassVar[str] = "reinforce_ma"

    loss: LossConfig = LossConfig()
    reinforce_ma: ReinforceMATrainerConfig = ReinforceMATrainerConfig()

    @model_validator(mode="after")
    def _kl_in_the_loss(self) -> ReinforceMAConfig:
        if self.loss.kl_in_reward:
            raise ValueError(
                "loss.kl_in_reward=true: REINFORCE-MA's advantages are r - b of the environment's reward; "
                "keep the KL penalty in the loss (loss.kl_beta with loss.kl_in_reward=false)"
            )
        return self
