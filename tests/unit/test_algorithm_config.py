"""Algorithm settings in the config: the GSPO and Dr.GRPO recipes, and half-configured combinations
that warn (ConfigWarning) or fail (ConfigError) at load time."""

import warnings
from pathlib import Path

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.config.common import ConfigWarning
from posttrain.config.rl import GRPOConfig

EXAMPLES = Path(__file__).parents[2] / "examples" / "configs"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("grpo*.yaml")), ids=lambda p: p.name)
def test_grpo_recipes_load_without_warnings(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        load_config(GRPOConfig, path)


def test_gspo_recipe_has_the_papers_settings():
    cfg = load_config(GRPOConfig, EXAMPLES / "grpo_gspo.yaml")
    assert (cfg.loss.ratio_level, cfg.loss.aggregation) == ("sequence", "sequence")
    assert (cfg.loss.clip_low, cfg.loss.clip_high) == (3e-4, 4e-4)
    assert cfg.grpo.updates_per_batch == 4
    # everything else is the quickstart's (inherited through `defaults:`)
    base = load_config(GRPOConfig, EXAMPLES / "grpo_math.yaml")
    assert cfg.data == base.data and cfg.policy == base.policy and cfg.advantage == base.advantage


def test_dr_grpo_recipe_has_the_papers_settings():
    cfg = load_config(GRPOConfig, EXAMPLES / "grpo_dr_grpo.yaml")
    assert cfg.advantage.estimator == "dr_grpo"
    assert cfg.loss.aggregation == "seq_mean_token_sum" and cfg.loss.kl_beta == 0.0
    base = load_config(GRPOConfig, EXAMPLES / "grpo_math.yaml")
    assert cfg.data == base.data and cfg.policy == base.policy and cfg.grpo == base.grpo


def test_default_config_keeps_its_behaviour():
    loss = GRPOConfig().loss
    assert (loss.policy_loss, loss.kl_beta, loss.importance_correction) == ("clipped_pg", 0.0, None)
    assert loss.kl_gradient == "exact"  # changed on purpose: the KL term's gradient is now ∇KL(π||π_ref)
    adv = GRPOConfig().advantage
    assert (adv.estimator, adv.normalize_std, adv.leave_one_out, adv.clip) == ("grpo", True, False, None)
    assert not adv.reward_scaling.enabled


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"loss.ratio_level": "sequence", "loss.aggregation": "sequence"}, "3e-4"),
        (
            {"loss.ratio_level": "sequence", "loss.clip_low": 3e-4, "loss.clip_high": 4e-4},
            "aggregation=sequence",
        ),
        ({"advantage.estimator": "dr_grpo"}, "seq_mean_token_sum"),
        ({"advantage.estimator": "dr_grpo", "loss.aggregation": "sequence"}, "seq_mean_token_sum"),
        ({"loss.importance_correction": "truncated"}, "no effect"),
        ({"loss.importance_min": 0.5}, "importance_min"),
        ({"loss.kl_in_reward": True}, "kl_beta"),
        ({"advantage.estimator": "rloo", "advantage.leave_one_out": True}, "grpo only"),
    ],
)
def test_half_configured_combinations_warn(overrides, match):
    with pytest.warns(ConfigWarning, match=match):
        load_config(GRPOConfig, None, [f"{k}={v}" for k, v in overrides.items()])


@pytest.mark.parametrize(
    "overrides, match",
    [
        (
            {"loss.kl_beta": 0.1, "loss.kl_estimator": "k1", "loss.kl_gradient": "plain"},
            "zero expected gradient",
        ),
        ({"loss.policy_loss": "cispo", "loss.dual_clip": 3.0}, "cispo"),
        ({"loss.policy_loss": "cispo", "loss.ratio_level": "sequence"}, "cispo"),
        ({"loss.importance_correction": "icepop", "loss.importance_min": 3.0}, "importance_min"),
        ({"advantage.leave_one_out_std": True}, "leave_one_out"),
        ({"advantage.reward_scaling.enabled": True, "advantage.reward_scaling.source_max": -1}, "source_min"),
        ({"loss.kl_gradient": "reverse"}, "kl_gradient"),
    ],
)
def test_plainly_wrong_combinations_fail(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(GRPOConfig, None, [f"{k}={v}" for k, v in overrides.items()])


def test_supported_combinations_load_quietly():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        for overrides in (
            {"loss.policy_loss": "cispo", "loss.clip_low": 1.0, "loss.clip_high": 0.28},
            {"loss.kl_beta": 0.05, "loss.kl_in_reward": True, "advantage.estimator": "reinforce_pp"},
            {"loss.kl_beta": 0.05, "loss.kl_estimator": "k3", "loss.kl_gradient": "plain"},
            {"advantage.leave_one_out": True, "advantage.leave_one_out_std": True, "advantage.clip": 3.0},
            {
                "generation.backend": "vllm",
                "loss.importance_correction": "icepop",
                "loss.importance_min": 0.5,
                "loss.importance_cap": 5.0,
            },
        ):
            load_config(GRPOConfig, None, [f"{k}={v}" for k, v in overrides.items()])
