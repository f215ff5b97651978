"""Typed configs, YAML recipes with `defaults:` inheritance, and dotted CLI overrides.

The package exports the loader (`load_config`, ...) and the table of commands (`COMMANDS`); each
config class is imported from the module that defines it (common, rollout, loss, rl, ppo,
reinforce_ma, supervised, eval)."""

from posttrain.config.commands import ALGORITHM_CONFIGS, COMMANDS, Command
from posttrain.config.loader import ConfigError, apply_overrides, load_config, load_yaml, to_yaml, validate

__all__ = [
    "ALGORITHM_CONFIGS",
    "COMMANDS",
    "Command",
    "ConfigError",
    "apply_overrides",
    "load_config",
    "load_yaml",
    "to_yaml",
    "validate",
]
