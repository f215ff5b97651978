"""DPO, IPO, Bradley–Terry and their helpers against hand-worked values on 3-element tensors."""

import math

import pytest
import torch

from posttrain.algorithms.preference import (
    PREFERENCE_LOSSES,
    bradley_terry_loss,
    dpo_sigmoid_loss,
    ipo_loss,
    preference_accuracy_and_margin,
    preference_logits,
    sequence_logprobs,
)

LOG2 = math.log(2.0)
SOFTPLUS_M1 = math.log(1 + math.exp(-1))  # -log σ(1)  = 0.313262
SOFTPLUS_1 = math.log(1 + math.e)  # -log σ(-1) = 1.313262


def test_sequence_logprobs_summed_and_averaged():
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0], [-3.0, -1.0, -2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    assert sequence_logprobs(lp, mask, average=False).tolist() == [-3.0, -0.5, -6.0]
    assert sequence_logprobs(lp, mask, average=True).tolist() == [-1.5, -0.5, -2.0]
    # an empty response averages to 0 instead of dividing by zero
    assert sequence_logprobs(lp, torch.zeros(3, 3), average=True).tolist() == [0.0, 0.0, 0.0]


def test_preference_logits():
    h = preference_logits(
        torch.tensor([-1.0, -2.0, -3.0]),  # policy chosen
        torch.tensor([-2.0, -2.0, -1.0]),  # policy rejected
        torch.tensor([-1.5, -2.0, -2.0]),  # reference chosen
        torch.tensor([-1.5, -1.0, -2.0]),  # reference rejected
    )
    # (0.5 - (-0.5), 0 - (-1), -1 - 1)
    assert h.tolist() == [1.0, 1.0, -2.0]


def test_dpo_sigmoid_loss():
    h = torch.tensor([0.0, 2.0, -2.0])  # β h = 0, 1, -1
    loss = dpo_sigmoid_loss(h, beta=0.5)
    assert loss.tolist() == pytest.approx([LOG2, SOFTPLUS_M1, SOFTPLUS_1], rel=1e-6)


def test_dpo_gradient_is_minus_beta_sigmoid():
    h = torch.tensor([0.0, 2.0, -2.0], requires_grad=True)
    dpo_sigmoid_loss(h, beta=0.5).sum().backward()
    # d/dh -log σ(βh) = -β σ(-βh): -0.5 * (0.5, σ(-1), σ(1))
    s = 1 / (1 + math.e)
    assert h.grad.tolist() == pytest.approx([-0.25, -0.5 * s, -0.5 * (1 - s)], rel=1e-6)


def test_conservative_dpo_label_smoothing():
    h = torch.tensor([0.0, 2.0, -2.0])
    loss = dpo_sigmoid_loss(h, beta=0.5, label_smoothing=0.1)
    # 0.9 * (-log σ(z)) + 0.1 * (-log σ(-z))
    expected = [LOG2, 0.9 * SOFTPLUS_M1 + 0.1 * SOFTPLUS_1, 0.9 * SOFTPLUS_1 + 0.1 * SOFTPLUS_M1]
    assert loss.tolist() == pytest.approx(expected, rel=1e-6)
    assert expected[1] == pytest.approx(0.413262, abs=1e-6)


def test_ipo_loss():
    h = torch.tensor([0.0, 2.0, -2.0])
    assert ipo_loss(h, beta=0.5).tolist() == [1.0, 1.0, 9.0]  # target margin 1/(2·0.5) = 1
    assert ipo_loss(h, beta=0.25).tolist() == [4.0, 0.0, 16.0]  # target margin 2
    with pytest.raises(ValueError, match="label smoothing"):
        ipo_loss(h, beta=0.5, label_smoothing=0.1)


def test_bradley_terry_loss():
    loss = bradley_terry_loss(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 0.0, 3.0]))
    assert loss.tolist() == pytest.approx([SOFTPLUS_M1, LOG2, SOFTPLUS_1], rel=1e-6)


def test_accuracy_and_margin_count_ties_as_wrong():
    acc, margin = preference_accuracy_and_margin(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 0.0, 3.0]))
    assert acc.tolist() == [1.0, 0.0, 0.0]
    assert margin.tolist() == [1.0, 0.0, -1.0]


def test_registry():
    assert PREFERENCE_LOSSES == {"sigmoid": dpo_sigmoid_loss, "ipo": ipo_loss}
