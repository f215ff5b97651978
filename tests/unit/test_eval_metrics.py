"""Eval aggregation: pass@k / cons@k over problems with hand-worked values, and answer vote keys."""

import pytest

from posttrain.algorithms.metrics import cons_at_k, pass_at_k
from posttrain.trainers.eval import summarize, vote_key


def test_vote_key_normalises_numbers_and_decoration():
    assert vote_key("5") == vote_key(" 5.0 ") == vote_key("$5$") == vote_key("05") == vote_key("5.") == "5"
    assert vote_key("1,000") == "1000"
    assert vote_key("\\text{12}") == "12"
    assert vote_key("0.50") == "0.5"
    assert vote_key("\\frac{1}{2}") == "\\frac{1}{2}"
    assert vote_key("x + 1") == "x+1"
    assert vote_key(None) is None
    assert vote_key("  ") is None


def test_summarize_hand_worked():
    # problem 0: n=4, answers 7 3 3 7.0 (7 is right); problem 1: c=0, answers None 2 2 5 (wrong)
    correct = [[True, False, False, True], [False] * 4]  # c = 2 and c = 0
    answers = [["7", "3", "3", "7.0"], [None, "2", "2", "5"]]
    out = summarize(correct, answers, [1, 2, 4])
    assert out["accuracy"] == pytest.approx(2 / 8)
    # pass@1 = mean(c/n) = (0.5 + 0) / 2
    assert out["pass@1"] == pytest.approx(0.25)
    # pass@2 problem 0: 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6; problem 1: 0
    assert out["pass@2"] == pytest.approx(5 / 12)
    # pass@4 = k = n: 1 if c >= 1
    assert out["pass@4"] == pytest.approx(0.5)
    # cons@1: first sample of each -> 7 (right), None (no vote: wrong)
    assert out["cons@1"] == pytest.approx(0.5)
    # cons@2: "7" vs "3" tie -> first seen "7" wins (right); problem 1: "2" wins (wrong)
    assert out["cons@2"] == pytest.approx(0.5)
    # cons@4: "7" and "7.0" vote together with "3" x2 -> tie 2:2, "7" seen first wins -> right
    assert out["cons@4"] == pytest.approx(0.5)


def test_summarize_tie_broken_by_first_occurrence_can_be_wrong():
    out = summarize([[False, True, True, False]], [["4", "5", "5", "4"]], [4])
    assert out["cons@4"] == 0.0  # "4" first seen, wins the 2:2 tie, and is wrong
    assert out["pass@4"] == 1.0


def test_summarize_rejects_ragged_rows():
    with pytest.raises(ValueError):
        summarize([[True], [True, False]], [["1"], ["1", "2"]], [1])


def test_pass_at_k_k_equals_n_and_c_zero():
    assert pass_at_k(3, 0, 3) == 0.0
    assert pass_at_k(3, 1, 3) == 1.0
    assert cons_at_k(["1", "2", "3"], [False, False, True], k=3) == 0.0  # 3-way tie: first wins
