import math

import pytest
import torch

from posttrain.algorithms.metrics import (
    approx_entropy,
    cons_at_k,
    generation_kl,
    majority_vote,
    pass_at_k,
    reward_statistics,
    token_mult_prob_error,
)

NAN = float("nan")


def test_token_mult_prob_error_hand_worked():
    # valid |gen - train| = [0.5, 0] -> mean(exp) = (e^0.5 + 1) / 2 = 1.3243606; masked NaN ignored
    train = torch.tensor([[-1.0, -2.0, NAN]])
    gen = torch.tensor([[-1.5, -2.0, 7.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert token_mult_prob_error(train, gen, mask).item() == pytest.approx((math.exp(0.5) + 1) / 2)
    # symmetric in its arguments
    assert token_mult_prob_error(gen, train, mask).item() == pytest.approx((math.exp(0.5) + 1) / 2)
    assert token_mult_prob_error(train, train, mask).item() == pytest.approx(1.0)


def test_generation_kl_hand_worked():
    # log r = train - gen = [0.5, 0]: k3 = [e^0.5 - 0.5 - 1, 0] -> mean 0.0743606
    train = torch.tensor([[-1.0, -2.0, NAN]])
    gen = torch.tensor([[-1.5, -2.0, 7.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert generation_kl(train, gen, mask).item() == pytest.approx((math.exp(0.5) - 1.5) / 2)


# Three-token vocabulary, p_gen = [0.5, 0.3, 0.2], p_train = [0.4, 0.4, 0.2]; a "sample" of 10
# tokens in exact proportion (5, 3, 2), so the Monte-Carlo means equal the expectations exactly:
#   KL(gen || train) = 0.5 ln(0.5/0.4) + 0.3 ln(0.3/0.4) = 0.0252713
#   KL(train || gen) = 0.4 ln(0.4/0.5) + 0.4 ln(0.4/0.3) = 0.0258146  (the other direction)
#   H(p_gen) = -(0.5 ln 0.5 + 0.3 ln 0.3 + 0.2 ln 0.2) = 1.0296530
P_GEN = [0.5, 0.3, 0.2]
P_TRAIN = [0.4, 0.4, 0.2]
TOKENS = [0] * 5 + [1] * 3 + [2] * 2


def test_generation_kl_is_unbiased_for_kl_gen_train():
    gen = torch.tensor([[math.log(P_GEN[x]) for x in TOKENS]], dtype=torch.float64)
    train = torch.tensor([[math.log(P_TRAIN[x]) for x in TOKENS]], dtype=torch.float64)
    mask = torch.ones_like(gen)
    expected = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4)
    assert generation_kl(train, gen, mask).item() == pytest.approx(expected, abs=1e-12)
    assert abs(expected - 0.0258146) > 5e-4  # and not the reverse KL


def test_approx_entropy():
    assert approx_entropy(torch.tensor([[-1.0, -3.0, NAN]]), torch.tensor([[1, 1, 0]])).item() == 2.0
    gen = torch.tensor([[math.log(P_GEN[x]) for x in TOKENS]], dtype=torch.float64)
    entropy = -sum(p * math.log(p) for p in P_GEN)
    assert approx_entropy(gen, torch.ones_like(gen)).item() == pytest.approx(entropy, abs=1e-12)


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 1, 0.3),  # pass@1 = c / n
        (4, 1, 4, 1.0),  # k = n and c >= 1: every draw includes the correct one
        (4, 0, 4, 0.0),  # k = n, c = 0
        (6, 0, 2, 0.0),  # c = 0
        (6, 6, 3, 1.0),  # c = n
        (6, 5, 2, 1.0),  # n - c = 1 < k = 2
        (3, 1, 2, 2 / 3),  # 1 - C(2,2)/C(3,2) = 1 - 1/3
    ],
)
def test_pass_at_k_hand_cases(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_matches_exact_binomials_for_large_n():
    for n, c, k in [(200, 10, 50), (100, 1, 10), (64, 30, 8)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


def test_pass_at_k_argument_errors():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_majority_vote_and_cons_at_k():
    # "4" and "5" both appear twice; "4" appears first -> "4" wins, and it is correct
    answers = ["4", "5", "5", "4", None]
    correct = [True, False, False, True, False]
    assert majority_vote(answers, correct) == ("4", True)
    assert cons_at_k(answers, correct) == 1.0
    # same tie, other order: "5" first -> wrong
    assert cons_at_k(["5", "4", "4", "5"], [False, True, True, False]) == 0.0
    # first k = 3 samples: "5" has 2 votes -> wrong
    assert cons_at_k(answers, correct, k=3) == 0.0
    # a clear majority beats an earlier answer
    assert majority_vote(["1", "2", "2"], [True, False, False]) == ("2", False)
    # unextracted answers never win, even when they are the most frequent
    assert majority_vote([None, None, "3"], [False, False, True]) == ("3", True)
    assert cons_at_k([None, None], [False, False]) == 0.0
    with pytest.raises(ValueError):
        cons_at_k(answers, correct, k=6)


def test_reward_statistics():
    # rewards [1, 0, 1, 1, 0], groups [0, 0, 1, 1, 2]
    #   mean 0.6; sample std: squared deviations 3 * 0.16 + 2 * 0.36 = 1.2, / 4 -> sqrt(0.3)
    #   group stds: group 0 sqrt(0.5) (2 samples), group 1 0, group 2 0 -> mean 2 * 0.70711 / 5
    #   zero-variance samples: group 1 (all 1) and group 2 (singleton) -> 3 / 5
    stats = reward_statistics(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1, 2]))
    assert stats["mean"] == pytest.approx(0.6)
    assert stats["std"] == pytest.approx(math.sqrt(0.3))
    assert stats["min"] == 0.0 and stats["max"] == 1.0
    assert stats["group_std_mean"] == pytest.approx(2 * math.sqrt(0.5) / 5)
    assert stats["zero_variance_fraction"] == pytest.approx(0.6)
    assert "group_std_mean" not in reward_statistics(torch.tensor([1.0]))
