"""Naming your own training data without `data.validation` gives no validation set, never the
default's generated arithmetic problems (another task, validated silently)."""

from __future__ import annotations

import pytest

from posttrain.config import load_config
from posttrain.config.common import DatasetConfig
from posttrain.config.ppo import PPOConfig
from posttrain.config.rl import DistillConfig, GRPOConfig
from posttrain.config.supervised import DPOConfig, RMConfig, SFTConfig, SFTDataConfig

TRAINERS = [SFTConfig, GRPOConfig, PPOConfig, DistillConfig, DPOConfig, RMConfig]


@pytest.mark.parametrize("model", TRAINERS, ids=lambda m: m.__name__)
def test_own_train_path_without_validation_validates_on_nothing(model):
    assert model().data.validation is not None  # the quickstart default validates on its own task
    cfg = load_config(model, None, ["data.train.path=my.jsonl"])
    assert cfg.data.train.path == "my.jsonl"
    assert cfg.data.validation is None


@pytest.mark.parametrize("model", TRAINERS, ids=lambda m: m.__name__)
def test_own_validation_is_kept(model):
    cfg = load_config(model, None, ["data.train.path=my.jsonl", "data.validation.path=val.jsonl"])
    assert cfg.data.validation.path == "val.jsonl" and cfg.data.validation.reasoning_gym is None


def test_changing_the_generated_train_set_keeps_its_validation_set():
    """Same task, other size or samples: the default held-out problems still fit."""
    default = SFTConfig().data.validation
    for override in ("data.train.max_samples=5", "data.train.reasoning_gym.size=100"):
        assert load_config(SFTConfig, None, [override]).data.validation == default, override


def test_another_generated_task_or_environment_tasks_drop_the_default_validation():
    cfg = load_config(SFTConfig, None, ["data.train.reasoning_gym.task=chain_sum"])
    assert cfg.data.train.reasoning_gym.task == "chain_sum" and cfg.data.validation is None
    cfg = load_config(
        GRPOConfig,
        None,
        [
            "data.train.reasoning_gym=null",
            "data.train.environment_tasks.size=8",
            "environment.name=sliding_puzzle",
            "environment.max_turns=50",
        ],
    )
    assert cfg.data.validation is None


def test_a_recipe_file_and_validation_null_and_an_explicit_recipe(tmp_path):
    (tmp_path / "own.yaml").write_text("data:\n  train:\n    path: my.jsonl\n")
    assert load_config(SFTConfig, tmp_path / "own.yaml").data.validation is None
    (tmp_path / "both.yaml").write_text(
        "data:\n  train: {path: my.jsonl}\n  validation: {path: my_val.jsonl, max_samples: 4}\n"
    )
    validation = load_config(SFTConfig, tmp_path / "both.yaml").data.validation
    assert (validation.path, validation.max_samples) == ("my_val.jsonl", 4)


def test_constructed_configs_follow_the_same_rule():
    """pydantic construction (the Python API's config objects) drops the default validation too."""
    assert SFTDataConfig(train=DatasetConfig(path="my.jsonl")).validation is None
    assert SFTConfig(data={"train": {"path": "my.jsonl"}}).data.validation is None
    assert GRPOConfig(data={"train": {"path": "my.jsonl"}}).data.validation is None
    assert DPOConfig(data={"train": {"path": "pairs.jsonl"}}).data.validation is None
    kept = SFTDataConfig(train=DatasetConfig(path="a.jsonl"), validation=DatasetConfig(path="b.jsonl"))
    assert kept.validation.path == "b.jsonl"
    # not naming a source of one's own keeps the default
    assert SFTDataConfig(overlong="drop").validation is not None
