"""REINFORCE with a moving-average baseline: the baseline's update and the advantages, hand-worked
in float64 (dyadic numbers: exact), and its config's checks (docs/architecture.md, "Add an RL
algorithm in one file")."""

import pytest
import torch

from posttrain.algorithms.advantages import baseline_advantages, moving_average_baseline
from posttrain.config import ConfigError, load_config
from posttrain.config.reinforce_ma import ReinforceMAConfig

R = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)  # mean 0.5


def test_the_baseline_moves_by_its_momentum_toward_the_batch_mean():
    # b <- m b + (1 - m) mean(r) = 0.75 * 0.25 + 0.25 * 0.5 = 0.1875 + 0.125
    assert moving_average_baseline(0.25, R, momentum=0.75) == 0.3125
    assert moving_average_baseline(0.25, R, momentum=0.0) == 0.5  # m = 0: the batch's mean


def test_the_first_batch_sets_the_baseline_to_its_own_mean_then_it_averages():
    b1 = moving_average_baseline(None, R, momentum=0.75)
    b2 = moving_average_baseline(b1, torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64), momentum=0.75)
    b3 = moving_average_baseline(b2, torch.zeros(3, dtype=torch.float64), momentum=0.75)
    assert (b1, b2, b3) == (0.5, 0.625, 0.46875)  # 0.75 * 0.5 + 0.25; 0.75 * 0.625


def test_unscored_samples_are_out_of_the_mean_and_a_batch_of_none_keeps_the_baseline():
    scored = torch.tensor([True, True, False])
    # mean over the scored (1.0, 0.5) = 0.75: 0.75 * 0.25 + 0.25 * 0.75
    assert moving_average_baseline(0.25, R, momentum=0.75, scored=scored) == 0.375
    assert moving_average_baseline(0.25, R, momentum=0.75, scored=torch.zeros(3, dtype=torch.bool)) == 0.25
    assert moving_average_baseline(None, R, momentum=0.75, scored=torch.zeros(3, dtype=torch.bool)) is None


def test_advantages_are_reward_minus_baseline_zero_for_unscored():
    a = baseline_advantages(R, 0.25)
    assert a.dtype == torch.float64 and a.tolist() == [0.75, 0.25, -0.25]
    assert baseline_advantages(R, None).tolist() == [0.5, 0.0, -0.5]  # first batch: its own mean
    scored = torch.tensor([True, True, False])
    assert baseline_advantages(R, 0.25, scored=scored).tolist() == [0.75, 0.25, 0.0]
    assert baseline_advantages(R, None, scored=scored).tolist() == [0.25, -0.25, 0.0]  # b = 0.75


def test_config_defaults_and_the_shared_rl_checks():
    cfg = load_config(ReinforceMAConfig, None, [])
    loop = cfg.reinforce_ma
    assert (loop.prompts_per_step, loop.generations_per_prompt, loop.baseline_momentum) == (32, 1, 0.9)
    with pytest.raises(ConfigError, match=r"reinforce_ma\.updates_per_batch=5"):  # check_rl_config
        load_config(
            ReinforceMAConfig, None, ["reinforce_ma.prompts_per_step=4", "reinforce_ma.updates_per_batch=5"]
        )
    with pytest.raises(ConfigError, match="baseline_momentum"):
        load_config(ReinforceMAConfig, None, ["reinforce_ma.baseline_momentum=1"])


def test_config_refuses_the_kl_in_the_reward():
    with pytest.raises(ConfigError, match="kl_in_reward"):
        load_config(ReinforceMAConfig, None, ["loss.kl_beta=0.1", "loss.kl_in_reward=true"])


def test_the_shared_truncated_sampling_check_runs_without_an_advantage_section():
    """check_rl_config's vLLM check once read cfg.advantage, which this config does not have."""
    vllm = ["generation.backend=vllm", "generation.top_p=0.9"]
    with pytest.raises(ConfigError, match="truncated distribution"):
        load_config(ReinforceMAConfig, None, [*vllm, "loss.importance_correction=plain"])
