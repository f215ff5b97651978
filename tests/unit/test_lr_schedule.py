import math

import pytest

from posttrain.models.optim import lr_multiplier


def test_warmup_then_cosine_hand_worked():
    kw = dict(name="cosine", warmup_steps=2, total_steps=6, min_lr_ratio=0.0)
    # warmup: (step + 1) / 2
    assert lr_multiplier(0, **kw) == pytest.approx(0.5)
    assert lr_multiplier(1, **kw) == pytest.approx(1.0)
    # cosine over 4 steps: p = (step - 2) / 4 -> (1 + cos(pi p)) / 2
    assert lr_multiplier(2, **kw) == pytest.approx(1.0)
    assert lr_multiplier(3, **kw) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert lr_multiplier(4, **kw) == pytest.approx(0.5)
    assert lr_multiplier(6, **kw) == pytest.approx(0.0)
    assert lr_multiplier(9, **kw) == pytest.approx(0.0)  # clamped past the horizon


def test_cosine_floor_and_constant():
    assert lr_multiplier(
        10, name="cosine", warmup_steps=0, total_steps=10, min_lr_ratio=0.1
    ) == pytest.approx(0.1)
    assert lr_multiplier(7, name="constant", warmup_steps=2, total_steps=10, min_lr_ratio=0.1) == 1.0
