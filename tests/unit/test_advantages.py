import math
import statistics

import pytest
import torch

from posttrain.algorithms.advantages import (
    clip_advantages,
    dr_grpo_advantages,
    group_range,
    group_statistics,
    grpo_advantages,
    kl_penalized_returns,
    kl_penalized_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
    scale_rewards,
    trainable_samples,
)
from posttrain.algorithms.estimators import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    advantage_estimator,
    estimate_advantages,
)
from posttrain.config.loss import AdvantageConfig


def _close(actual: torch.Tensor, expected: list[float], tol: float = 1e-5) -> None:
    assert actual.tolist() == pytest.approx(expected, abs=tol)


# --- hand-worked cases -------------------------------------------------------------------------
# One group, rewards r = [1, 0, 0.5]:
#   mean = 0.5, deviations = [0.5, -0.5, 0]
#   sample std (Bessel) = sqrt((0.25 + 0.25 + 0) / (3 - 1)) = 0.5
#   (population std would be sqrt(0.5 / 3) = 0.408 and give A = [1.225, -1.225, 0])
R3 = torch.tensor([1.0, 0.0, 0.5])
ONE_GROUP = torch.tensor([0, 0, 0])


def test_grpo_one_group_uses_sample_std():
    # A = deviations / 0.5 = [1, -1, 0]
    _close(grpo_advantages(R3, ONE_GROUP, eps=0.0), [1.0, -1.0, 0.0])
    # eps enters the denominator: 0.5 / (0.5 + 0.5) = 0.5
    _close(grpo_advantages(R3, ONE_GROUP, eps=0.5), [0.5, -0.5, 0.0])


def test_grpo_without_std_is_dr_grpo():
    # A = r - mean = [0.5, -0.5, 0]
    _close(grpo_advantages(R3, ONE_GROUP, normalize_std=False), [0.5, -0.5, 0.0])
    _close(dr_grpo_advantages(R3, ONE_GROUP), [0.5, -0.5, 0.0])


def test_leave_one_out_and_rloo():
    # baselines = mean of the others: (0 + 0.5)/2 = 0.25, (1 + 0.5)/2 = 0.75, (1 + 0)/2 = 0.5
    # A = [1 - 0.25, 0 - 0.75, 0.5 - 0.5] = [0.75, -0.75, 0] = 3/2 * (r - mean)
    _close(rloo_advantages(R3, ONE_GROUP), [0.75, -0.75, 0.0])
    _close(grpo_advantages(R3, ONE_GROUP, leave_one_out=True, normalize_std=False), [0.75, -0.75, 0.0])
    # with std normalisation: divided by the whole group's sample std 0.5 -> [1.5, -1.5, 0]
    _close(grpo_advantages(R3, ONE_GROUP, leave_one_out=True, eps=0.0), [1.5, -1.5, 0.0])


def test_non_contiguous_groups_of_unequal_size():
    # rewards [2, 4, 9], groups [5, 1, 5]: group 5 = {2, 9}, group 1 = {4} (a singleton)
    #   group 5: mean 5.5, deviations [-3.5, 3.5], sample std = sqrt(2 * 12.25 / 1) = 4.9497
    #   GRPO: [-3.5 / 4.9497, 0 (singleton: r - mean = 0), 3.5 / 4.9497] = [-0.70711, 0, 0.70711]
    r = torch.tensor([2.0, 4.0, 9.0])
    g = torch.tensor([5, 1, 5])
    _close(grpo_advantages(r, g, eps=0.0), [-0.70711, 0.0, 0.70711])
    # Dr.GRPO: [-3.5, 0, 3.5]; RLOO: [2 - 9, 0 (singleton), 9 - 2] = [-7, 0, 7]
    _close(dr_grpo_advantages(r, g), [-3.5, 0.0, 3.5])
    _close(rloo_advantages(r, g), [-7.0, 0.0, 7.0])
    # leave-one-out GRPO: singleton gets 0, not NaN
    _close(grpo_advantages(r, g, leave_one_out=True, eps=0.0), [-7 / 4.94975, 0.0, 7 / 4.94975])


def test_group_statistics_hand_worked():
    r = torch.tensor([2.0, 4.0, 9.0])
    stats = group_statistics(r, torch.tensor([5, 1, 5]))
    _close(stats.count, [2.0, 1.0, 2.0])
    _close(stats.sum, [11.0, 4.0, 11.0])
    _close(stats.mean, [5.5, 4.0, 5.5])
    _close(stats.std, [4.94975, 0.0, 4.94975])


def test_reinforce_pp_uses_batch_not_group_baseline():
    # rewards [1, 0, 2], groups [0, 0, 1]
    # batch: mean 1, deviations [0, -1, 1], sample std sqrt(2 / 2) = 1 -> A = [0, -1, 1]
    # (GRPO per group would give [0.707, -0.707, 0])
    r = torch.tensor([1.0, 0.0, 2.0])
    g = torch.tensor([0, 0, 1])
    _close(reinforce_pp_advantages(r, g, eps=0.0), [0.0, -1.0, 1.0])
    # REINFORCE++-baseline: group means [0.5, 0.5, 2] -> a = [0.5, -0.5, 0];
    # batch-normalised: mean 0, sample std sqrt(0.5 / 2) = 0.5 -> [1, -1, 0]
    _close(reinforce_pp_advantages(r, g, group_baseline=True, eps=0.0), [1.0, -1.0, 0.0])


def test_integer_and_bool_rewards_are_accepted():
    out = grpo_advantages(torch.tensor([True, False, True, False]), torch.tensor([0, 0, 0, 0]), eps=0.0)
    # mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735
    assert out.dtype == torch.float32
    _close(out, [0.86603, -0.86603, 0.86603, -0.86603])


def test_equal_rewards_give_zero_advantage_not_nan():
    out = grpo_advantages(torch.tensor([1.0, 1.0, 1.0]), ONE_GROUP)
    assert out.tolist() == [0.0, 0.0, 0.0]


# --- zero-variance groups: exactly 0, whatever float rounding does ------------------------------
GROUP_ESTIMATORS = {
    "grpo": lambda r, g: grpo_advantages(r, g),
    "grpo_eps0": lambda r, g: grpo_advantages(r, g, eps=0.0),
    "grpo_loo": lambda r, g: grpo_advantages(r, g, leave_one_out=True),
    "grpo_loo_std": lambda r, g: grpo_advantages(r, g, leave_one_out=True, leave_one_out_std=True),
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
}


@pytest.mark.parametrize("name", list(GROUP_ESTIMATORS))
@pytest.mark.parametrize("G", [3, 7, 8, 16, 64])
@pytest.mark.parametrize("value", [0.1, 0.3, 0.7])
def test_equal_inexact_rewards_give_exactly_zero(value, G, name):
    # G float32 copies of 0.1 (the math environment's format reward) sum to a mean that is not
    # exactly 0.1: the old std > 0 test divided a ~1e-9 deviation by a ~1e-9 std (G = 8: -0.0074)
    rewards = torch.full((G,), value, dtype=torch.float32)
    groups = torch.zeros(G, dtype=torch.long)
    out = GROUP_ESTIMATORS[name](rewards, groups)
    assert out.dtype == torch.float32
    assert out.tolist() == [0.0] * G
    # next to a group with spread, in a shuffled batch, the constant group still gets 0
    mixed = torch.cat([rewards, torch.tensor([1.0, 0.1, 0.1])])
    ids = torch.cat([groups, torch.ones(3, dtype=torch.long)])
    perm = torch.randperm(G + 3, generator=torch.Generator().manual_seed(G))
    out = GROUP_ESTIMATORS[name](mixed[perm], ids[perm])
    assert (out[ids[perm] == 0] == 0).all()
    assert (out[ids[perm] == 1] != 0).any()


def test_group_range_is_exact():
    r = torch.full((8,), 0.1)
    assert group_statistics(r, torch.zeros(8, dtype=torch.long)).std.max() >= 0  # may be ~1e-9
    assert group_range(r, torch.zeros(8, dtype=torch.long)).tolist() == [0.0] * 8
    assert group_range(torch.tensor([1.0, 0.5, 2.0]), torch.tensor([3, 3, 4])).tolist() == [0.5, 0.5, 0.0]


def test_leave_one_out_std_hand_worked():
    # NeMo RL's default: baseline AND std of the other G - 1 samples (Bessel, G - 2)
    # r = [1, 0, 0.5]:
    #   i=0: others [0, 0.5]: b = 0.25, s = sqrt((0.25^2 + 0.25^2) / 1) = 0.353553 -> 0.75 / s = 2.12132
    #   i=1: others [1, 0.5]: b = 0.75, s = 0.353553 -> -0.75 / s = -2.12132
    #   i=2: others [1, 0]:   b = 0.5,  s = 0.707107 -> 0
    _close(grpo_advantages(R3, ONE_GROUP, leave_one_out=True, leave_one_out_std=True, eps=0.0),
           [2.12132, -2.12132, 0.0])  # fmt: skip
    # r = [1, 0, 0, 0]:
    #   i=0: others [0, 0, 0]: b = 0, s = 0 -> undivided r - b = 1 (NeMo RL: no sharpening)
    #   i>0: others [1, 0, 0]: b = 1/3, s = sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) -> -0.57735
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    _close(grpo_advantages(r, torch.zeros(4, dtype=torch.long), leave_one_out=True, leave_one_out_std=True, eps=0.0),
           [1.0, -0.57735, -0.57735, -0.57735])  # fmt: skip
    # G = 2: one other sample, no std: r - b undivided
    _close(grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), leave_one_out=True,
                           leave_one_out_std=True), [1.0, -1.0])  # fmt: skip
    with pytest.raises(ValueError, match="leave_one_out"):
        grpo_advantages(R3, ONE_GROUP, leave_one_out_std=True)


def _nemo_rl_baseline_and_std(rewards: list[float], groups: list[int]) -> list[float]:
    """NeMo RL's calculate_baseline_and_std_per_prompt (leave-one-out) and advantage rule, written
    out per group with the (1 - I) mask matrix, in float64: the reference for leave_one_out_std."""
    r = torch.tensor(rewards, dtype=torch.float64)
    g = torch.tensor(groups)
    out = torch.zeros_like(r)
    for gid in g.unique():
        idx = (g == gid).nonzero().flatten()
        n = len(idx) - 1
        if n < 1:
            continue  # NeMo RL: baseline = reward -> advantage 0
        others = 1 - torch.eye(len(idx), dtype=torch.float64)
        base = others @ r[idx] / n
        sq = others @ r[idx] ** 2 / n
        std = ((sq - base**2) * (n / (n - 1) if n > 1 else float("inf"))).sqrt().nan_to_num(0.0)
        adv = r[idx] - base
        adv = torch.where(std > 1e-9, adv / (std + 1e-6), adv)  # (NeMo RL tests std > 0, see above)
        out[idx] = adv
    return out.tolist()


# --- vectorised vs a plain per-group loop ------------------------------------------------------


def _loop_reference(rewards: list[float], groups: list[int], name: str) -> list[float]:
    members: dict[int, list[int]] = {}
    for i, gid in enumerate(groups):
        members.setdefault(gid, []).append(i)
    out = [0.0] * len(rewards)
    eps = 1e-6
    if name == "reinforce_pp":
        mean = statistics.fmean(rewards)
        std = statistics.stdev(rewards)
        return [(r - mean) / (std + eps) for r in rewards]
    for idx in members.values():
        vals = [rewards[i] for i in idx]
        mean = statistics.fmean(vals)
        std = statistics.stdev(vals) if len(vals) > 1 else 0.0
        for i in idx:
            others = [rewards[j] for j in idx if j != i]
            loo = rewards[i] - statistics.fmean(others) if others else 0.0
            if name == "grpo":
                out[i] = (rewards[i] - mean) / (std + eps)
            elif name == "grpo_loo":
                out[i] = loo / (std + eps)
            elif name == "dr_grpo":
                out[i] = rewards[i] - mean
            elif name == "rloo":
                out[i] = loo
    return out


@pytest.mark.parametrize("name", ["grpo", "grpo_loo", "grpo_loo_std", "dr_grpo", "rloo", "reinforce_pp"])
def test_vectorised_matches_per_group_loop(name):
    gen = torch.Generator().manual_seed(0)
    # 60 samples over sparse, shuffled group ids (sizes 1..8), rewards partly binary, partly real
    sizes = [1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8]
    ids = [1000, 3, 77, 12, 5, 900, 41, 8, 64, 2, 33]
    groups = torch.tensor([gid for gid, n in zip(ids, sizes, strict=True) for _ in range(n)])
    groups = groups[torch.randperm(len(groups), generator=gen)]
    rewards = torch.where(
        torch.rand(len(groups), generator=gen) < 0.5,
        torch.randint(0, 2, (len(groups),), generator=gen).float(),
        torch.randn(len(groups), generator=gen, dtype=torch.float64).float(),
    ).double()
    if name == "grpo_loo":
        got = grpo_advantages(rewards, groups, leave_one_out=True)
    elif name == "grpo_loo_std":
        got = grpo_advantages(rewards, groups, leave_one_out=True, leave_one_out_std=True)
    else:
        knobs = {"minus_baseline": False} if name == "reinforce_pp" else {}  # the loop: the batch mean
        got = advantage_estimator(name)(
            AdvantageInputs(rewards, groups), AdvantageConfig(estimator=name, **knobs)
        )
    if name == "grpo_loo_std":
        expected = _nemo_rl_baseline_and_std(rewards.tolist(), groups.tolist())
    else:
        expected = _loop_reference(rewards.tolist(), groups.tolist(), name)
    assert got.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_registry_and_unknown_name():
    assert set(ADVANTAGE_ESTIMATORS) == GROUP_REWARD_NAMES | {"on_policy_distill", "gae", "raw_reward"}
    _close(estimate_advantages(AdvantageConfig(), AdvantageInputs(R3, ONE_GROUP)), [1.0, -1.0, 0.0])
    with pytest.raises(ValueError, match="Did you mean 'rloo'"):
        advantage_estimator("rlo")


def test_shape_errors():
    with pytest.raises(ValueError, match="group_ids shape"):
        grpo_advantages(R3, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"\[N\]"):
        grpo_advantages(R3.view(3, 1), ONE_GROUP.view(3, 1))
    with pytest.raises(ValueError, match="group_ids"):
        reinforce_pp_advantages(R3, None, group_baseline=True)


# --- the KL as a reward, reward scaling, advantage clipping -------------------------------------
# two sequences, per-token KL estimates, the 2nd sequence's last slot masked (padding):
#   seq 0: KL = [0.5, 1.0, 1.5], r = 1
#   seq 1: KL = [2.0, 1.0, 9.0 (masked)], r = 0
KL = torch.tensor([[0.5, 1.0, 1.5], [2.0, 1.0, 9.0]])
KL_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
KL_R = torch.tensor([1.0, 0.0])


def test_kl_penalized_rewards_sum_over_tokens():
    # r' = r - β Σ_t KL_t, β = 0.1: [1 - 0.1 * 3, 0 - 0.1 * 3] = [0.7, -0.3]
    _close(kl_penalized_rewards(KL_R, KL, KL_MASK, kl_beta=0.1), [0.7, -0.3])


def test_kl_penalized_returns_to_go():
    # G_t = r - β Σ_{s>=t} KL_s, β = 0.1:
    #   seq 0: KL still to come [3, 2.5, 1.5] -> [1 - 0.3, 1 - 0.25, 1 - 0.15] = [0.7, 0.75, 0.85]
    #   seq 1: [3, 1, (masked)] -> [-0.3, -0.1, 0]
    out = kl_penalized_returns(KL_R, KL, KL_MASK, kl_beta=0.1)
    assert out.tolist()[0] == pytest.approx([0.7, 0.75, 0.85])
    assert out.tolist()[1] == pytest.approx([-0.3, -0.1, 0.0])


def test_reinforce_pp_with_kl_reward_is_token_normalised():
    # batch baseline: a = r - mean(r) = [0.5, -0.5]; returns (β = 0.1) = a - 0.1 * KL-to-come:
    #   seq 0: [0.2, 0.25, 0.35]; seq 1: [-0.8, -0.6]   (5 valid tokens)
    # token mean = -0.6 / 5 = -0.12; deviations [0.32, 0.37, 0.47, -0.68, -0.48]
    # Bessel std = sqrt((0.1024 + 0.1369 + 0.2209 + 0.4624 + 0.2304) / 4) = sqrt(0.2883) = 0.536936
    out = reinforce_pp_advantages(KL_R, None, kl=KL, mask=KL_MASK, kl_beta=0.1, eps=0.0)
    std = math.sqrt(1.153 / 4)
    assert out.tolist()[0] == pytest.approx([0.32 / std, 0.37 / std, 0.47 / std])
    assert out.tolist()[1] == pytest.approx([-0.68 / std, -0.48 / std, 0.0])
    with pytest.raises(ValueError, match="mask"):
        reinforce_pp_advantages(KL_R, None, kl=KL)


def test_scale_rewards_and_clip_advantages():
    # NeMo RL's scaling: clamp to [0, 1], map onto [-1, 1]: r' = -1 + 2 clamp(r)
    r = torch.tensor([-0.5, 0.1, 1.0, 3.0])
    _close(scale_rewards(r, source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0),
           [-1.0, -0.8, 1.0, 1.0])  # fmt: skip
    with pytest.raises(ValueError, match="source_min"):
        scale_rewards(r, source_min=1.0, source_max=1.0, target_min=0.0, target_max=1.0)
    _close(clip_advantages(torch.tensor([-3.0, 0.5, 2.5]), 2.0), [-2.0, 0.5, 2.0])
    _close(clip_advantages(torch.tensor([-3.0, 0.5, 2.5]), None), [-3.0, 0.5, 2.5])


# --- unscored samples are out of every estimator (issue #29, item 2) -------------------------------
# Group 0: two judged replies, 0.8 and 0.9, beside two the judge could not score (reward 0,
# scored=False); group 1: one scored reply and three unscored: fewer than two scored, no baseline.
# Over group 0's scored samples only: mean 0.85, deviations -/+0.05, Bessel std
# sqrt((0.05^2 + 0.05^2) / (2 - 1)) = sqrt(0.005) = 0.0707107. (With the unscored zeros in the
# group: mean 0.425, std 0.4924, and GRPO gives +0.7615 / +0.9646: both "better than average".)
# Tolerance 1e-6: the fp32 inputs 0.8 / 0.9 are off by < 6e-8 each, which moves the normalised
# values by < 1e-9 (scale-free but for eps) and the unnormalised ones by < 1.2e-7; fp32 output < 1e-7.
UNSCORED_R = torch.tensor([0.8, 0.9, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
UNSCORED_G = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
UNSCORED_S = torch.tensor([True, True, False, False, True, False, False, False])
STD_089 = math.sqrt(0.005)
# (estimator, its knobs, more inputs, the first sample's advantage)
UNSCORED_CASES = [
    ("grpo", {}, {}, -0.05 / (STD_089 + 1e-6)),  # -0.7070968
    ("grpo", {"leave_one_out": True}, {}, -0.1 / (STD_089 + 1e-6)),  # 0.8 - 0.9 over the std
    ("grpo", {"leave_one_out": True, "leave_one_out_std": True}, {}, -0.1),  # G = 2: undivided
    ("grpo", {"normalize_std": False}, {}, -0.05),
    ("dr_grpo", {}, {}, -0.05),
    ("rloo", {}, {}, -0.1),
    (
        "reinforce_pp",
        {"minus_baseline": False},
        {},
        -0.05 / (STD_089 + 1e-6),
    ),  # batch of the two trainable samples
    ("reinforce_pp", {"minus_baseline": True}, {}, -0.05 / (STD_089 + 1e-6)),
    # components 0.8 / 0.9 and 0 / 1 in group 0: A = [-x - y, x + y] (x, y the two grpo values),
    # batch-normalised over the two trainable samples: mean 0, Bessel std sqrt(2) (x + y)
    (
        "gdpo",
        {},
        {"components": torch.stack([UNSCORED_R, torch.eye(8)[1]], dim=1), "component_names": ("a", "b")},
        -1 / math.sqrt(2),
    ),
]
GROUP_REWARD_NAMES = {"grpo", "dr_grpo", "rloo", "reinforce_pp", "gdpo"}
"""The registered estimators of group rewards (the others: the teacher's term and PPO's two)."""


def test_trainable_samples_are_scored_in_groups_with_two_scored():
    assert trainable_samples(UNSCORED_G, UNSCORED_S).tolist() == [True, True] + [False] * 6
    # non-contiguous groups, integer flags
    assert trainable_samples(torch.tensor([5, 2, 5, 2]), torch.tensor([1, 1, 1, 0])).tolist() == [
        True,
        False,
        True,
        False,
    ]


def test_without_scored_the_unscored_zeros_set_the_baseline():
    # the behaviour the scored mask fixes: the issue's +0.76 / +0.96
    r, g = UNSCORED_R[:4], UNSCORED_G[:4]
    _close(grpo_advantages(r, g)[:2], [0.375 / math.sqrt(0.2425), 0.475 / math.sqrt(0.2425)])


@pytest.mark.parametrize("name, knobs, inputs, first", UNSCORED_CASES)
def test_unscored_samples_are_out_of_every_estimator(name, knobs, inputs, first):
    cfg = AdvantageConfig(estimator=name, **knobs)
    out = estimate_advantages(cfg, AdvantageInputs(UNSCORED_R, UNSCORED_G, scored=UNSCORED_S, **inputs))
    assert out.dtype == torch.float32
    _close(out, [first, -first] + [0.0] * 6, tol=1e-6)
    # all scored: exactly the estimator's own result
    everyone = torch.ones(8, dtype=torch.bool)
    assert torch.equal(
        estimate_advantages(cfg, AdvantageInputs(UNSCORED_R, UNSCORED_G, scored=everyone, **inputs)),
        estimate_advantages(cfg, AdvantageInputs(UNSCORED_R, UNSCORED_G, **inputs)),
    )


def test_unscored_cases_cover_the_registry():
    assert {name for name, *_ in UNSCORED_CASES} == GROUP_REWARD_NAMES
    assert GROUP_REWARD_NAMES < set(ADVANTAGE_ESTIMATORS)


def test_unscored_samples_with_a_per_token_kl_reward():
    # reinforce_pp with kl [N, T] and mask [N, T]: only the trainable rows' tokens are normalised.
    # KL 0: per-token returns are the centred rewards -/+0.05 on 2 tokens each; over those 4 tokens
    # mean 0, Bessel std sqrt(4 * 0.05^2 / 3) = 0.0577350 -> -/+0.05 / 0.0577350 = -/+0.8660
    kl, mask = torch.zeros(8, 2), torch.ones(8, 2)
    inputs = AdvantageInputs(UNSCORED_R, UNSCORED_G, scored=UNSCORED_S, kl=kl, mask=mask, kl_beta=0.1)
    out = estimate_advantages(AdvantageConfig(estimator="reinforce_pp", minus_baseline=False), inputs)
    a = 0.05 / (math.sqrt(4 * 0.05**2 / 3) + 1e-6)
    assert out.shape == (8, 2)
    _close(out.flatten(), [-a, -a, a, a] + [0.0] * 12, tol=1e-6)


def test_nothing_trainable_gives_zeros():
    scored = torch.tensor([True, False, False, False, False, False, False, True])
    for name, knobs, inputs, _ in UNSCORED_CASES:
        cfg = AdvantageConfig(estimator=name, **knobs)
        out = estimate_advantages(cfg, AdvantageInputs(UNSCORED_R, UNSCORED_G, scored=scored, **inputs))
        assert out.tolist() == [0.0] * 8
