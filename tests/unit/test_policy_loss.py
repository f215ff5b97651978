import math

import pytest
import torch

from posttrain.algorithms.importance import importance_weights, sequence_log_ratio
from posttrain.algorithms.kl import kl_estimate, kl_penalty
from posttrain.algorithms.losses import aggregate, masked_mean
from posttrain.algorithms.metrics import accumulate_metrics
from posttrain.algorithms.policy_loss import POLICY_LOSSES, cispo_loss, clipped_pg_loss

ln = math.log


def _lp(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def _ratios_case(ratios, advantage, loss_fn=clipped_pg_loss, **kwargs):
    """One sequence, old logprobs 0, current logprobs log(ratio) -> token ratios exactly `ratios`."""
    lp = _lp([[ln(r) for r in ratios]])
    old = torch.zeros_like(lp)
    mask = torch.ones_like(lp)
    loss, metrics = loss_fn(
        lp, old, torch.tensor([advantage], dtype=torch.float64), mask, normalizer=len(ratios), **kwargs
    )
    loss.backward()
    return loss.item(), metrics, lp.grad[0].tolist()


def test_positive_advantage_clips_only_above():
    # A = +1, ratios r = [0.5, 1.1, 1.5], eps = 0.2 -> clip(r) = [0.8, 1.1, 1.2]
    # l = max(-A r, -A clip r) = max([-0.5, -1.1, -1.5], [-0.8, -1.1, -1.2]) = [-0.5, -1.1, -1.2]
    # loss = -2.8 / 3; the 3rd token is clipped (its gradient is 0)
    # dl/dlogπ = -A r on unclipped tokens -> grad = [-0.5, -1.1, 0] / 3
    loss, metrics, grad = _ratios_case([0.5, 1.1, 1.5], 1.0)
    assert loss == pytest.approx(-2.8 / 3)
    assert metrics["pg_loss"] == pytest.approx(-2.8 / 3)
    assert metrics["clip_fraction"] == pytest.approx(1 / 3)
    assert metrics["ratio_mean"] == pytest.approx(3.1 / 3)
    assert grad == pytest.approx([-0.5 / 3, -1.1 / 3, 0.0])


def test_negative_advantage_clips_only_below():
    # A = -1: -A r = [0.5, 1.1, 1.5], -A clip r = [0.8, 1.1, 1.2] -> l = [0.8, 1.1, 1.5], loss 3.4 / 3
    # the 1st token is clipped; grad = -A r = [0, 1.1, 1.5] / 3
    loss, metrics, grad = _ratios_case([0.5, 1.1, 1.5], -1.0)
    assert loss == pytest.approx(3.4 / 3)
    assert metrics["clip_fraction"] == pytest.approx(1 / 3)
    assert grad == pytest.approx([0.0, 1.1 / 3, 1.5 / 3])


def test_clip_higher_is_asymmetric():
    # A = +1, ratios [1.25, 1.3, 0.7]
    # symmetric eps 0.2: clip = [1.2, 1.2, 0.8]; l = max([-1.25, -1.3, -0.7], [-1.2, -1.2, -0.8])
    #   = [-1.2, -1.2, -0.7] -> sum -3.1
    # clip_high 0.28:     clip = [1.25, 1.28, 0.8]; l = [-1.25, -1.28, -0.7] -> sum -3.23
    sym, m_sym, _ = _ratios_case([1.25, 1.3, 0.7], 1.0)
    dapo, m_dapo, _ = _ratios_case([1.25, 1.3, 0.7], 1.0, clip_high=0.28)
    assert sym == pytest.approx(-3.1 / 3)
    assert dapo == pytest.approx(-3.23 / 3)
    assert m_sym["clip_fraction"] == pytest.approx(2 / 3)
    assert m_dapo["clip_fraction"] == pytest.approx(1 / 3)
    # the lower bound is still 0.8 for a negative advantage: -A r = [1.25, 1.3, 0.7] ->
    # l = max(., [1.25, 1.28, 0.8]) = [1.25, 1.3, 0.8] -> 3.35
    neg, _, _ = _ratios_case([1.25, 1.3, 0.7], -1.0, clip_high=0.28)
    assert neg == pytest.approx(3.35 / 3)


def test_dual_clip_caps_negative_advantages_only():
    # seq 0: A = -1, ratios [0.5, 2, 4]: l = max([0.5, 2, 4], [0.8, 1.2, 1.2]) = [0.8, 2, 4]
    #        dual clip c = 3 caps at -cA = 3: l = [0.8, 2, 3] (sum 5.8; without dual 6.8)
    # seq 1: A = +1, ratios [4, 1, 0.1]: l = max([-4, -1, -0.1], [-1.2, -1, -0.8]) = [-1.2, -1, -0.1]
    #        (sum -2.3, unchanged by dual clip)
    lp = _lp([[ln(0.5), ln(2.0), ln(4.0)], [ln(4.0), 0.0, ln(0.1)]])
    adv = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    mask = torch.ones_like(lp)
    old = torch.zeros_like(lp)
    loss, metrics = clipped_pg_loss(lp, old, adv, mask, normalizer=6, dual_clip=3.0)
    plain, _ = clipped_pg_loss(lp, old, adv, mask, normalizer=6)
    assert loss.item() == pytest.approx((5.8 - 2.3) / 6)
    assert plain.item() == pytest.approx((6.8 - 2.3) / 6)
    assert metrics["dual_clip_fraction"] == pytest.approx(1 / 6)
    loss.backward()
    # grads (-A r on unclipped tokens): seq 0 -> [0 (clipped), 2, 0 (dual-capped)] / 6
    #                                   seq 1 -> [0 (clipped), -1, -0.1] / 6
    assert lp.grad.tolist()[0] == pytest.approx([0.0, 2 / 6, 0.0])
    assert lp.grad.tolist()[1] == pytest.approx([0.0, -1 / 6, -0.1 / 6])


# KL estimators on d = logπ - logπ_ref = [0.5, 0, -1]  (log r = -d = [-0.5, 0, 1]):
#   k1 = d                      = [0.5, 0, -1]
#   k2 = d^2 / 2                = [0.125, 0, 0.5]
#   k3 = e^{log r} - log r - 1  = [e^-0.5 - 0.5, 0, e - 2] = [0.1065307, 0, 0.7182818]
KL_LP = [[-1.0, -0.5, -2.0]]
KL_REF = [[-1.5, -0.5, -1.0]]
KL_EXPECTED = {
    "k1": [0.5, 0.0, -1.0],
    "k2": [0.125, 0.0, 0.5],
    "k3": [math.exp(-0.5) - 0.5, 0.0, math.e - 2],
}


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_hand_worked(estimator):
    per_token = kl_estimate(torch.tensor(KL_LP), torch.tensor(KL_REF), estimator)
    assert per_token[0].tolist() == pytest.approx(KL_EXPECTED[estimator], abs=1e-6)


@pytest.mark.parametrize("gradient", ["exact", "plain"])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_penalty_in_loss(estimator, gradient):
    # zero advantages + on-policy shortcut: pg term is 0, loss = beta * mean_t k(t)
    lp = _lp(KL_LP)
    ref = torch.tensor(KL_REF, dtype=torch.float64)
    adv = torch.zeros(1, dtype=torch.float64)
    loss, metrics = clipped_pg_loss(
        lp, lp.detach(), adv, torch.ones_like(lp), normalizer=3, reference_logprobs=ref,
        kl_beta=0.1, kl_estimator=estimator, kl_gradient=gradient,
    )  # fmt: skip
    kl_mean = sum(KL_EXPECTED[estimator]) / 3
    assert loss.item() == pytest.approx(0.1 * kl_mean)  # the value does not depend on `gradient`
    assert metrics["kl"] == pytest.approx(kl_mean)
    assert metrics["pg_loss"] == 0.0
    loss.backward()
    # plain, d/d logπ of the estimate: k1 -> 1; k2 -> d = [0.5, 0, -1];
    #   k3 -> 1 - π_ref/π = 1 - e^{log r} = [1 - e^-0.5, 0, 1 - e]
    # exact: k1 and k3 times exp(logπ - sg logπ) (value 1) add k itself:
    #   k1 -> 1 + d = [1.5, 1, 0];  k3 -> (1 - e^{log r}) + (e^{log r} - log r - 1) = -log r = d
    #   (k2 unchanged: d). Every estimator then has the per-token gradient d of KL(π||π_ref).
    d = [0.5, 0.0, -1.0]
    plain = {"k1": [1.0, 1.0, 1.0], "k2": d, "k3": [1 - math.exp(-0.5), 0.0, 1 - math.e]}
    exact = {"k1": [1.5, 1.0, 0.0], "k2": d, "k3": d}
    expected = (exact if gradient == "exact" else plain)[estimator]
    assert lp.grad[0].tolist() == pytest.approx([0.1 * g / 3 for g in expected])


def _expected_kl_gradient(estimator: str, gradient: str, vocab: int = 5, seed: int = 0):
    """E_{x ~ π}[∇θ loss(x)] of the KL term over a categorical π = softmax(θ), summed exactly over
    the vocabulary (float64), and autograd of the exact KL(π || π_ref) and KL(π_ref || π)."""
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(vocab, generator=gen, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(2 * torch.randn(vocab, generator=gen, dtype=torch.float64), -1)
    logp = torch.log_softmax(theta, -1)
    probs = logp.exp().detach()
    expected = torch.zeros_like(theta)
    for x in range(vocab):  # one sampled token x, its loss term, weighted by π(x)
        lp = logp[x].view(1, 1)
        loss, _ = clipped_pg_loss(
            lp, lp.detach(), torch.zeros(1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64),
            normalizer=1, reference_logprobs=ref[x].view(1, 1), kl_beta=1.0, kl_estimator=estimator,
            kl_gradient=gradient, kl_input_clamp=None, kl_output_clamp=None,
        )  # fmt: skip
        (grad,) = torch.autograd.grad(loss, theta, retain_graph=True)
        expected += probs[x] * grad
    (forward,) = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), theta, retain_graph=True)
    (reverse,) = torch.autograd.grad((ref.exp() * (ref - logp)).sum(), theta)
    return expected, forward, reverse


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_expected_gradient_is_gradient_of_exact_kl(estimator, seed):
    # Σ_x π(x) ∇ loss(x) = ∇ Σ_x π(x) (log π(x) - log π_ref(x)) exactly, for every estimator
    expected, forward, reverse = _expected_kl_gradient(estimator, "exact", seed=seed)
    assert forward.abs().max() > 0.1 and (forward - reverse).abs().max() > 0.05
    assert torch.allclose(expected, forward, rtol=1e-10, atol=1e-12)


def test_plain_kl_gradient_is_not_the_kl_gradient():
    # the old behaviour (the estimate as a plain loss term), still available as kl_gradient=plain:
    # k1 has zero expected gradient, k3 gives ∇KL(π_ref || π) (the reverse KL); k2 is right
    k1, forward, _ = _expected_kl_gradient("k1", "plain")
    assert torch.allclose(k1, torch.zeros_like(k1), atol=1e-12)
    assert not torch.allclose(k1, forward, atol=1e-3)
    k3, forward, reverse = _expected_kl_gradient("k3", "plain")
    assert torch.allclose(k3, reverse, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(k3, forward, atol=1e-3)
    k2, forward, _ = _expected_kl_gradient("k2", "plain")
    assert torch.allclose(k2, forward, rtol=1e-10, atol=1e-12)


def test_kl_penalty_function_value_and_registry():
    lp, ref = _lp(KL_LP), torch.tensor(KL_REF, dtype=torch.float64)
    for estimator in ("k1", "k2", "k3"):
        exact = kl_penalty(lp, ref, estimator)
        assert exact[0].tolist() == pytest.approx(KL_EXPECTED[estimator])
    with pytest.raises(ValueError, match="kl gradient"):
        kl_penalty(lp, ref, "k3", gradient="reverse")


def test_kl_clamps():
    # token 0: logπ = -30, logπ_ref = 0 -> log r = 30, clamped to 20 before the estimator
    #   k3 = e^20 - 20 - 1 (4.85e8) -> clamped to 10 after it; unclamped e^30 - 31 = 1.07e13
    # token 1: logπ = 0, logπ_ref = -25 -> log r = -25 -> clamp -20: k1 = 20 -> output clamp 10
    #   k3 = e^-20 + 20 - 1 = 19.000000002 -> 10
    # token 2: inside the bounds: log r = -0.5: k1 = 0.5, k3 = e^-0.5 - 0.5
    lp = torch.tensor([[-30.0, 0.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[0.0, -25.0, -0.5]], dtype=torch.float64)
    k3 = kl_estimate(lp, ref, "k3", input_clamp=20.0, output_clamp=10.0)
    assert k3[0].tolist() == pytest.approx([10.0, 10.0, math.exp(-0.5) - 0.5])
    assert kl_estimate(lp, ref, "k3")[0, 0].item() == pytest.approx(math.exp(30) - 31)
    assert kl_estimate(lp, ref, "k3", input_clamp=20.0)[0, 0].item() == pytest.approx(math.exp(20) - 21)
    k1 = kl_estimate(lp, ref, "k1", input_clamp=20.0, output_clamp=10.0)
    assert k1[0].tolist() == pytest.approx([-10.0, 10.0, 0.5])
    # the loss uses NeMo RL's 20 / 10 by default; null switches them off
    grad_lp = lp.clone().requires_grad_(True)
    loss, metrics = clipped_pg_loss(
        grad_lp, lp, torch.zeros(1, dtype=torch.float64), torch.ones_like(lp), normalizer=3,
        reference_logprobs=ref, kl_beta=1.0,
    )  # fmt: skip
    assert metrics["kl"] == pytest.approx((20 + math.exp(-0.5) - 0.5) / 3)
    assert torch.isfinite(loss)
    _, off = clipped_pg_loss(
        lp, lp, torch.zeros(1, dtype=torch.float64), torch.ones_like(lp), normalizer=3,
        reference_logprobs=ref, kl_input_clamp=None, kl_output_clamp=None,
    )  # fmt: skip
    assert off["kl"] == pytest.approx((math.exp(30) - 31 + math.exp(-25) + 24 + math.exp(-0.5) - 0.5) / 3)


# Clamped tokens (issue #29 item 8), float64, at the default clamps 20 / 10; log r = ref - lp, d = -log r.
# A token a clamp cut has the clamp's constant as its value and gradient 0 w.r.t. log π, in both
# gradient modes. Inside the bounds: plain d/dlogπ of the estimate, k1 -> 1, k2 -> d, k3 -> 1 - e^{log r};
# exact adds the value itself: k1 -> 1 + d, k3 -> d (k2 unchanged).
#   t0: log r = 3 (d = -3)  k1 = -3 (in), k2 = 4.5 (in), k3 = e^3 - 4 = 16.09 -> 10 (output max)
#   t1: log r = -12         k1 = 12 -> 10 (output max), k2 = 72 -> 10, k3 = e^-12 + 11 -> 10
#   t2: log r = 12          k1 = -12 -> -10 (output MIN), k2 -> 10, k3 = e^12 - 13 -> 10
#   t3: log r = 25          input max: log r -> 20: k1 = -20 -> -10, k2 = 200 -> 10, k3 -> 10
#   t4: log r = -25         input MIN: log r -> -20: k1 = 20 -> 10, k2 -> 10, k3 = e^-20 + 19 -> 10
#   t5: log r = -2 (d = 2)  in: k1 = 2, k2 = 2, k3 = e^-2 + 1
#   t6: log r = 0.5         in: k1 = -0.5, k2 = 0.125, k3 = e^0.5 - 1.5
CLAMP_LP = [[-3.0, 0.0, -12.0, -25.0, 0.0, -1.0, -2.0]]
CLAMP_REF = [[0.0, -12.0, 0.0, 0.0, -25.0, -3.0, -1.5]]
CLAMP_VALUE = {
    "k1": [-3.0, 10.0, -10.0, -10.0, 10.0, 2.0, -0.5],
    "k2": [4.5, 10.0, 10.0, 10.0, 10.0, 2.0, 0.125],
    "k3": [10.0, 10.0, 10.0, 10.0, 10.0, math.exp(-2) + 1, math.exp(0.5) - 1.5],
}
CLAMP_GRAD = {
    ("k1", "exact"): [-2.0, 0, 0, 0, 0, 3.0, 0.5],
    ("k1", "plain"): [1.0, 0, 0, 0, 0, 1.0, 1.0],
    ("k2", "exact"): [-3.0, 0, 0, 0, 0, 2.0, -0.5],
    ("k2", "plain"): [-3.0, 0, 0, 0, 0, 2.0, -0.5],
    ("k3", "exact"): [0, 0, 0, 0, 0, 2.0, -0.5],
    ("k3", "plain"): [0, 0, 0, 0, 0, 1 - math.exp(-2), 1 - math.exp(0.5)],
}


@pytest.mark.parametrize("gradient", ["exact", "plain"])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_penalty_clamped_tokens_have_no_gradient(estimator, gradient):
    lp = _lp(CLAMP_LP)
    ref = torch.tensor(CLAMP_REF, dtype=torch.float64)
    per_token = kl_penalty(lp, ref, estimator, gradient=gradient)  # defaults: 20 / 10
    assert per_token[0].tolist() == pytest.approx(CLAMP_VALUE[estimator], rel=1e-12)
    per_token.sum().backward()
    assert lp.grad[0].tolist() == pytest.approx(CLAMP_GRAD[(estimator, gradient)], rel=1e-12, abs=0)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_penalty_each_clamp_alone_stops_the_gradient(estimator):
    # input clamp only, both bounds: t3 (log r = 25 -> 20) and t4 (log r = -25 -> -20);
    # t5 inside keeps its exact gradient (k1: 1 + d = 3, k3: d = 2)
    lp = _lp([[-25.0, 0.0, -1.0]])
    ref = torch.tensor([[0.0, -25.0, -3.0]], dtype=torch.float64)
    out = kl_penalty(lp, ref, estimator, input_clamp=20.0, output_clamp=None)
    values = {"k1": [-20.0, 20.0, 2.0], "k3": [math.exp(20) - 21, math.exp(-20) + 19, math.exp(-2) + 1]}
    assert out[0].tolist() == pytest.approx(values[estimator], rel=1e-12)
    out.sum().backward()
    assert lp.grad[0].tolist() == pytest.approx(
        [0.0, 0.0, {"k1": 3.0, "k3": 2.0}[estimator]], rel=1e-12, abs=0
    )
    # output clamp only: k1 = 12 -> 10 (max) and -12 -> -10 (min); k3 = e^-12 + 11 -> 10, e^12 - 13 -> 10
    lp = _lp([[0.0, -12.0, -1.0]])
    ref = torch.tensor([[-12.0, 0.0, -3.0]], dtype=torch.float64)
    out = kl_penalty(lp, ref, estimator, input_clamp=None, output_clamp=10.0)
    values = {"k1": [10.0, -10.0, 2.0], "k3": [10.0, 10.0, math.exp(-2) + 1]}
    assert out[0].tolist() == pytest.approx(values[estimator], rel=1e-12)
    out.sum().backward()
    assert lp.grad[0].tolist() == pytest.approx(
        [0.0, 0.0, {"k1": 3.0, "k3": 2.0}[estimator]], rel=1e-12, abs=0
    )


def test_clipped_pg_loss_kl_term_clamped_token_has_no_gradient():
    # the loss's KL term at the defaults (k3, exact, 20 / 10): t0 (k3 clamped at 10) gets no gradient,
    # t5 (inside) gets beta * d / N = 0.5 * 2 / 2 = 0.5; advantages 0, on-policy: no pg gradient
    lp = _lp([[-3.0, -1.0]])
    ref = torch.tensor([[0.0, -3.0]], dtype=torch.float64)
    loss, metrics = clipped_pg_loss(
        lp, lp.detach(), torch.zeros(1, dtype=torch.float64), torch.ones_like(lp), normalizer=2,
        reference_logprobs=ref, kl_beta=0.5,
    )  # fmt: skip
    assert metrics["kl"] == pytest.approx((10.0 + math.exp(-2) + 1) / 2, rel=1e-12)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([0.0, 0.5], rel=1e-12, abs=0)


def test_kl_metric_reported_without_penalty():
    lp = _lp(KL_LP)
    ref = torch.tensor(KL_REF, dtype=torch.float64)
    adv = torch.ones(1, dtype=torch.float64)
    loss, metrics = clipped_pg_loss(
        lp, lp.detach(), adv, torch.ones_like(lp), normalizer=3, reference_logprobs=ref
    )
    assert loss.item() == pytest.approx(-1.0)  # on-policy: ratio 1, l = -A = -1 per token
    assert metrics["kl"] == pytest.approx(sum(KL_EXPECTED["k3"]) / 3)
    _, no_ref = clipped_pg_loss(lp, lp.detach(), adv, torch.ones_like(lp), normalizer=3)
    assert "kl" not in no_ref


# Token vs sequence aggregation, on-policy shortcut (ratio = 1, so l = -A on valid tokens):
#   seq 0: A = +3, 1 valid token   -> per-token l = [-3]
#   seq 1: A = -2, 3 valid tokens  -> per-token l = [2, 2, 2]
#   masked slots hold NaN / huge values that must not leak.
AGG_LP = [[float("nan"), 50.0, -0.7], [-0.2, -1.3, -0.4]]
AGG_MASK = [[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
AGG_ADV = [3.0, -2.0]


def _agg_case(aggregation, normalizer):
    lp = _lp(AGG_LP)
    mask = torch.tensor(AGG_MASK, dtype=torch.float64)
    old = lp.detach().clone()
    old[0, 1] = -60.0  # exp(50 - (-60)) would overflow if masked slots were not zeroed
    loss, metrics = clipped_pg_loss(
        lp,
        old,
        torch.tensor(AGG_ADV, dtype=torch.float64),
        mask,
        normalizer=normalizer,
        aggregation=aggregation,
    )
    loss.backward()
    return loss.item(), metrics, lp.grad.tolist()


def test_token_aggregation():
    # sum over valid tokens / N_tokens = (-3 + 6) / 4 = 0.75; grad = -A / 4 on valid tokens
    loss, metrics, grad = _agg_case("token", 4)
    assert loss == pytest.approx(0.75)
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert grad == [[0.0, 0.0, pytest.approx(-0.75)], [pytest.approx(0.5)] * 3]


def test_sequence_aggregation():
    # per-sequence token means [-3, 2], summed / N_seqs = -1 / 2 = -0.5
    # grad: seq 0 -> -3 / 1 / 2 = -1.5; seq 1 -> 2 / 3 / 2 = 1/3 per token
    loss, _, grad = _agg_case("sequence", 2)
    assert loss == pytest.approx(-0.5)
    assert grad == [[0.0, 0.0, pytest.approx(-1.5)], [pytest.approx(1 / 3)] * 3]


def test_seq_mean_token_sum_aggregation():
    # Dr.GRPO: token sums [-3, 6] / (N_seqs * max_len) with max_len = 4: 3 / 8 = 0.375
    loss, _, grad = _agg_case("seq_mean_token_sum", 2 * 4)
    assert loss == pytest.approx(0.375)
    assert grad == [[0.0, 0.0, pytest.approx(-3 / 8)], [pytest.approx(2 / 8)] * 3]


def test_masked_mean_and_aggregate_hand_worked():
    x = torch.tensor([[1.0, 2.0, float("inf")], [4.0, float("nan"), 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert masked_mean(x, m).item() == pytest.approx(13 / 4)
    assert masked_mean(x, m, dim=-1).tolist() == pytest.approx([1.5, 5.0])
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0
    assert aggregate(x, m, aggregation="sequence", normalizer=4).item() == pytest.approx(6.5 / 4)
    with pytest.raises(ValueError, match="Did you mean 'sequence'"):
        aggregate(x, m, aggregation="sequences", normalizer=1)


# GSPO: one sequence, logπ - logπ_old = [0.1, 0.3] on 2 valid tokens (3rd masked), A = +1
#   log s = mean = 0.2, s = e^0.2 = 1.2214028
#   token-level ratios would be [e^0.1, e^0.3] = [1.1051709, 1.3498588]


def _gspo_case(clip, ratio_level="sequence"):
    lp = _lp([[-1.0, -2.0, float("nan")]])
    old = torch.tensor([[-1.1, -2.3, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([1.0], dtype=torch.float64)
    loss, metrics = clipped_pg_loss(
        lp, old, adv, mask, normalizer=1, ratio_level=ratio_level, aggregation="sequence",
        clip_low=clip, clip_high=clip,
    )  # fmt: skip
    loss.backward()
    return loss.item(), metrics, lp.grad[0].tolist()


def test_gspo_sequence_ratio_value_and_gradient():
    s = math.exp(0.2)
    assert sequence_log_ratio(
        torch.tensor([[-1.0, -2.0, 9.0]]), torch.tensor([[-1.1, -2.3, 0.0]]), torch.tensor([[1, 1, 0]])
    ).item() == pytest.approx(0.2)
    # unclipped (eps 0.4): loss = -(1/2)(s + s) = -s; GSPO gradient: -A * s / |y| per valid token
    loss, metrics, grad = _gspo_case(0.4)
    assert loss == pytest.approx(-s)
    assert metrics["ratio_mean"] == pytest.approx(s)
    assert grad == [pytest.approx(-s / 2), pytest.approx(-s / 2), 0.0]
    # the same gradient as autograd through the sequence objective J = s(logπ) * A directly
    lp = torch.tensor([-1.0, -2.0], dtype=torch.float64, requires_grad=True)
    (-torch.exp((lp - torch.tensor([-1.1, -2.3], dtype=torch.float64)).mean())).backward()
    assert grad[:2] == pytest.approx(lp.grad.tolist())
    # token-level ratio differs (both < 1.4, unclipped): -(e^0.1 + e^0.3)/2 = -1.2275149
    token_loss, _, token_grad = _gspo_case(0.4, ratio_level="token")
    assert token_loss == pytest.approx(-(math.exp(0.1) + math.exp(0.3)) / 2)
    assert token_grad[:2] == pytest.approx([-math.exp(0.1) / 2, -math.exp(0.3) / 2])


def test_gspo_clips_whole_sequence():
    # eps 0.15: s = 1.2214 > 1.15 -> every token's loss is -1.15, no gradient, clip fraction 1
    # (token level would clip only the 2nd token: e^0.1 = 1.105 < 1.15 < e^0.3)
    loss, metrics, grad = _gspo_case(0.15)
    assert loss == pytest.approx(-1.15)
    assert metrics["clip_fraction"] == pytest.approx(1.0)
    assert grad == [0.0, 0.0, 0.0]
    _, token_metrics, _ = _gspo_case(0.15, ratio_level="token")
    assert token_metrics["clip_fraction"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "correction, expected_w", [("plain", [0.5, 1.5, 4.0]), ("truncated", [0.5, 1.5, 2.0])]
)
def test_importance_correction(correction, expected_w):
    # on-policy shortcut (ratio 1), A = +1 -> l = -1 * w with w = π_old / π_gen = [0.5, 1.5, 4]
    # truncated at cap 2: w = [0.5, 1.5, 2] -> loss -4 / 3 (plain: -6 / 3)
    lp = _lp([[-1.0, -2.0, -0.5]])
    gen = lp.detach() - torch.tensor([[ln(0.5), ln(1.5), ln(4.0)]], dtype=torch.float64)
    loss, metrics = clipped_pg_loss(
        lp, lp.detach(), torch.ones(1, dtype=torch.float64), torch.ones_like(lp), normalizer=3,
        generation_logprobs=gen, importance_correction=correction, importance_cap=2.0,
    )  # fmt: skip
    assert loss.item() == pytest.approx(-sum(expected_w) / 3)
    assert metrics["importance_weight_mean"] == pytest.approx(sum(expected_w) / 3)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-w / 3 for w in expected_w])


def _importance_case(correction, weights, *, mask=None, **kwargs):
    """On-policy shortcut (ratio 1), A = +1, engine logprobs such that π_old / π_gen = `weights`."""
    w = torch.tensor(weights, dtype=torch.float64)
    lp = _lp((-torch.arange(1, w.numel() + 1, dtype=torch.float64).view_as(w) / 4).tolist())
    gen = lp.detach() - w.log()
    mask = torch.ones_like(lp) if mask is None else torch.tensor(mask, dtype=torch.float64)
    loss, metrics = clipped_pg_loss(
        lp, lp.detach(), torch.ones(w.shape[0], dtype=torch.float64), mask, normalizer=float(mask.sum()),
        generation_logprobs=gen, importance_correction=correction, **kwargs,
    )  # fmt: skip
    loss.backward()
    return loss.item(), metrics, lp.grad


def test_truncated_importance_sampling_with_lower_bound():
    # w = [0.5, 1.5, 4], bounds [0.6, 2]: clamp -> [0.6, 1.5, 2]; tokens 0 and 2 were out of bounds
    loss, metrics, grad = _importance_case(
        "truncated", [[0.5, 1.5, 4.0]], importance_cap=2.0, importance_min=0.6
    )
    assert loss == pytest.approx(-4.1 / 3)
    assert metrics["importance_weight_mean"] == pytest.approx(4.1 / 3)
    assert metrics["is_oob_ratio"] == pytest.approx(2 / 3)
    assert grad[0].tolist() == pytest.approx([-0.6 / 3, -1.5 / 3, -2.0 / 3])


def test_icepop_zeroes_tokens_out_of_bounds():
    # w = [0.5, 1.5, 4], bounds [0.6, 2]: tokens 0 and 2 dropped -> weights [0, 1.5, 0]
    loss, metrics, grad = _importance_case(
        "icepop", [[0.5, 1.5, 4.0]], importance_cap=2.0, importance_min=0.6
    )
    assert loss == pytest.approx(-1.5 / 3)
    assert metrics["is_oob_ratio"] == pytest.approx(2 / 3)
    assert grad[0].tolist() == pytest.approx([0.0, -1.5 / 3, 0.0])
    # without a lower bound only the token above the cap goes
    loss, metrics, _ = _importance_case("icepop", [[0.5, 1.5, 4.0]], importance_cap=2.0)
    assert loss == pytest.approx(-2.0 / 3) and metrics["is_oob_ratio"] == pytest.approx(1 / 3)


def test_sequence_masked_tis_drops_whole_sequences():
    # seq 0: w = [0.5, 2]   geometric mean sqrt(0.5 * 2) = 1      in [0.6, 2]: kept, raw weights
    # seq 1: w = [1.5, 4]   geometric mean sqrt(6) = 2.449 > 2     dropped (both tokens)
    # (token-level: 0.5 < 0.6 and 4 > 2 would be out; at sequence level only seq 1 is)
    # seq 2: w = [3, 9] with the 2nd token masked: geometric mean over valid tokens = 3 > 2: dropped
    weights = [[0.5, 2.0], [1.5, 4.0], [3.0, 9.0]]
    mask = [[1, 1], [1, 1], [1, 0]]
    loss, metrics, grad = _importance_case(
        "seq_mask", weights, mask=mask, importance_cap=2.0, importance_min=0.6
    )
    assert loss == pytest.approx(-2.5 / 5)
    assert metrics["importance_weight_mean"] == pytest.approx(2.5 / 5)
    assert metrics["is_oob_ratio"] == pytest.approx(3 / 5)
    assert grad.tolist() == [[pytest.approx(-0.5 / 5), pytest.approx(-2.0 / 5)], [0.0, 0.0], [0.0, 0.0]]


def test_importance_weights_function():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    gen = -torch.tensor([[ln(0.5), ln(1.5), ln(4.0)]])
    w, out = importance_weights(old, gen, torch.ones(1, 3), correction="plain")
    assert w[0].tolist() == pytest.approx([0.5, 1.5, 4.0]) and not out.any()
    w, out = importance_weights(old, gen, torch.tensor([[1, 1, 0]]), correction="truncated", cap=1.0)
    assert w[0].tolist() == pytest.approx([0.5, 1.0, 0.0]) and out[0].tolist() == [False, True, False]
    with pytest.raises(ValueError, match="importance_min"):
        importance_weights(old, gen, torch.ones(1, 3), correction="icepop", cap=1.0, min_ratio=1.5)


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # A = +1, ratios [0.5, 1.1, 1.5], eps 0.2: ŵ = sg(clip(r, 0.8, 1.2)) = [0.8, 1.1, 1.2]
    # l = -A ŵ (value), ∇ = -A ŵ ∇logπ: every token keeps a gradient (PPO cuts token 2's: see
    # test_positive_advantage_clips_only_above)
    loss, metrics, grad = _ratios_case([0.5, 1.1, 1.5], 1.0, loss_fn=cispo_loss)
    assert loss == pytest.approx(-3.1 / 3)
    assert metrics["clip_fraction"] == pytest.approx(2 / 3)
    assert metrics["ratio_mean"] == pytest.approx(3.1 / 3)
    assert grad == pytest.approx([-0.8 / 3, -1.1 / 3, -1.2 / 3])
    # A = -1: the same weights, gradient +ŵ / 3
    loss, _, grad = _ratios_case([0.5, 1.1, 1.5], -1.0, loss_fn=cispo_loss)
    assert loss == pytest.approx(3.1 / 3) and grad == pytest.approx([0.8 / 3, 1.1 / 3, 1.2 / 3])
    # MiniMax-M1: no lower bound (clip_low >= 1): ŵ = [0.5, 1.1, 1.2]
    loss, metrics, grad = _ratios_case([0.5, 1.1, 1.5], 1.0, loss_fn=cispo_loss, clip_low=1.0)
    assert grad == pytest.approx([-0.5 / 3, -1.1 / 3, -1.2 / 3])
    assert metrics["clip_fraction"] == pytest.approx(1 / 3)
    assert POLICY_LOSSES["cispo"] is cispo_loss


def test_cispo_on_policy_is_reinforce():
    lp = _lp([[-0.3, -1.2, -2.0], [-0.1, -0.9, -0.4]])
    adv = torch.tensor([0.5, -1.5], dtype=torch.float64)
    loss, _ = cispo_loss(lp, lp.detach(), adv, torch.ones_like(lp), normalizer=6)
    loss.backward()
    assert loss.item() == pytest.approx(-(0.5 * 3 - 1.5 * 3) / 6)
    assert lp.grad.tolist() == [[pytest.approx(-0.5 / 6)] * 3, [pytest.approx(1.5 / 6)] * 3]


def test_on_policy_shortcut_gradient_is_plain_policy_gradient():
    # old = logπ.detach(): ratio = 1, d loss / d logπ = -A / N (REINFORCE with advantages)
    lp = _lp([[-0.3, -1.2, -2.0], [-0.1, -0.9, -0.4]])
    adv = torch.tensor([0.5, -1.5], dtype=torch.float64)
    loss, metrics = clipped_pg_loss(lp, lp.detach(), adv, torch.ones_like(lp), normalizer=6)
    loss.backward()
    assert loss.item() == pytest.approx(-(0.5 * 3 - 1.5 * 3) / 6)
    assert metrics["clip_fraction"] == 0.0
    assert lp.grad.tolist() == [[pytest.approx(-0.5 / 6)] * 3, [pytest.approx(1.5 / 6)] * 3]


def test_token_normalizer_makes_clip_metrics_token_means():
    # Dr.GRPO normalizer 2 * 4 = 8 dilutes token-level metrics; token_normalizer = 4 valid tokens
    # gives ratio_mean = 1 exactly (on-policy)
    lp = _lp(AGG_LP)
    mask = torch.tensor(AGG_MASK, dtype=torch.float64)
    kw = dict(normalizer=8, aggregation="seq_mean_token_sum")
    _, diluted = clipped_pg_loss(lp, lp.detach(), torch.tensor(AGG_ADV, dtype=torch.float64), mask, **kw)
    _, exact = clipped_pg_loss(
        lp, lp.detach(), torch.tensor(AGG_ADV, dtype=torch.float64), mask, token_normalizer=4, **kw
    )
    assert diluted["ratio_mean"] == pytest.approx(0.5)
    assert exact["ratio_mean"] == pytest.approx(1.0)


# --- split invariance ------------------------------------------------------------------------


SPLIT_VARIANTS = {
    "clipped_token": dict(ratio_level="token", importance_correction="truncated", importance_cap=1.5),
    "clipped_sequence": dict(ratio_level="sequence", importance_correction="truncated", importance_cap=1.5),
    "icepop": dict(importance_correction="icepop", importance_cap=1.3, importance_min=0.8),
    "seq_mask": dict(importance_correction="seq_mask", importance_cap=1.1, importance_min=0.9),
    "cispo": dict(loss_fn=cispo_loss, importance_correction="truncated", importance_min=0.8),
    "plain_kl": dict(kl_gradient="plain", kl_estimator="k2"),
}


@pytest.mark.parametrize("aggregation", ["token", "sequence", "seq_mean_token_sum"])
@pytest.mark.parametrize("variant", list(SPLIT_VARIANTS))
def test_split_invariance(aggregation, variant):
    gen = torch.Generator().manual_seed(1)
    B, T = 8, 6
    lp_data = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    old = lp_data + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    gen_lp = old + 0.2 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    ref = lp_data + 0.2 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    normalizer = {"token": mask.sum().item(), "sequence": B, "seq_mean_token_sum": B * T}[aggregation]
    kw = dict(normalizer=normalizer, aggregation=aggregation, clip_high=0.28, kl_beta=0.05)
    kw.update(SPLIT_VARIANTS[variant])
    loss_fn = kw.pop("loss_fn", clipped_pg_loss)
    if loss_fn is clipped_pg_loss:
        kw["dual_clip"] = 3.0

    def run(rows):
        lp = lp_data[rows].clone().requires_grad_(True)
        loss, metrics = loss_fn(
            lp,
            old[rows],
            adv[rows],
            mask[rows],
            generation_logprobs=gen_lp[rows],
            reference_logprobs=ref[rows],
            **kw,
        )
        loss.backward()
        return loss.item(), metrics, lp.grad

    whole, whole_metrics, whole_grad = run(slice(0, B))
    first, m1, g1 = run(slice(0, 3))
    second, m2, g2 = run(slice(3, B))
    assert whole != 0.0
    if "is_oob_ratio" in whole_metrics:  # the bounds are tight enough to drop some tokens, not all
        assert 0.0 < whole_metrics["is_oob_ratio"] < 1.0
    assert first + second == pytest.approx(whole, rel=1e-12)
    assert torch.allclose(torch.cat([g1, g2]), whole_grad, rtol=1e-12, atol=1e-15)
    merged: dict[str, float] = {}
    accumulate_metrics(merged, m1)
    accumulate_metrics(merged, m2)
    assert merged.keys() == whole_metrics.keys()
    for key, value in whole_metrics.items():  # shares add up; probs_ratio_min / _max by min / max
        assert merged[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key


# --- argument checks -------------------------------------------------------------------------


def test_argument_errors():
    lp = torch.zeros(1, 2)
    adv = torch.ones(1)
    mask = torch.ones(1, 2)
    with pytest.raises(ValueError, match="reference_logprobs"):
        clipped_pg_loss(lp, lp, adv, mask, normalizer=2, kl_beta=0.1)
    with pytest.raises(ValueError, match="generation_logprobs"):
        clipped_pg_loss(lp, lp, adv, mask, normalizer=2, importance_correction="truncated")
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_pg_loss(lp, lp, adv, mask, normalizer=2, dual_clip=0.5)
    with pytest.raises(ValueError, match="normalizer"):
        clipped_pg_loss(lp, lp, adv, mask, normalizer=0)
    with pytest.raises(ValueError, match="Did you mean 'sequence'"):
        clipped_pg_loss(lp, lp, adv, mask, normalizer=2, ratio_level="sequense")
    with pytest.raises(ValueError, match="kl estimator"):
        kl_estimate(lp, lp, "k4")
    assert POLICY_LOSSES["clipped_pg"] is clipped_pg_loss


def test_gspo_token_with_per_token_advantages():
    # GSPO-token: per-token advantages A = [1, 3] with the value s_bt = s (e^0.2) on every token;
    # loss = -(1/2)(s * 1 + s * 3) = -2 s; grad_t = -s A_t / |y| = [-s/2, -3s/2]
    # (a plain sequence ratio without the sg trick would give the mean advantage: [-s, -s])
    s = math.exp(0.2)
    lp = _lp([[-1.0, -2.0, float("nan")]])
    old = torch.tensor([[-1.1, -2.3, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 3.0, 0.0]], dtype=torch.float64)
    loss, _ = clipped_pg_loss(
        lp,
        old,
        adv,
        mask,
        normalizer=1,
        ratio_level="sequence",
        aggregation="sequence",
        clip_low=0.4,
        clip_high=0.4,
    )
    loss.backward()
    assert loss.item() == pytest.approx(-2 * s)
    assert lp.grad[0].tolist() == [pytest.approx(-s / 2), pytest.approx(-3 * s / 2), 0.0]
