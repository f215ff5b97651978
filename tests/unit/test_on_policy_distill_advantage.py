"""advantage.estimator=on_policy_distill: A_t = coef * (log pi_T(a_t) - log pi_S(a_t)) per generated
token, plus an optional grpo advantage of the environment rewards. Worked by hand in float64."""

from __future__ import annotations

import pytest
import torch

from posttrain.algorithms.advantages import grpo_advantages
from posttrain.algorithms.estimators import AdvantageInputs, estimate_advantages
from posttrain.config.loss import AdvantageConfig
from posttrain.config.rl import GRPOConfig

F64 = torch.float64
TEACHER = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -0.25, -3.0, -1.0]], dtype=F64)
STUDENT = torch.tensor([[0.0, -1.5, -1.0, -0.5], [0.0, -0.75, -1.0, -9.0]], dtype=F64)
MASK = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 0]], dtype=F64)


def test_the_estimator_is_teacher_minus_student_on_generated_tokens():
    # row 0: -1 - (-1.5) = 0.5, -2 - (-1) = -1; row 1: -0.25 + 0.75 = 0.5, -3 + 1 = -2; masked: 0
    expected = torch.tensor([[0.0, 0.5, -1.0, 0.0], [0.0, 0.5, -2.0, 0.0]], dtype=F64)
    for coef in (1.0, 2.0):
        adv = AdvantageConfig(estimator="on_policy_distill", distill_coef=coef)
        out = estimate_advantages(
            adv,
            AdvantageInputs(
                torch.tensor([1.0, 0.0]),
                torch.tensor([0, 0]),
                mask=MASK,
                teacher_logprobs=TEACHER,
                student_logprobs=STUDENT,
            ),
        )
        assert torch.equal(out, coef * expected)


def test_reward_weight_adds_the_group_advantage_on_generated_tokens():
    rewards = torch.tensor([1.0, 0.0], dtype=F64)
    groups = torch.tensor([7, 7])
    adv = AdvantageConfig(estimator="on_policy_distill", distill_coef=1.0, distill_reward_weight=0.5)
    inputs = AdvantageInputs(rewards, groups, mask=MASK, teacher_logprobs=TEACHER, student_logprobs=STUDENT)
    out = estimate_advantages(adv, inputs)
    # grpo on {1, 0}: mean 0.5, std sqrt(0.5) -> +-0.5 / (sqrt(0.5) + 1e-6)
    g = 0.5 / (0.5**0.5 + 1e-6)
    expected = torch.tensor(
        [[0.0, 0.5 + 0.5 * g, -1.0 + 0.5 * g, 0.0], [0.0, 0.5 - 0.5 * g, -2.0 - 0.5 * g, 0.0]], dtype=F64
    )
    assert torch.allclose(out, expected, atol=1e-12, rtol=0)
    assert torch.allclose(grpo_advantages(rewards, groups), torch.tensor([g, -g], dtype=F64), atol=1e-12)


def test_reward_weight_zero_ignores_rewards_and_clip_applies():
    adv = AdvantageConfig(estimator="on_policy_distill", clip=0.75)
    one = estimate_advantages(
        adv,
        AdvantageInputs(
            torch.tensor([1.0, 0.0]),
            torch.tensor([0, 0]),
            mask=MASK,
            teacher_logprobs=TEACHER,
            student_logprobs=STUDENT,
        ),
    )
    two = estimate_advantages(
        adv,
        AdvantageInputs(
            torch.tensor([5.0, -3.0]),
            torch.tensor([0, 1]),
            mask=MASK,
            teacher_logprobs=TEACHER,
            student_logprobs=STUDENT,
        ),
    )
    assert torch.equal(one, two)
    assert torch.equal(one, torch.tensor([[0.0, 0.5, -0.75, 0.0], [0.0, 0.5, -0.75, 0.0]], dtype=F64))


def test_the_estimator_needs_a_teacher_and_the_teacher_needs_the_estimator():
    with pytest.raises(ValueError, match="needs a teacher"):
        GRPOConfig(advantage={"estimator": "on_policy_distill"})
    with pytest.raises(ValueError, match="used only by"):
        GRPOConfig(teacher={"model_name": "runs/grpo"})
    cfg = GRPOConfig(advantage={"estimator": "on_policy_distill"}, teacher={"model_name": "runs/grpo"})
    assert cfg.teacher.placement == "colocated"
