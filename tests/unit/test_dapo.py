import pytest
import torch

from posttrain.algorithms.dapo import overlong_filter_mask, overlong_reward_shaping, zero_variance_groups


def test_zero_variance_groups_non_contiguous():
    # group 3 = samples 0, 2, 3 with rewards [1, 1, 1] -> zero variance
    # group 9 = samples 1, 4 with rewards [0, 0.5]     -> has signal
    # group 4 = sample 5 alone                         -> zero variance (a singleton)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.7])
    groups = torch.tensor([3, 9, 3, 3, 9, 4])
    assert zero_variance_groups(rewards, groups).tolist() == [True, False, True, True, False, True]
    # the spread in group 9 is 0.5: within atol 0.5 it counts as constant
    assert zero_variance_groups(rewards, groups, atol=0.5).tolist() == [True] * 6
    assert zero_variance_groups(rewards, groups, atol=0.49).tolist()[1] is False


def test_zero_variance_groups_integer_rewards():
    assert zero_variance_groups(torch.tensor([1, 1, 0]), torch.tensor([0, 0, 1])).tolist() == [
        True,
        True,
        True,
    ]
    assert zero_variance_groups(torch.tensor([1, 0, 0]), torch.tensor([0, 0, 1])).tolist() == [
        False,
        False,
        True,
    ]


def test_overlong_filter_mask():
    assert overlong_filter_mask(torch.tensor([True, False, True])).tolist() == [False, True, False]
    assert overlong_filter_mask(torch.tensor([0, 1, 0])).tolist() == [True, False, True]


def test_overlong_reward_shaping_hand_worked():
    # max_len 10, buffer 4 -> the buffer is (6, 10]
    #   L = 5, 6  -> 0
    #   L = 7     -> (6 - 7) / 4 = -0.25
    #   L = 9     -> (6 - 9) / 4 = -0.75
    #   L = 10    -> (6 - 10) / 4 = -1
    #   L = 11    -> -1 (beyond max_len)
    lengths = torch.tensor([5, 6, 7, 9, 10, 11])
    out = overlong_reward_shaping(lengths, max_len=10, buffer_len=4)
    assert out.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.75, -1.0, -1.0])
    out = overlong_reward_shaping(lengths, max_len=10, buffer_len=4, penalty=2.0)
    assert out.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.5, -2.0, -2.0])
    # no buffer: a hard step at max_len
    out = overlong_reward_shaping(lengths, max_len=10, buffer_len=0)
    assert out.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0, 0.0, -1.0])


def test_overlong_reward_shaping_argument_errors():
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_reward_shaping(torch.tensor([1]), max_len=4, buffer_len=5)
    with pytest.raises(ValueError, match="penalty"):
        overlong_reward_shaping(torch.tensor([1]), max_len=4, buffer_len=2, penalty=-1.0)


@pytest.mark.parametrize("value", [0.1, 0.3, 0.7])
def test_zero_variance_groups_inexact_rewards(value):
    # eight float32 copies of 0.1: a rounded std is ~1e-9, the range is exactly 0
    rewards = torch.cat([torch.full((8,), value), torch.tensor([value, 1.0])])
    groups = torch.tensor([0] * 8 + [1, 1])
    assert zero_variance_groups(rewards, groups).tolist() == [True] * 8 + [False, False]


def test_zero_variance_groups_over_scored_samples_only():
    # group 0: scored 0.8 and 0.8 beside two unscored zeros: no spread among the scored (the zeros
    #   made one before); group 1: one scored sample: fewer than two, nothing to compare;
    # group 2: scored 0 and 1: a spread, and the whole group (its unscored members too) is kept
    rewards = torch.tensor([0.8, 0.8, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
    scored = torch.tensor([1, 1, 0, 0, 1, 0, 1, 1, 0, 0], dtype=torch.bool)
    assert zero_variance_groups(rewards, groups, scored=scored).tolist() == [True] * 6 + [False] * 4
    assert zero_variance_groups(rewards, groups).tolist() == [False] * 6 + [False] * 4
    assert zero_variance_groups(rewards, groups, scored=torch.ones(10, dtype=torch.bool)).tolist() == (
        zero_variance_groups(rewards, groups).tolist()
    )
