"""The episode token budget (issue #29, item 4): DAPO's soft overlong penalty and Dr.GRPO's normaliser
measure an episode's generated tokens over all its turns, so they compare them with a budget for the
whole episode (generation.max_episode_tokens, else environment.max_turns × generation.max_new_tokens),
not with one turn's max_new_tokens; configurations where the budget and its limits disagree fail."""

from __future__ import annotations

import pytest
import torch

from posttrain.config.rollout import episode_token_budget
from posttrain.data.trajectory import EpisodeLimits, Trajectory
from posttrain.generation.sampling import SamplingParams
from posttrain.rollout.continuous import turn_budget
from posttrain.rollout.rollout import RLBatch, Rollouts
from posttrain.trainers.grpo import GRPOTrainer
from posttrain.trainers.rl.batch import loss_normalizers, shaped_rewards


def _cfg(**overrides):
    from conftest import grpo_test_config

    return grpo_test_config("m", "r", **overrides)


def _trainer(**overrides) -> GRPOTrainer:
    trainer = object.__new__(GRPOTrainer)
    trainer.cfg = _cfg(**overrides)
    return trainer


def _episodes(lengths: list[int]) -> Rollouts:
    """Episodes with `lengths` generated tokens each (reward 0), one group."""
    trajectories = [
        Trajectory([0] * (n + 1), [0] + [1] * n, [0.0] * (n + 1), [], {}, group_id=0) for n in lengths
    ]
    return Rollouts(trajectories, {})


MULTI = {"environment.max_turns": 3, "generation.max_new_tokens": 128, "policy.max_seq_len": 512}


def test_the_budget_defaults_to_max_turns_times_max_new_tokens():
    cfg = _cfg(**MULTI)
    assert episode_token_budget(cfg.generation, cfg.environment) == 384
    cfg = _cfg(**MULTI, **{"generation.max_episode_tokens": 200})
    assert episode_token_budget(cfg.generation, cfg.environment) == 200
    cfg = _cfg()  # one turn: max_new_tokens
    assert episode_token_budget(cfg.generation, cfg.environment) == 12


def test_overlong_shaping_of_a_multi_turn_episode_uses_the_episode_budget():
    # 3 turns of 100 tokens = 300 generated, max_new_tokens 128: before, L = 300 > 128 gave -1.0.
    # Budget 3 x 128 = 384, buffer 64: the penalty runs over (320, 384]:
    #   L = 300 -> 0;  L = 352 -> (320 - 352) / 64 = -0.5;  L = 384 -> -1.0 ... (384 - 64 - 384) / 64
    trainer = _trainer(**MULTI, **{"dapo.overlong_buffer": 64})
    assert shaped_rewards(trainer.cfg, _episodes([300, 352, 384])).tolist() == [0.0, -0.5, -1.0]
    # an explicit budget of 320: the buffer is (256, 320]: L = 300 -> (256 - 300) / 64 = -0.6875
    trainer = _trainer(**MULTI, **{"dapo.overlong_buffer": 64, "generation.max_episode_tokens": 320})
    assert shaped_rewards(trainer.cfg, _episodes([300, 256])).tolist() == [-0.6875, 0.0]


def test_single_turn_overlong_shaping_is_unchanged():
    # max_new_tokens 128, one turn, buffer 64: (64, 128]; L = 100 -> (64 - 100) / 64 = -0.5625
    trainer = _trainer(
        **{"generation.max_new_tokens": 128, "dapo.overlong_buffer": 64, "policy.max_seq_len": 256}
    )
    assert shaped_rewards(trainer.cfg, _episodes([64, 100, 128])).tolist() == [0.0, -0.5625, -1.0]


def test_dr_grpo_normaliser_uses_the_episode_budget():
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    batch = RLBatch(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long), mask)
    overrides = {"advantage.estimator": "dr_grpo", "loss.aggregation": "seq_mean_token_sum"}
    cfg = _cfg(**MULTI, **overrides)  # 2 sequences x 384 (before: 2 x 128)
    assert loss_normalizers(cfg, batch) == (768.0, 3.0)
    cfg = _cfg(**overrides)  # one turn of 12: 2 x 12, as before
    assert loss_normalizers(cfg, batch) == (24.0, 3.0)


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"generation.max_episode_tokens": 100}, "between one turn"),  # below max_new_tokens 128
        ({"generation.max_episode_tokens": 385}, "between one turn"),  # above 3 x 128
        ({"dapo.overlong_buffer": 385}, "longer than the episode token budget 384"),
        ({"dapo.overlong_buffer": 201, "generation.max_episode_tokens": 200}, "overlong_buffer=201"),
    ],
)
def test_a_budget_that_disagrees_with_its_limits_is_a_config_error(overrides, match):
    with pytest.raises(ValueError, match=match):
        _cfg(**MULTI, **overrides)


def test_single_turn_budget_and_buffer_limits():
    _cfg(**{"generation.max_episode_tokens": 12, "dapo.overlong_buffer": 12})  # one turn: exactly
    with pytest.raises(ValueError, match="between one turn"):
        _cfg(**{"generation.max_episode_tokens": 13})
    with pytest.raises(ValueError, match="overlong_buffer=13"):
        _cfg(**{"dapo.overlong_buffer": 13})  # before: accepted, then a ValueError at the first step


def test_a_continuous_turn_is_cut_to_what_is_left_of_the_budget():
    t = Trajectory([0] * 51, [0] + [1] * 50, [0.0] * 51, [], {}, group_id=0)  # 50 generated so far
    params = SamplingParams(max_new_tokens=32)
    assert turn_budget(t, params, EpisodeLimits(3, 400)) == 32
    assert turn_budget(t, params, EpisodeLimits(3, 400, max_episode_tokens=70)) == 20
    assert turn_budget(t, params, EpisodeLimits(3, 60, max_episode_tokens=70)) == 9  # max_seq_len first
