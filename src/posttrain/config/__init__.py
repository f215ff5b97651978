"""Typed configs, YAML recipes with `defaults:` inheritance, and dotted CLI overrides."""

from posttrain.config.commands import ALGORITHM_CONFIGS, COMMANDS, Command
from posttrain.config.common import (
    CheckpointConfig,
    ClusterConfig,
    DatasetConfig,
    LoggingConfig,
    OptimizerConfig,
    PolicyConfig,
    ReasoningGymConfig,
    SchedulerConfig,
)
from posttrain.config.loader import ConfigError, apply_overrides, load_config, load_yaml, to_yaml, validate
from posttrain.config.supervised import SFTConfig, SFTDataConfig, SFTTrainerConfig

__all__ = [
    "ALGORITHM_CONFIGS",
    "COMMANDS",
    "CheckpointConfig",
    "ClusterConfig",
    "Command",
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
