"""Typed configs, YAML recipes with `defaults:` inheritance, and dotted CLI overrides."""

from posttrain.config.loader import ConfigError, apply_overrides, load_config, load_yaml, to_yaml, validate
from posttrain.config.schema import (
    ALGORITHM_CONFIGS,
    CheckpointConfig,
    ClusterConfig,
    DatasetConfig,
    LoggingConfig,
    OptimizerConfig,
    PolicyConfig,
    ReasoningGymConfig,
    SchedulerConfig,
    SFTConfig,
    SFTDataConfig,
    SFTTrainerConfig,
)

__all__ = [
    "ALGORITHM_CONFIGS",
    "CheckpointConfig",
    "ClusterConfig",
    "ConfigError",
    "DatasetConfig",
    "LoggingConfig",
    "OptimizerConfig",
    "PolicyConfig",
    "ReasoningGymConfig",
    "SFTConfig",
    "SFTDataConfig",
    "SFTTrainerConfig",
    "SchedulerConfig",
    "apply_overrides",
    "load_config",
    "load_yaml",
    "to_yaml",
    "validate",
]
