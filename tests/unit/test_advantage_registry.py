"""The advantage registry (posttrain.algorithms.estimators): every registered estimator through the one
call ``estimate_advantages(knobs, AdvantageInputs(...))`` on a hand-worked 4-sample case in float64.

The expected tensors were also produced by the code the registry replaced (``trainers.grpo.rl_advantages``
for the GRPO estimators, PPO's inline GAE / raw_reward / whiten / clip for gae and raw_reward) before it
was deleted, and agree with it to the last bit printed (17 digits): the pins below are those values.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from posttrain.algorithms.estimators import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    advantage_estimator,
    estimate_advantages,
    register_advantage_estimator,
)
from posttrain.config.loss import AdvantageConfig
from posttrain.config.ppo import GAEConfig

F64 = torch.float64
EPS = 1e-6
# groups {0, 1} x 2 samples; rewards 1, 0 | 2, 0
R = torch.tensor([1.0, 0.0, 2.0, 0.0], dtype=F64)
G = torch.tensor([0, 0, 1, 1])
# 3 token positions; row 0 has 2 generated tokens, row 1 three, row 2 one, row 3 two
M = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=F64)
KL = torch.tensor([[0.5, 0.25, 9], [0.1, 0.2, 0.3], [1.0, 9, 9], [0.0, 0.5, 9]], dtype=F64)  # 9: masked
SCORED = torch.tensor([True, True, True, False])  # group 1 keeps one scored sample: no baseline
TEACHER = torch.tensor([[-1.0, -2.0, 0], [-0.5, -0.5, -0.5], [-1.0, 0, 0], [-2.0, -1.0, 0]], dtype=F64)
STUDENT = torch.tensor([[-1.5, -1.0, 0], [-0.5, -1.0, -0.25], [-2.0, 0, 0], [-1.0, -1.0, 0]], dtype=F64)
COMPONENTS = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 1.0]], dtype=F64)  # c1 | c2
TOKEN_R = torch.tensor([[0.0, 1.0, 0], [0.0, 0.0, 1.0], [2.0, 0, 0], [0.5, 0.5, 0]], dtype=F64)
VALUES = torch.tensor([[0.5, 0.5, 0], [0.25, 0.5, 0.75], [1.0, 0, 0], [0.0, 1.0, 0]], dtype=F64)

# grpo: group 0 {1, 0}: ±0.5 / (sqrt(0.5) + eps); group 1 {2, 0}: ±1 / (sqrt(2) + eps)
A0, A1 = 0.5 / (math.sqrt(0.5) + EPS), 1.0 / (math.sqrt(2.0) + EPS)
# reinforce_pp: r - 0.75 = [0.25, -0.75, 1.25, -0.75], Bessel std sqrt(2.75 / 3)
PP_STD = math.sqrt(2.75 / 3) + EPS
# gdpo: c1 gives ±a in both groups, c2 gives ∓a in group 0 and 0 in group 1 (no spread):
# S = [0, 0, a, -a] -> / Bessel std a sqrt(2 / 3) = ±sqrt(1.5); weights c1 = 2: S = [a, -a, 2a, -2a]
W = 1 / math.sqrt(10 / 3)
# on_policy_distill with distill_reward_weight 0.5 and the KL in the reward (β = 0.1):
# r' = r - 0.1 Σ_t KL = [0.925, -0.06, 1.9, -0.05]; group 1 has one scored sample -> 0;
# group 0: ±0.4925 / (0.4925 sqrt 2 + eps) = ±D; A = (T - S) + 0.5 (±D) on generated tokens
D = 0.4925 / (0.4925 * math.sqrt(2) + EPS)

CASES = {
    "grpo": (AdvantageConfig(), {}, [A0, -A0, A1, -A1]),
    "grpo, leave-one-out std": (  # G = 2: the std of one other sample is 0, so r - baseline undivided
        AdvantageConfig(leave_one_out=True, leave_one_out_std=True), {}, [1.0, -1.0, 2.0, -2.0],
    ),
    "grpo, KL in the reward": (
        AdvantageConfig(), {"kl": KL, "mask": M, "kl_beta": 0.1},
        [0.7071057659595787, -0.7071057659595787, 0.7071062683664067, -0.7071062683664067],
    ),
    "grpo, unscored": (AdvantageConfig(), {"scored": SCORED}, [A0, -A0, 0.0, 0.0]),
    "dr_grpo": (AdvantageConfig(estimator="dr_grpo"), {}, [0.5, -0.5, 1.0, -1.0]),
    "rloo": (AdvantageConfig(estimator="rloo"), {}, [1.0, -1.0, 2.0, -2.0]),
    "rloo, asymmetric clip": (
        AdvantageConfig(estimator="rloo", clip_low=-1.5, clip_high=1.0), {}, [1.0, -1.0, 1.0, -1.5],
    ),
    "reinforce_pp": (
        AdvantageConfig(estimator="reinforce_pp", minus_baseline=False), {}, [x / PP_STD for x in (0.25, -0.75, 1.25, -0.75)],
    ),
    "reinforce_pp, group baseline": (  # r - group mean = [0.5, -0.5, 1, -1], Bessel std sqrt(2.5 / 3)
        AdvantageConfig(estimator="reinforce_pp", minus_baseline=True), {},
        [x / (math.sqrt(2.5 / 3) + EPS) for x in (0.5, -0.5, 1.0, -1.0)],
    ),
    "reinforce_pp, per-token KL": (
        AdvantageConfig(estimator="reinforce_pp", minus_baseline=False), {"kl": KL, "mask": M, "kl_beta": 0.1},
        [[0.6477317080519644, 0.715203760974044, 0.0],
         [-0.6814677345130042, -0.6679733239285882, -0.6409845027597564],
         [1.9634367400325168, 0.0, 0.0], [-0.6679733239285882, -0.6679733239285882, 0.0]],
    ),
    "reinforce_pp, per-token KL, unscored": (
        AdvantageConfig(estimator="reinforce_pp", minus_baseline=False), {"kl": KL, "mask": M, "kl_beta": 0.1, "scored": SCORED},
        [[1.0488919889577673, 1.1404183405247623, 0.0],
         [-0.7541771369120419, -0.7358718665986428, -0.6992613259718446], [0.0] * 3, [0.0] * 3],
    ),
    "gdpo": (
        AdvantageConfig(estimator="gdpo"), {"components": COMPONENTS, "component_names": ("c1", "c2")},
        [0.0, 0.0, math.sqrt(1.5), -math.sqrt(1.5)],
    ),
    "gdpo, weighted": (
        AdvantageConfig(estimator="gdpo", reward_weights={"c1": 2.0, "c2": 1.0}),
        {"components": COMPONENTS, "component_names": ("c1", "c2")}, [W, -W, 2 * W, -2 * W],
    ),
    "on_policy_distill": (  # 2 (log π_T - log π_S) on generated tokens
        AdvantageConfig(estimator="on_policy_distill", distill_coef=2.0),
        {"mask": M, "teacher_logprobs": TEACHER, "student_logprobs": STUDENT},
        [[1.0, -2.0, 0.0], [0.0, 1.0, -0.5], [2.0, 0.0, 0.0], [-2.0, 0.0, 0.0]],
    ),
    "on_policy_distill, reward weight": (
        AdvantageConfig(estimator="on_policy_distill", distill_reward_weight=0.5),
        {"mask": M, "teacher_logprobs": TEACHER, "student_logprobs": STUDENT, "kl": KL, "kl_beta": 0.1,
         "scored": SCORED},
        [[0.5 + D / 2, -1.0 + D / 2, 0.0], [-D / 2, 0.5 - D / 2, -0.25 - D / 2], [1.0, 0.0, 0.0],
         [-1.0, 0.0, 0.0]],
    ),
    # gae, γ = 1, λ = 0.5: row 0 δ = [0 + 0.5 - 0.5, 1 - 0.5] = [0, 0.5] -> A = [0 + 0.5 * 0.5, 0.5];
    # row 3 δ = [0.5 + 1 - 0, 0.5 - 1] -> A = [1.5 - 0.25, -0.5]
    "gae": (
        GAEConfig(gamma=1.0, lam_actor=0.5, whiten=False), {"token_rewards": TOKEN_R, "values": VALUES, "mask": M},
        [[0.25, 0.5, 0.0], [0.4375, 0.375, 0.25], [1.0, 0.0, 0.0], [1.25, -0.5, 0.0]],
    ),
    # VAPO's λ = 1 - 1 / (0.5 l): rows of 2 tokens λ = 0, of 3 tokens λ = 1/3, of 1 token 0
    "gae, length-adaptive λ": (
        GAEConfig(lam_actor_alpha=0.5, whiten=False), {"token_rewards": TOKEN_R, "values": VALUES, "mask": M},
        [[0.0, 0.5, 0.0], [0.25 + 1 / 3 * (1 / 3), 0.25 + 1 / 3 * 0.25, 0.25], [1.0, 0.0, 0.0], [1.5, -0.5, 0.0]],
    ),
    "gae, whitened and clipped": (
        GAEConfig(gamma=0.9, lam_actor=1.0, clip=1.0), {"token_rewards": TOKEN_R, "values": VALUES, "mask": M},
        [[-0.10342777817690171, 0.1264117288828799, 0.0],
         [0.264315433118749, -0.10342777817690171, -0.44818703876657423], [1.0, 0.0, 0.0], [1.0, -1.0, 0.0]],
    ),
    "raw_reward": (
        GAEConfig(estimator="raw_reward", whiten=False), {"mask": M},
        [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    # whitened over the 8 generated tokens: values 1, 1, 0, 0, 0, 2, 0, 0 -> mean 0.5, variance 0.5
    "raw_reward, whitened": (
        GAEConfig(estimator="raw_reward"), {"mask": M},
        [[0.5 / math.sqrt(0.5 + 1e-8)] * 2 + [0.0], [-0.5 / math.sqrt(0.5 + 1e-8)] * 3,
         [1.5 / math.sqrt(0.5 + 1e-8), 0.0, 0.0], [-0.5 / math.sqrt(0.5 + 1e-8)] * 2 + [0.0]],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_every_estimator_through_the_one_call(case):
    knobs, inputs, expected = CASES[case]
    out = estimate_advantages(knobs, AdvantageInputs(R, G, **inputs))
    assert out.dtype == F64
    torch.testing.assert_close(out, torch.tensor(expected, dtype=F64), rtol=0, atol=1e-12)


def test_the_cases_cover_the_registry():
    assert {knobs.estimator for knobs, _, _ in CASES.values()} == set(ADVANTAGE_ESTIMATORS)
    assert set(ADVANTAGE_ESTIMATORS) == {
        "grpo", "dr_grpo", "rloo", "reinforce_pp", "gdpo", "on_policy_distill", "gae", "raw_reward"
    }  # fmt: skip


def test_unknown_estimator_lists_the_names():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'grop'.*'gae'.*Did you mean 'grpo'"):
        estimate_advantages(SimpleNamespace(estimator="grop", clip=None), AdvantageInputs(R, G))


def test_missing_inputs_are_named():
    with pytest.raises(ValueError, match="reward components"):
        estimate_advantages(AdvantageConfig(estimator="gdpo"), AdvantageInputs(R, G))
    with pytest.raises(ValueError, match="teacher_logprobs, student_logprobs and mask"):
        estimate_advantages(AdvantageConfig(estimator="on_policy_distill"), AdvantageInputs(R, G, mask=M))
    with pytest.raises(ValueError, match="AdvantageInputs.values"):
        estimate_advantages(GAEConfig(), AdvantageInputs(R, G, mask=M, token_rewards=TOKEN_R))


def test_knobs_are_duck_typed():
    # any object with the attributes an estimator reads will do (algorithms/ never imports the config)
    knobs = SimpleNamespace(estimator="grpo", clip=None, normalize_std=False, leave_one_out=False,
                            leave_one_out_std=False)  # fmt: skip
    assert estimate_advantages(knobs, AdvantageInputs(R, G)).tolist() == [0.5, -0.5, 1.0, -1.0]


def test_registering_an_estimator():
    @register_advantage_estimator("test_constant")
    def constant(inputs: AdvantageInputs, knobs: SimpleNamespace) -> torch.Tensor:
        return torch.full_like(inputs.rewards, knobs.value)

    try:
        assert advantage_estimator("test_constant") is constant
        knobs = SimpleNamespace(estimator="test_constant", clip=0.5, value=3.0)
        assert estimate_advantages(knobs, AdvantageInputs(R, G)).tolist() == [0.5] * 4  # then the clip
        with pytest.raises(ValueError, match="registered already"):
            register_advantage_estimator("test_constant")(constant)
    finally:
        del ADVANTAGE_ESTIMATORS["test_constant"]
