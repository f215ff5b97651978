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
    ("module:function", called with the config), described by `help`; --help lists `main_keys` with
    their defaults read from the config (a renamed key fails tests/unit/test_cli_help.py)."""

    name: str
    config: type[BaseModel]
    entry_point: str
    help: str
    main_keys: tuple[str, ...]

    def run_function(self) -> Callable[..., Any]:
        """The entry point, imported now (its module loads torch and the trainer)."""
        module, _, function = self.entry_point.partition(":")
        return getattr(importlib.import_module(module), function)


_RUN_KEYS = ("cluster.backend", "cluster.gpus_per_node", "checkpoint.save_every", "logging.run_dir")


def _epoch_keys(loop: str, *extra: str) -> tuple[str, ...]:
    """--help's keys of a command that reads a fixed dataset by epochs: the policy, the data, the
    `loop` section's length and batch size, `extra`, where the run goes."""
    policy = ("policy.model_name", "policy.optimizer.lr", "policy.max_seq_len")
    data = ("data.train.path", "data.validation.path")
    steps = (f"{loop}.{k}" for k in ("max_steps", "global_batch_size", "val_every"))
    return (*policy, *data, *steps, *extra, *_RUN_KEYS)


def _rl_keys(loop: str, *extra: str) -> tuple[str, ...]:
    """--help's keys of an RL command: the policy, the data, the environment and generation, `extra`,
    the `loop` section's length and batch shape, where the run goes."""
    policy = ("policy.model_name", "policy.optimizer.lr", "data.train.path")
    rollout = ("environment.name", "generation.backend", "generation.max_new_tokens")
    steps = (f"{loop}.{k}" for k in ("max_steps", "prompts_per_step", "generations_per_prompt", "val_every"))
    return (*policy, *rollout, *extra, *steps, *_RUN_KEYS)


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
    Command("sft", SFTConfig, "posttrain.trainers.sft:run_sft", "train with SFT", _epoch_keys("sft")),
    Command("grpo", GRPOConfig, "posttrain.trainers.grpo:run_grpo", "train with GRPO", _rl_keys("grpo")),
    Command("eval", EvalConfig, "posttrain.trainers.eval:run_eval", _EVAL_HELP, _EVAL_KEYS),
    Command(
        "dpo", DPOConfig, "posttrain.trainers.dpo:run_dpo", "train with DPO", _epoch_keys("dpo", "dpo.beta")
    ),
    Command("rm", RMConfig, "posttrain.trainers.rm:run_rm", "train a reward model", _epoch_keys("rm")),
    Command(
        "distill",
        DistillConfig,
        "posttrain.trainers.distill:run_distill",
        "on-policy distillation: the student samples, a teacher's top-k scores its tokens",
        _rl_keys("distill", "teacher.model_name"),
    ),
    Command(
        "ppo",
        PPOConfig,
        "posttrain.trainers.ppo:run_ppo",
        "train with PPO: a learned critic (value model) and GAE, one sample per prompt",
        _rl_keys("ppo", "critic.model_name"),
    ),
)

COMMANDS: Mapping[str, Command] = MappingProxyType({c.name: c for c in _TABLE})
"""Every training command by name, in the order the CLI's help and the config reference list them."""

ALGORITHM_CONFIGS: Mapping[str, type[BaseModel]] = MappingProxyType(
    {n: c.config for n, c in COMMANDS.items()}
)
"""Each command's config type (read-only, derived from `COMMANDS`)."""
