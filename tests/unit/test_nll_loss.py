import math

import pytest
import torch

from posttrain.algorithms.losses import nll_loss


def test_nll_loss_hand_worked():
    # Two sequences of 3 tokens; position 0 is never a target.
    # counted logprobs: -0.5, -1.0 (row 0) and -2.0 (row 1) -> sum = -3.5
    lp = torch.tensor([[0.0, -0.5, -1.0], [0.0, -3.0, -2.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    # global normaliser N = 5 tokens (e.g. 2 more counted in another microbatch): 3.5 / 5 = 0.7
    assert nll_loss(lp, mask, normalizer=5).item() == pytest.approx(0.7)
    # with N = 3 it is the plain token mean of this microbatch: 3.5 / 3
    assert nll_loss(lp, mask, normalizer=3).item() == pytest.approx(3.5 / 3)


def test_nll_loss_masked_tokens_get_no_gradient():
    lp = torch.tensor([[0.0, math.log(0.5), math.log(0.25)]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 0.0]])
    nll_loss(lp, mask, normalizer=1).backward()
    assert lp.grad.tolist() == [[0.0, -1.0, 0.0]]


def test_nll_loss_rejects_empty_normalizer():
    with pytest.raises(ValueError, match="normalizer"):
        nll_loss(torch.zeros(1, 2), torch.zeros(1, 2), normalizer=0)
