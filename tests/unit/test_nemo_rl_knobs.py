"""NeMo RL's loss, advantage and reward knobs (issue #35): hand-worked values in float64, NeMo RL's
boundary cases, and defaults that reproduce posttrain's numbers from before the knobs existed."""

import math

import pytest
import torch

from posttrain.algorithms.kl import kl_penalty
from posttrain.algorithms.metrics import (
    accumulate_metrics,
    engine_mismatch_metrics,
    logprob_error_keep,
    sequence_mult_prob_error,
)
from posttrain.algorithms.policy_loss import clipped_pg_loss
from posttrain.config.loss import LossConfig

LN2 = math.log(2)


def _lp(values) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64, requires_grad=True)


def _t(values) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64)


# --- item 1: disable_ppo_ratio ------------------------------------------------------------------


def _reinforce_case(**knobs):
    # log π = [-1, -2, -0.5], log π_old = [-1.2, -1.5, -0.5]: ratios e^0.2 = 1.221 (clipped at 1.2
    # for A > 0), e^-0.5, 1. A = 2, token aggregation over 3 tokens.
    lp = _lp([-1.0, -2.0, -0.5])
    old = _t([-1.2, -1.5, -0.5])
    loss, metrics = clipped_pg_loss(
        lp, old, torch.tensor([2.0], dtype=torch.float64), torch.ones_like(old), normalizer=3, **knobs
    )
    loss.backward()
    return loss.item(), metrics, lp.grad[0].tolist()


def test_disable_ppo_ratio_is_minus_a_log_pi():
    # l = -A log π = -2 * [-1, -2, -0.5] = [2, 4, 1] -> loss 7/3; ∇ = -A / 3 per token, no clip
    loss, metrics, grad = _reinforce_case(disable_ppo_ratio=True)
    assert loss == pytest.approx(7 / 3, rel=1e-15)
    assert metrics["pg_loss"] == pytest.approx(7 / 3, rel=1e-15)
    assert grad == pytest.approx([-2 / 3] * 3, rel=1e-15)
    assert metrics["clip_fraction"] == 0.0


def test_disable_ppo_ratio_default_is_todays_clipped_ratio():
    # default: max(-A r, -A clip(r)) = [-2 * 1.2, -2 e^-0.5, -2] (token 1 clipped: no gradient)
    loss, metrics, grad = _reinforce_case()
    assert loss == pytest.approx((-2.4 - 2 * math.exp(-0.5) - 2) / 3, rel=1e-15)
    assert metrics["clip_fraction"] == pytest.approx(1 / 3, rel=1e-15)
    assert grad == pytest.approx([0.0, -2 * math.exp(-0.5) / 3, -2 / 3], rel=1e-15)


def test_disable_ppo_ratio_same_gradient_as_the_on_policy_ratio():
    # with π_old = sg(π) the ratio form has value -A but the same gradient -A ∇log π
    lp = _lp([-1.0, -2.0, -0.5])
    adv, mask = torch.tensor([2.0], dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64)
    loss, _ = clipped_pg_loss(lp, lp.detach(), adv, mask, normalizer=3)
    loss.backward()
    assert loss.item() == pytest.approx(-2.0, rel=1e-15)
    _, _, grad = _reinforce_case(disable_ppo_ratio=True)
    assert lp.grad[0].tolist() == pytest.approx(grad, rel=1e-15)


def test_disable_ppo_ratio_refuses_ratio_knobs():
    lp, old, adv, mask = _lp([-1.0]), _t([-1.0]), torch.tensor([1.0]), torch.ones(1, 1)
    with pytest.raises(ValueError, match="disable_ppo_ratio"):
        clipped_pg_loss(lp, old, adv, mask, normalizer=1, disable_ppo_ratio=True, dual_clip=3.0)
    with pytest.raises(ValueError, match="disable_ppo_ratio"):
        LossConfig(disable_ppo_ratio=True, policy_loss="cispo")
    with pytest.raises(ValueError, match="disable_ppo_ratio"):
        LossConfig(disable_ppo_ratio=True, ratio_level="sequence", aggregation="sequence")


# --- item 2: use_on_policy_kl_approximation -----------------------------------------------------

# log π = ln ½ on every token; log π_ref = [ln ½, ln ¼, ln 1]: log r = [0, -ln 2, ln 2]
#   k3 = e^{log r} - log r - 1 = [0, ln 2 - ½, 1 - ln 2]
# log π_gen = [ln ½, ln ¼, ln 1]: w = π / π_gen = [1, 2, ½]
#   w k3 = [0, 2 ln 2 - 1, ½ - ½ ln 2], sum = 1.5 ln 2 - ½
# gradient (exact) per token: w ((1 - r) + k3) ∇log π = [0, 2 (½ + ln 2 - ½), ½ (-1 + 1 - ln 2)]
#   = [0, 2 ln 2, -½ ln 2]
POLICY = [math.log(0.5)] * 3
REF = [math.log(0.5), math.log(0.25), 0.0]
GEN = [math.log(0.5), math.log(0.25), 0.0]


def _kl_case(**knobs):
    lp = _lp(POLICY)
    loss, metrics = clipped_pg_loss(
        lp, lp.detach(), torch.zeros(1, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64),
        normalizer=3, reference_logprobs=_t(REF), generation_logprobs=_t(GEN), kl_beta=1.0, **knobs,
    )  # fmt: skip
    loss.backward()
    return loss.item(), metrics, lp.grad[0].tolist()


def test_on_policy_kl_approximation_weights_by_pi_over_pi_gen():
    loss, metrics, grad = _kl_case(on_policy_kl_approximation=True)
    assert loss == pytest.approx((1.5 * LN2 - 0.5) / 3, rel=1e-14)
    assert metrics["kl"] == pytest.approx((1.5 * LN2 - 0.5) / 3, rel=1e-14)
    assert grad == pytest.approx([0.0, 2 * LN2 / 3, -0.5 * LN2 / 3], abs=1e-15)


def test_on_policy_kl_approximation_default_is_todays_kl():
    # unweighted: k3 sum = ln 2 - ½ + 1 - ln 2 = ½; gradient (1 - r) + k3 = [0, ln 2, -ln 2] / 3
    loss, metrics, grad = _kl_case()
    assert loss == pytest.approx(0.5 / 3, rel=1e-14)
    assert grad == pytest.approx([0.0, LN2 / 3, -LN2 / 3], abs=1e-15)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_on_policy_kl_gradient_is_nemo_rls(estimator):
    # NeMo RL: ∇(w k) with w = exp(log π - log π_gen) not held fixed; here sg(w) ∇(k s): the same
    lp = _lp(POLICY)
    ours = kl_penalty(lp, _t(REF), estimator, sampling_logprobs=_t(GEN), input_clamp=None, output_clamp=None)
    ours.sum().backward()
    ref_lp = _lp(POLICY)
    log_r = _t(REF) - ref_lp
    k = -log_r if estimator == "k1" else torch.exp(log_r) - log_r - 1
    nemo = torch.exp(ref_lp - _t(GEN)) * k
    nemo.sum().backward()
    assert ours[0].tolist() == pytest.approx(nemo[0].tolist(), rel=1e-14)
    assert lp.grad[0].tolist() == pytest.approx(ref_lp.grad[0].tolist(), rel=1e-14)


def test_on_policy_kl_output_clamp_after_the_weight_and_bad_weights():
    # output clamp 0.3: token 2's w k3 = 2 ln 2 - 1 = 0.386 is cut to 0.3 (no gradient); token 3's
    # 0.153 stays. A generator logprob of -inf makes w infinite: NeMo RL's nan_to_num sets it to 0.
    lp = _lp(POLICY)
    kl = kl_penalty(lp, _t(REF), "k3", sampling_logprobs=_t(GEN), output_clamp=0.3)
    kl.sum().backward()
    assert kl[0].tolist() == pytest.approx([0.0, 0.3, 0.5 - 0.5 * LN2], abs=1e-15)
    assert lp.grad[0].tolist() == pytest.approx([0.0, 0.0, -0.5 * LN2], abs=1e-15)
    lp = _lp(POLICY)
    kl = kl_penalty(lp, _t(REF), "k3", sampling_logprobs=_t([math.log(0.5), -math.inf, 0.0]))
    assert kl[0].tolist() == pytest.approx([0.0, 0.0, 0.5 - 0.5 * LN2], abs=1e-15)


def test_on_policy_kl_approximation_needs_generation_logprobs():
    lp = _lp([-1.0])
    with pytest.raises(ValueError, match="generation_logprobs"):
        clipped_pg_loss(
            lp, lp.detach(), torch.ones(1), torch.ones(1, 1), normalizer=1, kl_beta=0.1,
            reference_logprobs=_t([-1.0]), on_policy_kl_approximation=True,
        )  # fmt: skip


# --- item 5: mismatch metrics -------------------------------------------------------------------


def test_engine_mismatch_metrics_hand_worked():
    # d = log π_train - log π_gen = [0, ln 2, -ln 2] (a 4th token masked, NaN there)
    #   token_mult_prob_error = (1 + 2 + 2) / 3; gen_kl = Σ k3(d) / 3 = (0 + 1 - ln 2 + ln 2 - ½) / 3
    #   policy_kl_error = Σ k3(-d) / 3 = the same ½ / 3 (d is symmetric here)
    #   js: a token with one probability twice the other: ½ ln 9/8 (see test_async_parts) -> ln(9/8) / 3
    train = _t([-1.0, -1.0 + LN2, -1.0, math.nan])
    gen = _t([-1.0, -1.0, -1.0 + LN2, math.nan])
    mask = _t([1.0, 1.0, 1.0, 0.0])
    out = engine_mismatch_metrics(train, gen, mask, normalizer=3.0)
    assert out == {
        "token_mult_prob_error": pytest.approx(5 / 3, rel=1e-15),
        "gen_kl": pytest.approx(0.5 / 3, rel=1e-14),
        "policy_kl_error": pytest.approx(0.5 / 3, rel=1e-14),
        "js_divergence_error": pytest.approx(math.log(9 / 8) / 3, rel=1e-13),
    }
    # the two agree: 1, 0, 0, 0
    same = engine_mismatch_metrics(gen, gen, mask, normalizer=3.0)
    assert same == {
        "token_mult_prob_error": 1.0,
        "gen_kl": 0.0,
        "policy_kl_error": 0.0,
        "js_divergence_error": 0.0,
    }


def test_probs_ratio_min_max_over_valid_tokens_and_merged_by_min_max():
    # ratios [0.5, 1.1, 1.5] and a masked token with ratio e^5 (left out)
    lp = _lp([math.log(0.5), math.log(1.1), math.log(1.5), 5.0])
    _, metrics = clipped_pg_loss(
        lp, torch.zeros_like(lp), torch.ones(1, dtype=torch.float64), _t([1.0, 1.0, 1.0, 0.0]), normalizer=3
    )
    assert metrics["probs_ratio_min"] == pytest.approx(0.5, rel=1e-15)
    assert metrics["probs_ratio_max"] == pytest.approx(1.5, rel=1e-15)
    total: dict[str, float] = {}
    accumulate_metrics(total, {"probs_ratio_min": 0.5, "probs_ratio_max": 1.5, "pg_loss": 1.0}, 0.5)
    accumulate_metrics(total, {"probs_ratio_min": 0.7, "probs_ratio_max": 2.5, "pg_loss": 3.0}, 0.5)
    assert total == {"probs_ratio_min": 0.5, "probs_ratio_max": 2.5, "pg_loss": 2.0}


# --- item 4: seq_logprob_error_threshold --------------------------------------------------------


def test_seq_logprob_error_threshold_drops_sequences_above_it():
    # row 0: |d| = [0, ln 2] -> e = (1 + 2) / 2 = 1.5 (exactly at the threshold: kept)
    # row 1: |d| = [ln 4]     -> e = 4 (dropped)
    # row 2: no valid token   -> e = 0 (kept: trains on nothing anyway)
    train = torch.tensor([[-1.0, -1.0], [-1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    gen = torch.tensor([[-1.0, -1.0 - LN2], [-1.0 + math.log(4), 0.0], [-9.0, -9.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    assert sequence_mult_prob_error(train, gen, mask).tolist() == pytest.approx([1.5, 4.0, 0.0], rel=1e-15)
    keep, metrics = logprob_error_keep(train, gen, mask, threshold=1.5)
    assert keep.tolist() == [True, False, True]
    assert metrics == {"logprob_error/dropped_sequences": 1.0, "logprob_error/seq_mult_prob_error_max": 4.0}
    keep, metrics = logprob_error_keep(train, gen, mask, threshold=1.0)  # 1 = exact agreement only
    assert keep.tolist() == [False, False, True] and metrics["logprob_error/dropped_sequences"] == 2.0


def test_seq_logprob_error_threshold_in_the_trainer():
    # the trainer zeroes the dropped rows' loss mask; the default (null) leaves the batch as it is

    from posttrain.rollout.rollout import RLBatch
    from posttrain.trainers.rl.batch import filter_logprob_errors

    def batch():
        return RLBatch(
            input_ids=torch.zeros(2, 2, dtype=torch.long),
            attention_mask=torch.ones(2, 2, dtype=torch.long),
            loss_mask=torch.ones(2, 2),
            generation_logprobs=torch.tensor([[-1.0, -1.0], [-1.0, -1.0 - math.log(3)]]),
            old_logprobs=torch.tensor([[-1.0, -1.0], [-1.0, -1.0]]),
        )

    for threshold, mask, dropped in ((1.5, [[1, 1], [0, 0]], 1.0), (2.5, [[1, 1], [1, 1]], 0.0)):
        b = batch()  # row 1: e = (1 + 3) / 2 = 2
        metrics = filter_logprob_errors(threshold, b)
        assert b.loss_mask.tolist() == mask and metrics["logprob_error/dropped_sequences"] == dropped
    b = batch()
    assert filter_logprob_errors(LossConfig().seq_logprob_error_threshold, b) == {}
    assert b.loss_mask.tolist() == [[1, 1], [1, 1]]
    with pytest.raises(ValueError):
        LossConfig(seq_logprob_error_threshold=0.9)  # below 1 every sequence would be dropped


# --- item 7: PPO value_loss_fn.scale and the raw_reward estimator --------------------------------


def test_value_loss_scale():
    # V = [1, 2, 3], R = 0, unclipped: ½ (1 + 4 + 9) / 3 = 7/3; scale 2 doubles value and gradient
    from posttrain.algorithms.value_loss import clipped_value_loss

    def run(**knobs):
        v = _lp([1.0, 2.0, 3.0])
        zeros = torch.zeros_like(v)
        loss, metrics = clipped_value_loss(v, zeros, zeros, torch.ones_like(zeros), normalizer=3, **knobs)
        loss.backward()
        return loss.item(), metrics["value_loss"], v.grad[0].tolist()

    assert run() == (pytest.approx(7 / 3), pytest.approx(7 / 3), pytest.approx([1 / 3, 2 / 3, 1.0]))
    assert run(scale=2.0) == (
        pytest.approx(14 / 3),
        pytest.approx(14 / 3),
        pytest.approx([2 / 3, 4 / 3, 2.0]),
    )
    with pytest.raises(ValueError, match="scale"):
        run(scale=0.0)


def test_raw_reward_advantages():
    # NeMo RL's case: rewards [2, -1] on every valid token (0 on padding here, which the loss masks)
    from posttrain.algorithms.advantages import raw_reward_advantages
    from posttrain.config.ppo import GAEConfig

    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    out = raw_reward_advantages(torch.tensor([2.0, -1.0], dtype=torch.float64), mask)
    assert out.tolist() == [[2.0, 2.0, 2.0, 0.0], [-1.0, -1.0, 0.0, 0.0]]
    assert GAEConfig().estimator == "gae" and GAEConfig(estimator="raw_reward").estimator == "raw_reward"


# --- item 8: reinforce_pp's per-prompt baseline ---------------------------------------------------


def test_reinforce_pp_minus_baseline():
    # r = [1, 0, 1, 1], groups [0, 0, 1, 1]
    #   minus_baseline: a = r - group mean = [½, -½, 0, 0]; Bessel std over 4 = sqrt(½ / 3)
    #   default (batch mean ¾): a = [¼, -¾, ¼, ¼]; std = sqrt(¾ / 3) = ½
    from posttrain.algorithms.estimators import AdvantageInputs, estimate_advantages
    from posttrain.config.loss import AdvantageConfig

    r = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 1, 1])
    grouped = estimate_advantages(
        AdvantageConfig(estimator="reinforce_pp", minus_baseline=True), AdvantageInputs(r, g)
    )
    s = math.sqrt(0.5 / 3) + 1e-6
    assert grouped.tolist() == pytest.approx([0.5 / s, -0.5 / s, 0.0, 0.0], rel=1e-14)
    batch = estimate_advantages(
        AdvantageConfig(estimator="reinforce_pp", minus_baseline=False), AdvantageInputs(r, g)
    )
    assert batch.tolist() == pytest.approx([x / (0.5 + 1e-6) for x in (0.25, -0.75, 0.25, 0.25)], rel=1e-14)


def test_reinforce_pp_default_is_nemo_rl_per_prompt_baseline():
    # NeMo RL's adv_estimator.minus_baseline defaults to true: the default config gives the grouped
    # advantages of test_reinforce_pp_minus_baseline, [½, -½, 0, 0] / (sqrt(½ / 3) + 1e-6).
    from posttrain.algorithms.estimators import AdvantageInputs, estimate_advantages
    from posttrain.config.loss import AdvantageConfig

    assert AdvantageConfig().minus_baseline is True
    r = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    out = estimate_advantages(
        AdvantageConfig(estimator="reinforce_pp"), AdvantageInputs(r, torch.tensor([0, 0, 1, 1]))
    )
    s = math.sqrt(0.5 / 3) + 1e-6
    assert out.tolist() == pytest.approx([0.5 / s, -0.5 / s, 0.0, 0.0], rel=1e-14)


@pytest.mark.parametrize("command", ["sft", "grpo", "eval", "dpo", "rm", "distill", "ppo"])
def test_a_default_config_dumped_and_loaded_again_warns_nothing(command):
    # A run writes its whole config (config.yaml) and workers and resumes read it back: every key is
    # then "set". A check that warns about a default (minus_baseline=true beside estimator=grpo did)
    # would warn on every such round trip.
    import warnings

    from posttrain.config.commands import ALGORITHM_CONFIGS
    from posttrain.config.common import ConfigWarning

    cls = ALGORITHM_CONFIGS[command]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        cls.model_validate(cls().model_dump())


# --- item 9: asymmetric advantage clipping --------------------------------------------------------


def test_asymmetric_advantage_clip():
    from posttrain.algorithms.advantages import clip_advantages

    a = torch.tensor([-2.0, 0.3, 1.2, -1.0, 0.5], dtype=torch.float64)  # the last two sit on the bounds
    assert clip_advantages(a, None, low=-1.0, high=0.5).tolist() == [-1.0, 0.3, 0.5, -1.0, 0.5]
    assert clip_advantages(a, None, low=-1.0).tolist() == [-1.0, 0.3, 1.2, -1.0, 0.5]
    assert clip_advantages(a, None, high=0.5).tolist() == [-2.0, 0.3, 0.5, -1.0, 0.5]
    assert clip_advantages(a, None).tolist() == a.tolist()
    with pytest.raises(ValueError):
        clip_advantages(a, 1.0, low=-1.0)
    with pytest.raises(ValueError):
        clip_advantages(a, None, low=1.0, high=1.0)


def test_asymmetric_advantage_clip_in_the_trainer_and_config():
    # one group r = [1, 0, 0]: mean ⅓, Bessel std sqrt(⅓): A = [⅔, -⅓, -⅓] / (sqrt(⅓) + 1e-6)
    from posttrain.algorithms.estimators import AdvantageInputs, estimate_advantages
    from posttrain.config.loss import AdvantageConfig

    r, g = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), torch.zeros(3, dtype=torch.long)
    s = math.sqrt(1 / 3) + 1e-6
    assert estimate_advantages(AdvantageConfig(), AdvantageInputs(r, g)).tolist() == pytest.approx(
        [2 / 3 / s, -1 / 3 / s, -1 / 3 / s]
    )
    clipped = estimate_advantages(AdvantageConfig(clip_low=-0.5, clip_high=1.0), AdvantageInputs(r, g))
    assert clipped.tolist() == pytest.approx([1.0, -0.5, -0.5], rel=1e-15)
    with pytest.raises(ValueError, match="one or the other"):
        AdvantageConfig(clip=1.0, clip_high=2.0)
    with pytest.raises(ValueError, match="below"):
        AdvantageConfig(clip_low=1.0, clip_high=-1.0)


# --- item 11: stop_properly_penalty_coef ----------------------------------------------------------


def test_stop_properly_penalty_nemo_rl_cases():
    from posttrain.algorithms.reward_shaping import stop_properly_penalty

    r = torch.tensor([1.0, 0.8, 0.6, 0.4], dtype=torch.float64)
    truncated = torch.tensor([False, True, False, True])
    assert stop_properly_penalty(r, truncated, coef=0.5).tolist() == pytest.approx(
        [1.0, 0.4, 0.6, 0.2], rel=1e-15
    )
    everything = torch.ones(4, dtype=torch.bool)  # an all-truncated batch
    assert stop_properly_penalty(r, everything, coef=0.0).tolist() == [0.0] * 4
    assert stop_properly_penalty(r, everything, coef=1.0).tolist() == r.tolist()
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            stop_properly_penalty(r, truncated, coef=bad)


def test_stop_properly_penalty_in_the_trainer_and_config():
    from types import SimpleNamespace

    from posttrain.config.loss import DAPOConfig, RewardScalingConfig
    from posttrain.trainers.rl.batch import shaped_rewards

    rollouts = SimpleNamespace(
        rewards=torch.tensor([1.0, 1.0, 0.0]),
        truncated=torch.tensor([False, True, True]),
        response_lengths=None,
    )

    def shaped(dapo):
        cfg = SimpleNamespace(advantage=SimpleNamespace(reward_scaling=RewardScalingConfig()), dapo=dapo)
        return shaped_rewards(cfg, rollouts).tolist()

    assert shaped(DAPOConfig(stop_properly_penalty_coef=0.25)) == [1.0, 0.25, 0.0]
    assert shaped(DAPOConfig()) == [1.0, 1.0, 0.0]  # default: today's rewards
    with pytest.raises(ValueError, match="one of them"):
        DAPOConfig(stop_properly_penalty_coef=0.5, overlong_buffer=16)
    with pytest.raises(ValueError):
        DAPOConfig(stop_properly_penalty_coef=1.5)


# --- item 6: DPO preference_loss_weight and the SFT term's averaging -----------------------------


def _dpo_batch():
    from types import SimpleNamespace

    # two pairs: chosen rows 0, 2; rejected rows 1, 3. Reference logps 0, so h = s_w - s_l.
    mask = torch.tensor(
        [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64
    )
    return SimpleNamespace(loss_mask=mask, reference_logps=torch.zeros(4, dtype=torch.float64))


# chosen token logprobs: row 0 [-1, -1] (sum -2, mean -1), row 2 [-2, -2, -2] (sum -6, mean -2);
# rejected rows: [-1], [-1]. h = [-2 + 1, -6 + 1] = [-1, -5]
LP = torch.tensor(
    [[-1.0, -1.0, 0.0], [-1.0, 0.0, 0.0], [-2.0, -2.0, -2.0], [-1.0, 0.0, 0.0]], dtype=torch.float64
)


def _dpo(**knobs):
    from posttrain.trainers.dpo import dpo_loss

    kw = dict(loss_type="sigmoid", beta=0.1, label_smoothing=0.0, average_logprobs=False, chosen_tokens=5.0)
    loss, metrics = dpo_loss(LP, _dpo_batch(), 2.0, **{**kw, **knobs})
    return loss.item(), metrics


def test_dpo_preference_loss_weight_and_sft_normalization():
    pref = (math.log(1 + math.exp(0.1)) + math.log(1 + math.exp(0.5))) / 2  # -log σ(β h), β = 0.1
    loss, metrics = _dpo(sft_weight=0.0)  # the defaults: today's loss
    assert loss == pytest.approx(pref, rel=1e-14) and metrics["preference_loss"] == pytest.approx(pref)
    loss, _ = _dpo(sft_weight=0.0, preference_loss_weight=0.5)
    assert loss == pytest.approx(0.5 * pref, rel=1e-14)
    # SFT NLL of the chosen: token: (2 + 6) / 5 = 1.6; sum: (2 + 6) / 2 pairs = 4; average: (1 + 2) / 2
    for mode, nll in (("token", 1.6), ("sum", 4.0), ("average", 1.5)):
        loss, metrics = _dpo(sft_weight=1.0, sft_normalization=mode)
        assert metrics["sft_nll"] == pytest.approx(nll, rel=1e-15), mode
        assert loss == pytest.approx(pref + nll, rel=1e-14), mode
    loss, _ = _dpo(sft_weight=1.0, preference_loss_weight=0.0, sft_normalization="sum")  # SFT only
    assert loss == pytest.approx(4.0, rel=1e-15)


# --- item 3: VAPO's positive_example_nll_weight ---------------------------------------------------

# rows: 0 reward 1 (tokens -1, -2), 1 reward 0 (token -3), 2 reward 0.5 (token -0.5; one masked slot)
VAPO_LP = [[-1.0, -2.0], [-3.0, -7.0], [-0.5, -4.0]]
VAPO_MASK = [[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]
VAPO_REWARDS = [1.0, 0.0, 0.5]


def _vapo(rows=(0, 1, 2), positive_normalizer=3.0, **knobs):
    """On-policy, A = 0: the policy-gradient term is 0 in value and gradient, only the NLL is left."""
    lp = torch.tensor([VAPO_LP[r] for r in rows], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([VAPO_MASK[r] for r in rows], dtype=torch.float64)
    positive = torch.tensor([VAPO_REWARDS[r] > 0 for r in rows])
    loss, metrics = clipped_pg_loss(
        lp, lp.detach(), torch.zeros(len(rows), dtype=torch.float64), mask, normalizer=4,
        positive_samples=positive, positive_normalizer=positive_normalizer, **knobs,
    )  # fmt: skip
    loss.backward()
    return loss.item(), metrics, lp.grad.flatten().tolist()


def test_positive_example_nll_hand_worked():
    # positive rows 0 and 2: valid tokens -1, -2, -0.5, N_pos = 3: nll = 3.5 / 3; μ = 0.1
    loss, metrics, grad = _vapo(positive_example_nll_weight=0.1)
    assert metrics["positive_nll"] == pytest.approx(3.5 / 3, rel=1e-15)
    assert loss == pytest.approx(0.1 * 3.5 / 3, rel=1e-15)
    g = -0.1 / 3  # ∇(μ Σ -log π / N_pos) per positive valid token; nothing elsewhere
    assert grad == pytest.approx([g, g, 0.0, 0.0, g, 0.0], rel=1e-15)
    # the same term with CISPO
    from posttrain.algorithms.policy_loss import cispo_loss

    lp = torch.tensor(VAPO_LP, dtype=torch.float64)
    _, m = cispo_loss(
        lp, lp, torch.zeros(3, dtype=torch.float64), torch.tensor(VAPO_MASK, dtype=torch.float64),
        normalizer=4, positive_example_nll_weight=0.1, positive_samples=torch.tensor([True, False, True]),
        positive_normalizer=3.0,
    )  # fmt: skip
    assert m["positive_nll"] == pytest.approx(3.5 / 3, rel=1e-15)


def test_positive_example_nll_boundary_cases():
    # weight 0 (the default): today's loss, no metric, the positives not even needed
    loss, metrics, grad = _vapo()
    assert loss == 0.0 and "positive_nll" not in metrics and grad == [0.0] * 6
    lp = _lp([-1.0, -2.0])
    base, _ = clipped_pg_loss(lp, _t([-1.2, -2.0]), torch.tensor([2.0]), torch.ones(1, 2), normalizer=2)
    same, _ = clipped_pg_loss(
        lp, _t([-1.2, -2.0]), torch.tensor([2.0]), torch.ones(1, 2), normalizer=2,
        positive_example_nll_weight=0.0,
    )  # fmt: skip
    assert same.item() == base.item()
    # no positive sample in the whole batch (N_pos = 0): the term is 0 (NeMo RL: correct_valid_toks = 0)
    loss, metrics, grad = _vapo(rows=(1,), positive_normalizer=0.0, positive_example_nll_weight=0.5)
    assert loss == 0.0 and metrics["positive_nll"] == 0.0 and grad == [0.0, 0.0]
    # reward exactly 0 is not positive; a weight > 0 needs the positives and their global count
    assert not (torch.tensor(VAPO_REWARDS) > 0)[1]
    with pytest.raises(ValueError, match="positive_normalizer"):
        _vapo(positive_normalizer=None, positive_example_nll_weight=0.1)
    with pytest.raises(ValueError, match=">= 0"):
        _vapo(positive_example_nll_weight=-0.1)
    with pytest.raises(ValueError):
        LossConfig(positive_example_nll_weight=-1.0)
    assert LossConfig().positive_example_nll_weight == 0.0


def test_positive_example_nll_is_split_invariant():
    # microbatches {0} and {1, 2} with the GLOBAL N_pos = 3 sum to the whole batch's term; NeMo RL's
    # per-microbatch count (2, then 1) would give (3 / 2 + 0.5 / 1) instead of 3.5 / 3
    whole, _, _ = _vapo(positive_example_nll_weight=0.1)
    first, _, _ = _vapo(rows=(0,), positive_example_nll_weight=0.1)
    rest, _, _ = _vapo(rows=(1, 2), positive_example_nll_weight=0.1)
    assert first + rest == pytest.approx(whole, rel=1e-15)
    assert first == pytest.approx(0.1 * 3 / 3, rel=1e-15) and rest == pytest.approx(0.1 * 0.5 / 3, rel=1e-15)


def test_positive_example_nll_in_the_trainer():
    # the batch carries the environment's rewards; positive_tokens counts the positive rows' valid
    # tokens over the whole minibatch; grpo_loss flags reward > 0
    from posttrain.algorithms.rl_loss import grpo_loss, loss_knobs, positive_tokens
    from posttrain.data.trajectory import Trajectory
    from posttrain.rollout.rollout import RLBatch, build_rl_batch

    rows = [Trajectory([5, 6, 7], [0, 1, 1], [0.0, -1.0, -2.0], [], {}, 0, reward=r) for r in VAPO_REWARDS]
    built = build_rl_batch(rows, torch.zeros(3), 0)
    assert built.rewards.tolist() == VAPO_REWARDS
    batch = RLBatch(
        input_ids=torch.zeros(3, 2, dtype=torch.long),
        attention_mask=torch.ones(3, 2, dtype=torch.long),
        loss_mask=torch.tensor(VAPO_MASK),
        advantages=torch.zeros(3, dtype=torch.float64),
        generation_logprobs=torch.tensor(VAPO_LP, dtype=torch.float64),
        rewards=torch.tensor(VAPO_REWARDS),
    )
    assert positive_tokens(batch) == 3.0
    assert positive_tokens(RLBatch(batch.input_ids, batch.attention_mask, batch.loss_mask)) == 0.0
    knobs = loss_knobs(LossConfig(positive_example_nll_weight=0.1))
    lp = torch.tensor(VAPO_LP, dtype=torch.float64, requires_grad=True)
    loss, metrics = grpo_loss(lp, batch, 4.0, token_normalizer=4.0, positive_normalizer=3.0, **knobs)
    assert loss.item() == pytest.approx(0.1 * 3.5 / 3, rel=1e-15)
    assert metrics["positive_nll"] == pytest.approx(3.5 / 3, rel=1e-15)


# --- item 12: message-level advantage penalties (invalid tool call, malformed thinking) ----------


def _flags(positions, shape=(2, 6)):
    out = torch.zeros(shape, dtype=torch.bool)
    for b, t in positions:
        out[b, t] = True
    return out


def test_message_advantage_penalties_nemo_rl_cases():
    from posttrain.algorithms.advantages import message_advantage_penalties

    # NeMo RL's test_apply_message_level_advantage_penalties_targets_flagged_message_spans: row 0's
    # turn at [2, 4) is an invalid call, row 1's at [1, 4) malformed thinking
    adv = torch.tensor([[0.0, 1, 2, 3, 4, 5], [10.0, 11, 12, 13, 14, 15]], dtype=torch.float64)
    invalid, malformed = _flags([(0, 2), (0, 3)]), _flags([(1, 1), (1, 2), (1, 3)])
    mask = torch.ones(2, 6)
    knobs = dict(invalid_tool_call_advantage=-5.0, malformed_thinking_advantage=-7.0)
    got = message_advantage_penalties(
        adv, mask, invalid_tool_call=invalid, malformed_thinking=malformed, **knobs
    )
    assert got.tolist() == [[0.0, 1, -5, -5, 4, 5], [10.0, -7, -7, -7, 14, 15]]
    # ..._materializes_broadcasted_advantages: per-sample [1, 10] spread over the tokens, input untouched
    per_sample = torch.tensor([1.0, 10.0], dtype=torch.float64)
    invalid, malformed = _flags([(0, 1), (0, 2), (0, 3)]), _flags([(1, 2), (1, 3)])
    got = message_advantage_penalties(
        per_sample, mask, invalid_tool_call=invalid, malformed_thinking=malformed, **knobs
    )
    assert got.tolist() == [[1.0, -5, -5, -5, 1, 1], [10.0, 10, -7, -7, 10, 10]]
    assert per_sample.tolist() == [1.0, 10.0] and got.stride(-1) != 0


def test_message_advantage_penalties_boundary_cases():
    from posttrain.algorithms.advantages import message_advantage_penalties

    adv = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    mask = torch.tensor([[0.0, 1, 1, 1], [0.0, 1, 1, 0], [0.0, 1, 1, 1]])
    # row 0: last turn [3, 4) invalid; row 1: [1, 3) malformed, and a flag on a masked position;
    # row 2: [1, 3) both: the invalid call wins (NeMo RL's order)
    invalid = _flags([(0, 3), (2, 1), (2, 2)], (3, 4))
    malformed = _flags([(1, 1), (1, 2), (1, 3), (2, 1), (2, 2)], (3, 4))

    def run(i, m):
        return message_advantage_penalties(
            adv, mask, invalid_tool_call=invalid, malformed_thinking=malformed,
            invalid_tool_call_advantage=i, malformed_thinking_advantage=m,
        )  # fmt: skip

    assert run(-5.0, -3.0).tolist() == [[0.5, 0.5, 0.5, -5], [-1, -3, -3, -1], [2, -5, -5, 2]]
    assert run(None, -3.0).tolist() == [[0.5, 0.5, 0.5, 0.5], [-1, -3, -3, -1], [2, -3, -3, 2]]
    assert run(-5.0, None).tolist() == [[0.5, 0.5, 0.5, -5], [-1, -1, -1, -1], [2, -5, -5, 2]]
    assert run(None, None) is adv  # the defaults: today's advantages, untouched
    with pytest.raises(ValueError, match="must match"):
        message_advantage_penalties(
            adv, mask, invalid_tool_call=invalid[:, :2], malformed_thinking=malformed,
            invalid_tool_call_advantage=-1.0, malformed_thinking_advantage=None,
        )  # fmt: skip


def test_message_advantage_penalties_in_the_trainer():
    # the turn spans and the environment's per-turn flags travel on the trajectory; the penalty
    # replaces the flagged turn's tokens' advantage, then advantage.clip applies (NeMo RL's order)
    from posttrain.config.loss import AdvantageConfig
    from posttrain.data.trajectory import EpisodeLimits, Trajectory
    from posttrain.environments.interface import EnvStepResult
    from posttrain.rollout.episode import apply_step
    from posttrain.rollout.rollout import flagged_turn_tokens
    from posttrain.trainers.grpo import apply_message_penalties

    t = Trajectory([7, 8, 9, 10, 11], [0, 1, 1, 0, 1], [0.0] * 5, [], {}, 0)
    t.turn_spans = [(1, 3), (4, 5)]
    for invalid, malformed in ((True, False), (False, True)):  # turn 1: a broken call; turn 2: thinking
        step = EnvStepResult(
            [0.0], [None], [True], [{}], invalid_tool_call=[invalid], malformed_thinking=[malformed]
        )
        apply_step(t, step, 0, [], tokenizer=None, limits=EpisodeLimits(max_turns=9, max_seq_len=99))
    assert t.turn_invalid_tool_call == [True, False] and t.turn_malformed_thinking == [False, True]
    plain = Trajectory([7, 8, 9, 10, 11], [0, 1, 1, 0, 1], [0.0] * 5, [], {}, 0, turn_spans=[(1, 3)])
    invalid, malformed = flagged_turn_tokens([t, plain], (2, 5))
    assert invalid.tolist() == [[False, True, True, False, False], [False] * 5]
    assert malformed.tolist() == [[False, False, False, False, True], [False] * 5]

    adv, mask = torch.tensor([1.5, -0.5], dtype=torch.float64), torch.tensor([[0.0, 1, 1, 0, 1]] * 2)
    cfg = AdvantageConfig(invalid_tool_call_advantage=-5.0, malformed_thinking_advantage=-3.0, clip_low=-4.0)
    got, metrics = apply_message_penalties(cfg, adv, mask, [t, plain])
    assert got.tolist() == [[1.5, -4.0, -4.0, 1.5, -3.0], [-0.5] * 5]  # -5 clipped at -4
    assert metrics == {"invalid_tool_call_rate": 1 / 3, "malformed_thinking_rate": 1 / 3}  # of 3 turns
    same, none = apply_message_penalties(AdvantageConfig(), adv, mask, [t, plain])
    assert same is adv and none == {}
    assert EnvStepResult([0.0], [None], [True], [{}]).invalid_tool_call == [False]


def test_tool_environment_flags_invalid_calls_and_malformed_thinking():
    from posttrain.environments.tools import ToolEnvironment, ToolRegistry, malformed_thinking

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first
            b: the second
        """
        return a + b

    class Env(ToolEnvironment):
        def score(self, reply, metadata):
            return 1.0, {}

    def call(name, **arguments):
        import json

        return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"

    replies = [
        call("add", a=1, b=2),  # runs: valid
        "<tool_call>{add 1 2}</tool_call>",  # not JSON
        call("multiply", a=1, b=2),  # unknown tool
        call("add", a=1),  # arguments that do not fit
        call("add", a="x", b=1),  # an argument of the wrong type
        "<think>sum</think> \\boxed{3}",  # a final reply, well-formed thinking
        "The answer <think>is</think> 3",  # thinking after the answer began
    ]
    env = Env(ToolRegistry([add]), max_tool_calls=9)
    logs = [[{"role": "user", "content": "1 + 2?"}, {"role": "assistant", "content": r}] for r in replies]
    result = env.step(logs, [{"tool_calls": 0, "tool_errors": 0}] * len(logs))
    assert result.invalid_tool_call == [False, True, True, True, True, False, False]
    assert result.malformed_thinking == [False] * 6 + [True]
    # a tool that raises on valid arguments is a tool error, not an invalid call
    raising = Env(ToolRegistry([_divide_tool()]), max_tool_calls=9)
    result = raising.step([[{"role": "assistant", "content": call("divide", x=1, y=0)}]], [{}])
    assert result.invalid_tool_call == [False] and result.info[0]["tool_errors"] == 1
    cases = {
        "no thinking at all": False,
        "<think>a</think>answer": False,
        "  <THINK>a</THINK> answer": False,
        "reasoning opened by the template</think> answer": False,
        "<think>cut short": True,
        "<think>a</think><think>b</think> answer": True,
        "answer <think>a</think>": True,
        "</think> a </think>": True,
        "stray <think>": True,
        "</think><think>": True,
    }
    assert {text: malformed_thinking(text) for text in cases} == cases


def _divide_tool():
    def divide(x: float, y: float) -> float:
        """Divide.

        Args:
            x: numerator
            y: denominator
        """
        return x / y

    return divide
