"""GDPO, the multi-reward advantage estimator (issue #35 item 10): hand-worked values in float64,
NeMo RL's test cases, the named reward components from the environment through the rollout to the
trainer, and the math_format environment's red-team set."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from posttrain.algorithms.advantages import gdpo_advantages, grpo_advantages
from posttrain.algorithms.estimators import (
    AdvantageInputs,
    estimate_advantages,
    gdpo_weights,
    on_trainable_rows,
)
from posttrain.config.loss import AdvantageConfig
from posttrain.config.rl import GRPOConfig
from posttrain.data.trajectory import Trajectory
from posttrain.environments.interface import EnvStepResult
from posttrain.rollout.rollout import Rollouts

ONE_GROUP = torch.zeros(3, dtype=torch.long)


def _gdpo(columns, groups=ONE_GROUP, **kw) -> list[float]:
    components = torch.tensor(columns, dtype=torch.float64).T  # [N, K] from K columns
    return gdpo_advantages(
        torch.zeros(len(groups), dtype=torch.float64), groups, components=components, **kw
    ).tolist()


def test_gdpo_hand_worked():
    # one group of 3, correct c = [1, 0, 0], format f = [0.2, 0.2, 0]
    #   c: mean 1/3, deviations [2/3, -1/3, -1/3], Bessel std s = sqrt(1/3)
    #   f: mean 2/15, deviations [1/15, 1/15, -2/15], std 0.2 s
    # eps = 0: A_c = [2, -1, -1] / (3 s), A_f = [1, 1, -2] / (3 s), S = [1, 0, -1] / s,
    # batch mean 0, Bessel std 1 / s -> A = [1, 0, -1]: the format part counts as much as correctness
    c, f = [1.0, 0.0, 0.0], [0.2, 0.2, 0.0]
    assert _gdpo([c, f], eps=0.0) == pytest.approx([1.0, 0.0, -1.0], rel=1e-15, abs=1e-15)
    # eps = 1e-6 (the default) enters each component's std
    s = math.sqrt(1 / 3)
    a, u = (1 / 3) / (s + 1e-6), (1 / 15) / (0.2 * s + 1e-6)
    total = [2 * a + u, -a + u, -a - 2 * u]
    std = math.sqrt(sum(x * x for x in total) / 2)  # mean: (2a - a - a + u + u - 2u) / 3 = 0
    assert _gdpo([c, f]) == pytest.approx([x / std for x in total], rel=1e-12)
    # GRPO on the sum r = [1.2, 0.2, 0]: mean 1.4 / 3, so the wrong-but-formatted sample gets
    # (0.2 - 1.4 / 3) / std < 0: the format reward drowns in the spread of the sum
    dev = [1.2 - 1.4 / 3, 0.2 - 1.4 / 3, -1.4 / 3]
    grpo = grpo_advantages(torch.tensor([1.2, 0.2, 0.0], dtype=torch.float64), ONE_GROUP, eps=0.0)
    assert grpo.tolist() == pytest.approx(
        [d / math.sqrt(sum(x * x for x in dev) / 2) for d in dev], rel=1e-12
    )
    assert grpo[1] < 0


def test_gdpo_nemo_rl_cases():
    # NeMo RL's test_gdpo_advantage_estimator_multiple_rewards: one group of 2, correctness [1, 1]
    # (no spread: 0), integer [1, -1], format [1, 0]: both ±1 / (std + eps); the batch normalisation
    # of ±S over 2 samples gives ±1/√2 whatever S
    two = torch.zeros(2, dtype=torch.long)
    got = _gdpo([[1.0, 1.0], [1.0, -1.0], [1.0, 0.0]], groups=two)
    assert got == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)], rel=1e-12)
    # ..._single_reward: one component is an error
    with pytest.raises(ValueError, match="two reward components"):
        _gdpo([[1.0, 3.0]], groups=two)
    # ..._reward_weights: a uniform scale changes nothing; other weights do; one weight per component
    cols = [[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    default = _gdpo(cols)
    assert _gdpo(cols, weights=[2.0, 2.0]) == pytest.approx(default, rel=1e-12)
    assert _gdpo(cols, weights=[1.0, 0.25]) != pytest.approx(default, abs=1e-3)
    with pytest.raises(ValueError, match="1 GDPO weights for 2"):
        _gdpo(cols, weights=[1.0])


def test_gdpo_boundary_cases():
    # no spread anywhere: S = 0, batch std 0 -> A = S - mean = 0 (NeMo RL's std > 0 branch)
    assert _gdpo([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]) == [0.0, 0.0, 0.0]
    # a group with no spread keeps A = 0 (the group-mean baseline centres every group, so the
    # batch mean is 0) and counts in the batch std: S = [2k, -2k, 0, 0] -> ±2k / sqrt(8k² / 3)
    groups = torch.tensor([0, 0, 1, 1])
    got = _gdpo([[1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]], groups=groups)
    assert got == pytest.approx([math.sqrt(1.5), -math.sqrt(1.5), 0.0, 0.0], rel=1e-12)
    # a batch of one sample: 0
    assert _gdpo([[1.0], [0.5]], groups=torch.zeros(1, dtype=torch.long)) == [0.0]
    # unscored samples, and groups left with < 2 scored, are out of every statistic (on_trainable_rows)
    comps = torch.tensor([[1.0, 0.2], [0.0, 0.2], [0.0, 0.0], [1.0, 0.2], [0.0, 0.0]], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1])
    scored = torch.tensor([True, True, True, True, False])
    inputs = AdvantageInputs(comps.sum(1), groups, scored=scored, components=comps)
    out = on_trainable_rows(
        inputs, lambda x: gdpo_advantages(x.rewards, x.group_ids, components=x.components, eps=0.0)
    )
    assert out.tolist() == pytest.approx([1.0, 0.0, -1.0, 0.0, 0.0], rel=1e-12, abs=1e-12)


def test_gdpo_in_the_trainer_and_config():
    # estimate_advantages: the components by name, weighted by name; the scalar reward is not used
    names, comps = (
        ["correct", "format"],
        torch.tensor([[1.0, 0.2], [0.0, 0.2], [0.0, 0.0]], dtype=torch.float64),
    )
    rewards = torch.tensor([9.0, 9.0, 9.0], dtype=torch.float64)
    cfg = AdvantageConfig(estimator="gdpo", reward_weights={"format": 1.0, "correct": 1.0})
    named = AdvantageInputs(rewards, ONE_GROUP, components=comps, component_names=tuple(names))
    got = estimate_advantages(cfg, named)
    assert got.tolist() == pytest.approx(_gdpo([[1.0, 0.0, 0.0], [0.2, 0.2, 0.0]]), rel=1e-15)
    weighted = estimate_advantages(
        AdvantageConfig(estimator="gdpo", reward_weights={"correct": 1.0, "format": 0.0}), named
    )
    a = 2 / 3, -1 / 3, -1 / 3  # correct alone: its deviations, batch-normalised (eps cancels out)
    assert weighted.tolist() == pytest.approx(
        [x / math.sqrt(sum(y * y for y in a) / 2) for x in a], rel=1e-12
    )
    assert gdpo_weights(names, None) == [1.0, 1.0] and gdpo_weights(names, {"format": 2, "correct": 3}) == [
        3,
        2,
    ]
    with pytest.raises(ValueError, match="one weight per component"):
        gdpo_weights(names, {"correct": 1.0})
    with pytest.raises(ValueError, match="at least two named reward"):
        gdpo_weights(["correct"], None)
    # gdpo takes the components as they come: shaping of the scalar reward is refused
    gdpo = {"estimator": "gdpo"}
    for key, bad in (
        ("advantage.reward_scaling.enabled", {"advantage": {**gdpo, "reward_scaling": {"enabled": True}}}),
        ("dapo.stop_properly_penalty_coef", {"advantage": gdpo, "dapo": {"stop_properly_penalty_coef": 0.5}}),
        ("dapo.overlong_buffer", {"advantage": gdpo, "dapo": {"overlong_buffer": 8}}),
        ("loss.kl_in_reward", {"advantage": gdpo, "loss": {"kl_in_reward": True, "kl_beta": 0.1}}),
    ):
        with pytest.raises(ValueError, match=f"gdpo normalises.*{key}"):
            GRPOConfig(**bad)
    assert GRPOConfig(advantage=gdpo).advantage.estimator == "gdpo"
    # the default estimator ignores the components: today's grpo numbers
    plain = estimate_advantages(
        AdvantageConfig(), dataclasses.replace(named, rewards=torch.tensor([1.2, 0.2, 0.0]))
    )
    assert torch.equal(plain, grpo_advantages(torch.tensor([1.2, 0.2, 0.0]), ONE_GROUP))


def test_reward_components_from_the_environment_to_the_rollouts():
    from posttrain.data.trajectory import EpisodeLimits
    from posttrain.rollout.episode import apply_step

    # the environment's contract: reward = the sum of its components (NeMo RL's tolerance)
    EnvStepResult([1.2], [None], [True], [{}], reward_components=[{"correct": 1.0, "format": 0.2}])
    with pytest.raises(ValueError, match="sum to 1.0"):
        EnvStepResult([1.2], [None], [True], [{}], reward_components=[{"correct": 1.0}])
    assert EnvStepResult([0.5], [None], [True], [{}]).reward_components == [{}]  # default: none
    both = EnvStepResult.concat(
        [EnvStepResult([0.2], [None], [True], [{}], reward_components=[{"format": 0.2}]),
         EnvStepResult([0.0], [None], [True], [{}])]
    )  # fmt: skip
    assert both.reward_components == [{"format": 0.2}, {}]

    # a trajectory sums each component over its turns, like its reward
    t = Trajectory([1], [0], [0.0], [], {}, 0)
    limits = EpisodeLimits(max_turns=3, max_seq_len=100)
    t.turn_spans.append((1, 1))
    step = EnvStepResult([0.25], [None], [True], [{}], reward_components=[{"format": 0.25}])
    apply_step(t, step, 0, [], tokenizer=None, limits=limits)
    assert t.reward == 0.25 and t.reward_components == {"format": 0.25}

    def traj(reward, parts, scored=True):
        return Trajectory([1], [0], [0.0], [], {}, 0, reward=reward, reward_components=parts, scored=scored)

    # names sorted over all episodes; a part an episode lacks counts 0 (cut before the scoring turn)
    names, matrix = Rollouts(
        [traj(1.2, {"format": 0.2, "correct": 1.0}), traj(0.0, {}), traj(0.0, {}, scored=False)], {}
    ).reward_components()
    assert names == ["correct", "format"] and matrix.tolist() == [[1.0, 0.2], [0.0, 0.0], [0.0, 0.0]]
    with pytest.raises(ValueError, match="no component names"):  # a turn paid 0.5 outside the components
        Rollouts([traj(1.2, {"format": 0.2, "correct": 1.0}), traj(0.5, {})], {}).reward_components()
    assert Rollouts([traj(0.5, {})], {}).reward_components()[0] == []


# --- the math_format environment ---------------------------------------------------------------


@pytest.fixture(scope="module")
def env():
    from posttrain.environments.math_format import MathFormatEnvironment

    env = MathFormatEnvironment(format_weight=0.2, timeout_s=5.0)
    yield env
    env.close()


@pytest.mark.slow
def test_math_format_red_team(env):
    # MathEnvironment's red-team replies: what scores 0 there scores 0 in both parts; its partial
    # credit is the format part alone; a right answer earns both: no path pays more than answering right
    from test_math_redteam import NUMERIC, NUMERIC_QUESTION, SYMBOLIC, SYMBOLIC_QUESTION

    expected = {0.0: (0.0, 0.0), 0.1: (0.0, 0.2), 1.0: (1.0, 0.2)}
    for question, answer, replies in (
        (NUMERIC_QUESTION, "7", NUMERIC),
        (SYMBOLIC_QUESTION, "2\\sqrt{2}", SYMBOLIC),
    ):
        logs = [[{"role": "user", "content": question}, {"role": "assistant", "content": r}] for r in replies]
        result = env.step(logs, [{"answer": answer}] * len(logs))
        got = {r: (p["correct"], p["format"]) for r, p in zip(replies, result.reward_components, strict=True)}
        wrong = {r: v for r, v in got.items() if v != expected[replies[r]]}
        assert wrong == {}
        assert result.rewards == [c + f for c, f in got.values()]
        assert max(result.rewards) == 1.2
    metrics = env.batch_metrics(result)
    assert metrics["env/format_rate"] == pytest.approx(4 / len(SYMBOLIC))
    with pytest.raises(ValueError, match="format_weight"):
        type(env)(format_weight=0.0)
