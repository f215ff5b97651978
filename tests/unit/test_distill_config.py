"""DistillConfig: the recipe spells out the defaults; placements and batch splits are checked at load time."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.config.rl import DistillConfig

RECIPE = Path(__file__).parents[2] / "examples" / "configs" / "distill.yaml"


def test_recipe_spells_out_the_defaults():
    """`posttrain distill teacher.model_name=...` runs exactly examples/configs/distill.yaml."""
    recipe = load_config(DistillConfig, RECIPE).model_dump()
    default = DistillConfig().model_dump()
    recipe["logging"].pop("run_dir"), default["logging"].pop("run_dir")
    assert recipe == default
    assert default["teacher"]["model_name"] is None and default["distill"]["topk_logits_k"] == 64


def test_typos_and_bad_values_fail_at_load_time():
    with pytest.raises(ConfigError, match=r"Did you mean `distill.topk_logits_k`\?"):
        load_config(DistillConfig, None, ["distill.topk_logit_k=8"])
    with pytest.raises(ConfigError, match="distill.loss"):
        load_config(DistillConfig, None, ["distill.loss=kl"])
    with pytest.raises(ConfigError, match="distill.jsd_beta"):
        load_config(DistillConfig, None, ["distill.jsd_beta=1.0"])


def test_placements_and_batch_splits_are_checked():
    with pytest.raises(ConfigError, match="teacher.num_workers=2 with cluster.backend=local"):
        load_config(DistillConfig, None, ["cluster.backend=local", "teacher.num_workers=2"])
    with pytest.raises(
        ConfigError, match="distill.updates_per_batch=3 does not split the rollout batch of 32"
    ):
        load_config(DistillConfig, None, ["cluster.num_workers=2", "distill.updates_per_batch=3"])
    cfg = load_config(DistillConfig, None, ["cluster.num_workers=2", "distill.updates_per_batch=4"])
    assert cfg.distill.updates_per_batch == 4
