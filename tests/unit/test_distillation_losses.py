"""Distillation divergences over the teacher's top-k: hand-worked 3-token cases, k = V equals the exact
divergences, student = teacher gives zero loss and gradient, gradients equal autograd references of the
exact formulas, the tail bucket is a valid divergence; the sampled-token advantage."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.algorithms.distillation import (
    DISTILLATION_LOSSES,
    distillation_loss,
    log1mexp,
    on_policy_distill_advantages,
    tail_logprob_from_topk,
)

F64 = torch.float64
LOG = math.log
# teacher p = (1/2, 1/3, 1/6), student q = (1/6, 1/2, 1/3) from logits (0, log 3, log 2), L = log 6
P = (1 / 2, 1 / 3, 1 / 6)
Z = (0.0, LOG(3), LOG(2))
L = LOG(6)
EXACT = {
    # KL(p||q) = 1/2 log 3 + 1/3 log(2/3) + 1/6 log(1/2) = (1/6) log 6
    "forward_kl": LOG(6) / 6,
    # KL(q||p) = 1/6 log(1/3) + 1/2 log(3/2) + 1/3 log 2 = (1/3) log 3 - (1/6) log 2
    "reverse_kl": LOG(3) / 3 - LOG(2) / 6,
    # m = (p + q) / 2 = (1/3, 5/12, 1/4)
    "jsd": 0.5 * (0.5 * LOG(3 / 2) + LOG(4 / 5) / 3 + LOG(2 / 3) / 6)
    + 0.5 * (LOG(1 / 2) / 6 + 0.5 * LOG(6 / 5) + LOG(4 / 3) / 3),
}
EXACT["mixed_kl"] = 0.25 * EXACT["forward_kl"] + 0.75 * EXACT["reverse_kl"]
KNOBS = {"mixed_kl_weight": 0.25, "jsd_beta": 0.5}


def student_inputs(indices: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The hand case at the teacher's top-k `indices`: (student logits [1, k], L [1], teacher logprobs [1, k])."""
    z = torch.tensor([[Z[i] for i in indices]], dtype=F64)
    t = torch.tensor([[LOG(P[i]) for i in indices]], dtype=F64)
    return z, torch.tensor([L], dtype=F64), t


def loss_of(name: str, indices: list[int], mode: str, **extra) -> float:
    z, lse, t = student_inputs(indices)
    loss, per = distillation_loss(
        z, lse, t, torch.ones(1), normalizer=1.0, divergence=name, top_k_mode=mode, **KNOBS, **extra
    )
    assert float(per[0]) == pytest.approx(float(loss), abs=1e-15)
    return float(loss)


@pytest.mark.parametrize("name", sorted(DISTILLATION_LOSSES))
@pytest.mark.parametrize("mode", ["tail", "renormalized"])
def test_full_vocabulary_gives_the_exact_divergence_by_hand(name, mode):
    """k = V = 3: both modes are the exact divergences computed by hand."""
    assert loss_of(name, [0, 1, 2], mode) == pytest.approx(EXACT[name], abs=1e-12)


@pytest.mark.parametrize("name", sorted(DISTILLATION_LOSSES))
def test_tail_with_one_token_left_out_is_exact(name):
    """k = 2 of 3: the tail bucket holds exactly token 2, so the tail divergence is still exact."""
    assert loss_of(name, [0, 1], "tail") == pytest.approx(EXACT[name], abs=1e-12)


def test_tail_bucket_of_two_tokens_by_hand():
    """k = 1: buckets {0}, {1, 2}: p' = (1/2, 1/2), q' = (1/6, 5/6)."""
    assert loss_of("forward_kl", [0], "tail") == pytest.approx(0.5 * LOG(3) + 0.5 * LOG(3 / 5), abs=1e-12)
    assert loss_of("reverse_kl", [0], "tail") == pytest.approx(LOG(1 / 3) / 6 + 5 / 6 * LOG(5 / 3), abs=1e-12)
    # the exact tails (the teacher's log p_tail, the student's log-sum-exp outside the top-k) agree
    exact_tails = {
        "teacher_tail_logprob": torch.tensor([LOG(1 / 2)], dtype=F64),
        "student_tail_logsumexp": torch.tensor([LOG(3 + 2)], dtype=F64),
    }
    assert loss_of("forward_kl", [0], "tail", **exact_tails) == pytest.approx(
        0.5 * LOG(3) + 0.5 * LOG(3 / 5), abs=1e-12
    )


def test_renormalized_top2_by_hand():
    """k = 2 renormalised: p~ = (3/5, 2/5), q~ = (1/4, 3/4)."""
    assert loss_of("forward_kl", [0, 1], "renormalized") == pytest.approx(
        0.6 * LOG(12 / 5) + 0.4 * LOG(8 / 15), abs=1e-12
    )
    assert loss_of("reverse_kl", [0, 1], "renormalized") == pytest.approx(
        0.25 * LOG(5 / 12) + 0.75 * LOG(15 / 8), abs=1e-12
    )


def random_case(n: int, vocab: int, seed: int, scale: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(n, vocab, generator=g, dtype=F64), scale * torch.randn(
        n, vocab, generator=g, dtype=F64
    )


def topk_inputs(student_logits: torch.Tensor, teacher_logits: torch.Tensor, k: int, *, exact_tails: bool):
    """What the workers send: the teacher's top-k log-probs and ids, the student's logits there, its
    log-sum-exp, and (exact_tails) both tails computed over the vocabulary outside the top-k."""
    t_lp = torch.log_softmax(teacher_logits, -1)
    t_top, idx = t_lp.topk(k, dim=-1)
    s_top = student_logits.gather(1, idx)
    lse = torch.logsumexp(student_logits, -1)
    extra = {}
    if exact_tails and k < student_logits.shape[1]:
        outside = torch.ones_like(student_logits, dtype=torch.bool).scatter(1, idx, False)
        extra["student_tail_logsumexp"] = torch.logsumexp(student_logits.masked_fill(~outside, -math.inf), -1)
        extra["teacher_tail_logprob"] = torch.logsumexp(t_lp.masked_fill(~outside, -math.inf), -1)
    return s_top, lse, t_top, idx, extra


def reference(name: str, log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """The divergences written out with torch's own kl_div (KL(target || input) per element)."""

    def kl(log_a, log_b):  # KL(a || b)
        return torch.nn.functional.kl_div(log_b, log_a, reduction="none", log_target=True).sum(-1)

    if name == "forward_kl":
        return kl(log_p, log_q)
    if name == "reverse_kl":
        return kl(log_q, log_p)
    if name == "mixed_kl":
        w = KNOBS["mixed_kl_weight"]
        return w * kl(log_p, log_q) + (1 - w) * kl(log_q, log_p)
    b = KNOBS["jsd_beta"]
    log_m = torch.log(b * log_p.exp() + (1 - b) * log_q.exp())
    return b * kl(log_p, log_m) + (1 - b) * kl(log_q, log_m)


@pytest.mark.parametrize("name", sorted(DISTILLATION_LOSSES))
@pytest.mark.parametrize("mode", ["tail", "renormalized"])
def test_k_equal_vocabulary_matches_exact_value_and_gradient(name, mode):
    """k = V: the loss and its gradient w.r.t. the student's full logits (through the gathered logits
    AND the log-sum-exp) equal autograd of the exact full-vocabulary formula, float64, 1e-6."""
    vocab, n = 7, 5
    s_full, t_full = random_case(n, vocab, seed=1)
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0], dtype=F64)
    s_full.requires_grad_(True)
    s_top, lse, t_top, _, _ = topk_inputs(s_full, t_full, vocab, exact_tails=False)
    loss, _ = distillation_loss(
        s_top, lse, t_top, mask, normalizer=4.0, divergence=name, top_k_mode=mode, **KNOBS
    )
    (grad,) = torch.autograd.grad(loss, s_full)
    s_ref = s_full.detach().clone().requires_grad_(True)
    exact = reference(name, torch.log_softmax(t_full, -1), torch.log_softmax(s_ref, -1))
    expected = (exact * mask).sum() / 4.0
    (grad_ref,) = torch.autograd.grad(expected, s_ref)
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), abs=1e-6, rel=1e-6)
    torch.testing.assert_close(grad, grad_ref, atol=1e-6, rtol=1e-6)


def test_forward_kl_gradient_is_q_minus_p():
    """d KL(p || softmax(z)) / dz = softmax(z) - p, by hand, at k = V."""
    z = torch.tensor([list(Z)], dtype=F64, requires_grad=True)
    t = torch.tensor([[LOG(x) for x in P]], dtype=F64)
    loss, _ = distillation_loss(
        z, torch.logsumexp(z, -1), t, torch.ones(1), normalizer=1.0, divergence="forward_kl"
    )
    loss.backward()
    torch.testing.assert_close(
        z.grad, torch.tensor([[1 / 6 - 1 / 2, 1 / 2 - 1 / 3, 1 / 3 - 1 / 6]], dtype=F64)
    )


def bucketed_reference(name: str, s_full, t_full, idx, mode: str) -> torch.Tensor:
    """The top-k divergence built explicitly from the full softmaxes: tail mode buckets the tokens outside
    the top-k into one outcome; renormalized keeps the top-k and renormalises."""
    log_p_full, log_q_full = torch.log_softmax(t_full, -1), torch.log_softmax(s_full, -1)
    p_top, q_top = log_p_full.gather(1, idx), log_q_full.gather(1, idx)
    if mode == "renormalized":
        return reference(name, torch.log_softmax(p_top, -1), torch.log_softmax(q_top, -1))
    outside = torch.ones_like(s_full, dtype=torch.bool).scatter(1, idx, False)
    p_tail = torch.logsumexp(log_p_full.masked_fill(~outside, -math.inf), -1, keepdim=True)
    q_tail = torch.logsumexp(log_q_full.masked_fill(~outside, -math.inf), -1, keepdim=True)
    return reference(name, torch.cat([p_top, p_tail], -1), torch.cat([q_top, q_tail], -1))


@pytest.mark.parametrize("name", sorted(DISTILLATION_LOSSES))
@pytest.mark.parametrize("mode", ["tail", "renormalized"])
@pytest.mark.parametrize("exact_tails", [False, True])
def test_top_k_gradients_equal_autograd_of_the_bucketed_formula(name, mode, exact_tails):
    """k < V: value and gradient equal autograd of the divergence between the explicitly bucketed (or
    renormalised) full softmaxes, with the tails from the top-k or computed over the vocabulary."""
    vocab, n, k = 11, 6, 4
    s_full, t_full = random_case(n, vocab, seed=2)
    s_full.requires_grad_(True)
    s_top, lse, t_top, idx, extra = topk_inputs(s_full, t_full, k, exact_tails=exact_tails)
    loss, per = distillation_loss(
        s_top, lse, t_top, torch.ones(n), normalizer=n, divergence=name, top_k_mode=mode, **KNOBS, **extra
    )
    (grad,) = torch.autograd.grad(loss, s_full)
    s_ref = s_full.detach().clone().requires_grad_(True)
    expected = bucketed_reference(name, s_ref, t_full, idx, mode).mean()
    (grad_ref,) = torch.autograd.grad(expected, s_ref)
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), abs=1e-10)
    torch.testing.assert_close(grad, grad_ref, atol=1e-10, rtol=1e-8)
    assert (per >= 0).all()


@pytest.mark.parametrize("name", sorted(DISTILLATION_LOSSES))
@pytest.mark.parametrize("mode", ["tail", "renormalized"])
@pytest.mark.parametrize("exact_tails", [False, True])
def test_student_equal_to_teacher_gives_zero_loss_and_zero_gradient(name, mode, exact_tails):
    vocab, n, k = 9, 4, 3
    t_full, _ = random_case(n, vocab, seed=3)
    s_full = t_full.clone().requires_grad_(True)
    s_top, lse, t_top, _, extra = topk_inputs(s_full, t_full, k, exact_tails=exact_tails)
    loss, per = distillation_loss(
        s_top, lse, t_top, torch.ones(n), normalizer=n, divergence=name, top_k_mode=mode, **KNOBS, **extra
    )
    (grad,) = torch.autograd.grad(loss, s_full)
    assert abs(float(loss.detach())) < 1e-12 and per.abs().max() < 1e-12
    assert grad.abs().max() < 1e-12


def test_tail_bucket_is_a_valid_divergence():
    """>= 0 on random pairs, below the full divergence (data processing); 0 when the student differs from
    the teacher only inside the tail; > 0 when only the tail MASS differs, which renormalising misses."""
    vocab, n, k = 10, 64, 3
    s_full, t_full = random_case(n, vocab, seed=4)
    s_top, lse, t_top, idx, extra = topk_inputs(s_full, t_full, k, exact_tails=True)
    full = reference("forward_kl", torch.log_softmax(t_full, -1), torch.log_softmax(s_full, -1))
    for name in DISTILLATION_LOSSES:
        _, per = distillation_loss(
            s_top,
            lse,
            t_top,
            torch.ones(n),
            normalizer=n,
            divergence=name,
            top_k_mode="tail",
            **KNOBS,
            **extra,
        )
        assert (per >= 0).all() and (per > 1e-3).all(), name
        if name == "forward_kl":
            assert (per <= full + 1e-12).all()

    log_p = torch.log_softmax(t_full[:1], -1)
    _, idx1 = log_p.topk(k, dim=-1)
    outside = torch.ones_like(log_p, dtype=torch.bool).scatter(1, idx1, False)
    # same top-k probabilities and tail mass, the tail's tokens shuffled: equal buckets, different student
    perm = outside[0].nonzero().squeeze(1)
    shuffled = log_p.clone()
    shuffled[0, perm] = log_p[0, perm.flip(0)]
    assert not torch.allclose(shuffled, log_p)
    # top-k scaled by 1/2, tail mass grown to match: equal renormalised top-k, different tail mass
    halved = log_p.clone()
    top_mass = log_p.gather(1, idx1).exp().sum()
    halved[0, idx1[0]] = log_p[0, idx1[0]] + LOG(0.5)
    halved[0, perm] = log_p[0, perm] + LOG((1 - 0.5 * top_mass) / (1 - top_mass))
    assert float(torch.logsumexp(halved, -1)) == pytest.approx(0.0, abs=1e-12)
    for student, tail_zero, renorm_zero in ((shuffled, True, True), (halved, False, True)):
        s_top1, lse1, t_top1, _, extra1 = topk_inputs(student, log_p, k, exact_tails=True)
        for name in DISTILLATION_LOSSES:
            _, tail = distillation_loss(
                s_top1, lse1, t_top1, torch.ones(1), normalizer=1, divergence=name, **KNOBS, **extra1
            )
            _, renorm = distillation_loss(
                s_top1, lse1, t_top1, torch.ones(1), normalizer=1, divergence=name,
                top_k_mode="renormalized", **KNOBS,
            )  # fmt: skip
            assert (abs(float(tail)) < 1e-12) == tail_zero, name
            assert (abs(float(renorm)) < 1e-12) == renorm_zero, name


def test_exact_tails_keep_float32_gradients_right_where_one_minus_sum_rounds():
    """A near-certain student (tail 8e-11) in float32: the gradient with the tails computed over the
    vocabulary matches the float64 reference; computed as 1 - Σ top-k it is off (rounding)."""
    k = 2
    s_full = torch.tensor([[25.0, 2.0, 1.0, 0.0, 0.5, -1.0]], dtype=F64)
    t_full = torch.tensor([[3.0, 2.5, 1.0, 0.0, 0.5, -1.0]], dtype=F64)
    s_ref = s_full.clone().requires_grad_(True)
    idx = torch.log_softmax(t_full, -1).topk(k, dim=-1).indices
    expected = bucketed_reference("forward_kl", s_ref, t_full, idx, "tail").sum()
    (grad_ref,) = torch.autograd.grad(expected, s_ref)
    errors = {}
    for exact in (True, False):
        s32 = s_full.float().requires_grad_(True)
        s_top, lse, t_top, _, extra = topk_inputs(s32, t_full.float(), k, exact_tails=exact)
        loss, _ = distillation_loss(s_top, lse, t_top, torch.ones(1), normalizer=1.0, **extra)
        (grad,) = torch.autograd.grad(loss, s32)
        errors[exact] = float((grad.double() - grad_ref).abs().max() / grad_ref.abs().max())
    assert errors[True] < 1e-5
    assert errors[False] > 1e-2


def test_tail_from_topk_and_log1mexp():
    x = torch.tensor([-1e-20, -1e-10, -0.1, -0.7, -5.0, -50.0], dtype=F64, requires_grad=True)
    y = log1mexp(x)
    # log(1 - e^-d) = log(d - d^2/2 + ...) = log d - d/2 + ...; naive log(1 - exp(x)) gives -inf at 1e-20
    expected = [LOG(1e-20), LOG(1e-10) - 5e-11, LOG(-math.expm1(-0.1)), LOG(-math.expm1(-0.7))]
    torch.testing.assert_close(y[:4], torch.tensor(expected, dtype=F64), rtol=1e-12, atol=0)
    assert float(y[4].detach()) == pytest.approx(math.log1p(-math.exp(-5.0)), rel=1e-12)
    y.sum().backward()
    assert torch.isfinite(x.grad).all()
    # a top-k holding all the mass: the tail is floored at eps, finite, without gradient
    lp = torch.log_softmax(torch.tensor([[1.0, 2.0, 3.0]], dtype=F64), -1).requires_grad_(True)
    tail = tail_logprob_from_topk(lp)
    assert float(tail.detach()) == pytest.approx(LOG(torch.finfo(F64).eps), rel=1e-6)
    tail.sum().backward()
    assert (lp.grad == 0).all()
    assert float(tail_logprob_from_topk(torch.tensor([[LOG(0.5), LOG(0.25)]], dtype=F64))) == pytest.approx(
        LOG(0.25), abs=1e-15
    )


def test_jsd_limits_and_bad_hyper_parameters():
    """JSD_β / β -> KL(p || q) as β -> 0 and JSD_β / (1 - β) -> KL(q || p) as β -> 1."""
    z, lse, t = student_inputs([0, 1, 2])
    one = torch.ones(1)
    small, _ = distillation_loss(z, lse, t, one, normalizer=1.0, divergence="jsd", jsd_beta=1e-6)
    large, _ = distillation_loss(z, lse, t, one, normalizer=1.0, divergence="jsd", jsd_beta=1 - 1e-6)
    assert float(small) / 1e-6 == pytest.approx(EXACT["forward_kl"], rel=1e-4)
    assert float(large) / 1e-6 == pytest.approx(EXACT["reverse_kl"], rel=1e-4)
    with pytest.raises(ValueError, match="jsd_beta must be in"):
        distillation_loss(z, lse, t, one, normalizer=1.0, divergence="jsd", jsd_beta=1.0)
    with pytest.raises(ValueError, match="mixed_kl_weight must be in"):
        distillation_loss(z, lse, t, one, normalizer=1.0, divergence="mixed_kl", mixed_kl_weight=1.5)
    with pytest.raises(ValueError, match="Did you mean 'reverse_kl'"):
        distillation_loss(z, lse, t, one, normalizer=1.0, divergence="reverse_k")
    with pytest.raises(ValueError, match="unknown top_k_mode"):
        distillation_loss(z, lse, t, one, normalizer=1.0, top_k_mode="bucket")


def test_global_normaliser_and_mask():
    """The loss is Σ mask · D / normalizer: two half batches with the global count sum to the whole."""
    s_full, t_full = random_case(6, 8, seed=5)
    s_top, lse, t_top, _, _ = topk_inputs(s_full, t_full, 3, exact_tails=False)
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0], dtype=F64)
    whole, per = distillation_loss(s_top, lse, t_top, mask, normalizer=4.0)
    halves = [
        distillation_loss(s_top[i:j], lse[i:j], t_top[i:j], mask[i:j], normalizer=4.0)[0]
        for i, j in ((0, 3), (3, 6))
    ]
    assert float(sum(halves)) == pytest.approx(float(whole), abs=1e-15)
    assert float(whole) == pytest.approx(float(per[mask.bool()].sum() / 4.0), abs=1e-15)
    assert per[1] == 0 and per[5] == 0


def test_on_policy_distill_advantages_by_hand():
    teacher = torch.tensor([[0.0, -0.5, -1.0, -2.0]], dtype=F64, requires_grad=True)
    student = torch.tensor([[0.0, -1.5, -0.5, -3.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    adv = on_policy_distill_advantages(teacher, student, mask)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 1.0, -0.5, 0.0]], dtype=F64))
    assert not adv.requires_grad  # a stop-gradient signal
    mixed = on_policy_distill_advantages(
        teacher, student, mask, advantages=torch.tensor([2.0]), coefficient=0.5
    )
    torch.testing.assert_close(mixed, torch.tensor([[0.0, 2.5, 1.75, 0.0]], dtype=F64))
