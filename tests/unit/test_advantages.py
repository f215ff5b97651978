import statistics

import pytest
import torch

from posttrain.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    dr_grpo_advantages,
    group_statistics,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)


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


@pytest.mark.parametrize("name", ["grpo", "grpo_loo", "dr_grpo", "rloo", "reinforce_pp"])
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
    else:
        got = compute_advantages(name, rewards, groups)
    expected = _loop_reference(rewards.tolist(), groups.tolist(), name)
    assert got.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_registry_and_unknown_name():
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "reinforce_pp"}
    _close(compute_advantages("grpo", R3, ONE_GROUP, eps=0.0), [1.0, -1.0, 0.0])
    with pytest.raises(ValueError, match="Did you mean 'rloo'"):
        compute_advantages("rlo", R3, ONE_GROUP)


def test_shape_errors():
    with pytest.raises(ValueError, match="group_ids shape"):
        grpo_advantages(R3, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"\[N\]"):
        grpo_advantages(R3.view(3, 1), ONE_GROUP.view(3, 1))
    with pytest.raises(ValueError, match="group_ids"):
        reinforce_pp_advantages(R3, None, group_baseline=True)
