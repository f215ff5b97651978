"""`posttrain sft`: its data and loop sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from posttrain.config.common import (
    VALIDATION_HELP,
    CheckpointConfig,
    ClusterConfig,
    DatasetConfig,
    LoggingConfig,
    OptimizerConfig,
    PolicyConfig,
    ReasoningGymConfig,
    SchedulerConfig,
    SplitsConfig,
    Strict,
)


def _default_sft_train() -> DatasetConfig:
    return DatasetConfig(reasoning_gym=ReasoningGymConfig(size=2000, seed=1, kwargs=_ARITH_KWARGS))


def _default_sft_validation() -> DatasetConfig:
    return DatasetConfig(reasoning_gym=ReasoningGymConfig(size=64, seed=1_000_001, kwargs=_ARITH_KWARGS))


_ARITH_KWARGS: dict = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 2,
    "operators": ["+", "-"],
}


class SFTDataConfig(SplitsConfig):
    train: DatasetConfig = Field(default_factory=_default_sft_train)
    validation: DatasetConfig | None = Field(
        default_factory=_default_sft_validation, description=VALIDATION_HELP
    )
    overlong: Literal["truncate", "drop"] = Field(
        "truncate", description="What to do with sequences longer than policy.max_seq_len."
    )


class SFTTrainerConfig(Strict):
    max_steps: int | None = Field(60, gt=0, description="Stop after this many optimizer steps.")
    num_epochs: int = Field(1, gt=0)
    global_batch_size: int = Field(8, gt=0, description="Sequences per optimizer step, over all workers.")
    val_every: int = Field(20, gt=0)
    val_at_start: bool = True
    val_batches: int | None = Field(None, gt=0, description="Cap on validation batches; null: whole set.")
    seed: int = 0


class SFTConfig(Strict):
    """`posttrain sft`."""

    policy: PolicyConfig = PolicyConfig(
        optimizer=OptimizerConfig(lr=5e-5), scheduler=SchedulerConfig(warmup_steps=5), max_seq_len=256
    )
    data: SFTDataConfig = SFTDataConfig()
    sft: SFTTrainerConfig = SFTTrainerConfig()
    cluster: ClusterConfig = ClusterConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(save_every=20)
    logging: LoggingConfig = LoggingConfig()
