"""PPOConfig: defaults, the checks that stop a run that could not work, the critic's policy config."""

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.config.ppo import PPOConfig
from posttrain.config.rl import RLLoopConfig


def test_defaults_one_sample_per_prompt_and_the_shared_loop_name():
    cfg = PPOConfig()
    # the loop section is PPO's own, an RLLoopConfig (no `grpo` alias: #31)
    assert cfg.ppo.generations_per_prompt == 1 and isinstance(cfg.ppo, RLLoopConfig)
    critic = cfg.critic.policy_config(cfg.policy)
    assert critic.model_name == cfg.policy.model_name and critic.optimizer.lr == cfg.critic.optimizer.lr
    assert critic.max_seq_len == cfg.policy.max_seq_len


def test_dynamic_sampling_and_async_rollouts_are_rejected():
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        load_config(PPOConfig, None, ["dapo.dynamic_sampling=true"])
    with pytest.raises(ConfigError, match="async_mode"):
        load_config(PPOConfig, None, ["ppo.async_mode=true", "generation.placement=split"])


def test_minibatches_must_split_over_policy_and_critic_workers():
    load_config(PPOConfig, None, ["ppo.prompts_per_step=8", "ppo.updates_per_batch=3"])  # one worker: fine
    with pytest.raises(ConfigError, match="critic worker"):
        load_config(
            PPOConfig,
            None,
            ["ppo.prompts_per_step=6", "critic.placement=split", "critic.num_workers=4"],
        )
    with pytest.raises(ConfigError, match="policy worker"):
        load_config(PPOConfig, None, ["ppo.prompts_per_step=6", "cluster.num_workers=4"])


def test_grpo_only_keys_are_unknown():
    with pytest.raises(ConfigError, match="unknown key `advantage.leave_one_out`"):
        load_config(PPOConfig, None, ["advantage.leave_one_out=true"])
    with pytest.raises(ConfigError, match="advantage.estimator"):  # PPO's are gae and raw_reward only
        load_config(PPOConfig, None, ["advantage.estimator=grpo"])
