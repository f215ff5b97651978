"""The one table of posttrain's training commands (`COMMANDS`): each command's name, config type,
entry point, one-line description and the main keys its --help lists.

The CLI builds its subcommands from it, the Python API and `doctor` look configs and entry points
up in it, and docs/gen_config_reference.py documents every config in it. Adding a command is one
row here (docs/development.md). Entry points are dotted paths imported only when a command runs,
so this floor never imports the trainers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

from posttrain.config.eval import EvalConfig
from posttrain.config.ppo import PPOConfig
from posttrain.config.rl import DistillConfig, GRPOConfig
from posttrain.config.supervised import DPOConfig, RMConfig, SFTConfig


@dataclass(frozen=True)
class Command:
    """`posttrain <name>`: validated into `config`, run by the function at `entry_point`
    ("module:function", called with the config), described by `help`; --help lists `main_keys`."""

    name: str
    config: type[BaseModel]
    entry_point: str
    help: str
    main_keys: tuple[str, ...]

    def run_function(self) -> Callable[..., Any]:
        """The entry point, imported now (its module loads torch and the trainer)."""
        module, _, function = self.entry_point.partition(":")
        return getattr(importlib.import_module(module), function)


_RL_KEYS = (
    "policy.model_name",
    "policy.optimizer.lr",
    "data.train.path",
    "environment.name",
    "generation.backend",
    "generation.max_new_tokens",
)
_RUN_KEYS = ("cluster.backend", "cluster.gpus_per_node", "checkpoint.save_every", "logging.run_dir")
_LOOP = ("max_steps", "global_batch_size", "val_every")
_RL_LOOP = ("max_steps", "prompts_per_step", "generations_per_prompt", "val_every")
_BASIC = ("policy.model_name", "policy.optimizer.lr", "policy.max_seq_len", "data.train.path")
_EVAL_KEYS = (
    "model",
    "metric",
    "data.dataset.path",
    "environment.name",
    "generation.backend",
    "generation.max_new_tokens",
    "generation.temperature",
    "sampling.samples_per_prompt",
    "sampling.k",
    "output_dir",
)
_EVAL_HELP = (
    "evaluate a model or checkpoint: any environment's reward on sampled episodes (mean_reward, "
    "accuracy, pass@k, cons@k; math by default), or metric=loss: held-out loss and perplexity of SFT data"
)

_TABLE = (
    Command(
        "sft",
        SFTConfig,
        "posttrain.trainers.sft:run_sft",
        "train with SFT",
        (*_BASIC, "data.validation.path", *(f"sft.{k}" for k in _LOOP), *_RUN_KEYS),
    ),
    Command(
        "grpo",
        GRPOConfig,
        "posttrain.trainers.grpo:run_grpo",
        "train with GRPO",
        (*_RL_KEYS, *(f"grpo.{k}" for k in _RL_LOOP), *_RUN_KEYS),
    ),
    Command("eval", EvalConfig, "posttrain.trainers.eval:run_eval", _EVAL_HELP, _EVAL_KEYS),
    Command(
        "dpo",
        DPOConfig,
        "posttrain.trainers.dpo:run_dpo",
        "train with DPO",
        (*_BASIC, "data.validation.path", *(f"dpo.{k}" for k in _LOOP), "dpo.beta", *_RUN_KEYS),
    ),
    Command(
        "rm",
        RMConfig,
        "posttrain.trainers.rm:run_rm",
        "train a reward model",
        (*_BASIC, "data.validation.path", *(f"rm.{k}" for k in _LOOP), *_RUN_KEYS),
    ),
    Command(
        "distill",
        DistillConfig,
        "posttrain.trainers.distill:run_distill",
        "on-policy distillation: the student samples, a teacher's top-k scores its tokens",
        (*_RL_KEYS, "teacher.model_name", *(f"distill.{k}" for k in _RL_LOOP), *_RUN_KEYS),
    ),
    Command(
        "ppo",
        PPOConfig,
        "posttrain.trainers.ppo:run_ppo",
        "train with PPO: a learned critic (value model) and GAE, one sample per prompt",
        (*_RL_KEYS, "critic.model_name", *(f"ppo.{k}" for k in _RL_LOOP), *_RUN_KEYS),
    ),
)

COMMANDS: Mapping[str, Command] = MappingProxyType({c.name: c for c in _TABLE})
"""Every training command by name, in the order the CLI's help and the config reference list them."""

ALGORITHM_CONFIGS: Mapping[str, type[BaseModel]] = MappingProxyType(
    {n: c.config for n, c in COMMANDS.items()}
)
"""Each command's config type (read-only, derived from `COMMANDS`)."""

MAIN_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType({n: c.main_keys for n, c in COMMANDS.items()})
"""The keys each command's --help lists with their defaults (read from the config models, so a
renamed key fails tests/unit/test_cli_help.py instead of going stale); derived from `COMMANDS`."""
