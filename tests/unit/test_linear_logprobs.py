"""The fused lm_head + log-softmax (`LinearLogprobs`, and `RecomputedLinearLogprobs`, which keeps no
logits for backward) against plain autograd of the full logits."""

import math

import pytest
import torch

from posttrain.models.logprobs import (
    LogitsTransform,
    chunked_logprobs,
    chunked_logprobs_and_entropy,
    gather_logprobs,
)


def _reference(hidden, weight, targets):
    return gather_logprobs(hidden @ weight.T, targets)


@pytest.mark.parametrize("chunk_size", [3, 7, 64])
def test_values_and_gradients_match_autograd(chunk_size):
    gen = torch.Generator().manual_seed(0)
    n, h, v = 13, 8, 50
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64)
    head = torch.nn.Linear(h, v, bias=False).double()
    targets = torch.randint(0, v, (n,), generator=gen)
    targets[:4] = 5  # repeated targets: their weight-gradient rows add up
    upstream = torch.randn(n, generator=gen, dtype=torch.float64)

    h1 = hidden.clone().requires_grad_()
    lp = chunked_logprobs(h1, targets, head, chunk_size)
    (lp * upstream).sum().backward()
    grads = h1.grad, head.weight.grad.clone()

    head.weight.grad = None
    h2 = hidden.clone().requires_grad_()
    ref = _reference(h2, head.weight, targets)
    (ref * upstream).sum().backward()

    torch.testing.assert_close(lp, ref)
    torch.testing.assert_close(grads[0], h2.grad)
    torch.testing.assert_close(grads[1], head.weight.grad)


def test_no_grad_path_and_retained_graph():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, 4, generator=gen)
    head = torch.nn.Linear(4, 11, bias=False)
    targets = torch.randint(0, 11, (9,), generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(
            chunked_logprobs(hidden, targets, head, 4), _reference(hidden, head.weight, targets)
        )
    lp = chunked_logprobs(hidden, targets, head, 4)
    lp.sum().backward(retain_graph=True)
    first = head.weight.grad.clone()
    lp.sum().backward()  # the saved softmax is not modified by backward
    torch.testing.assert_close(head.weight.grad, 2 * first)


def test_biased_head_takes_the_generic_path():
    head = torch.nn.Linear(4, 11, bias=True)
    hidden = torch.randn(5, 4, requires_grad=True)
    targets = torch.tensor([0, 3, 10, 3, 1])
    lp = chunked_logprobs(hidden, targets, head, 2)
    torch.testing.assert_close(lp, gather_logprobs(head(hidden), targets))
    lp.sum().backward()
    assert head.bias.grad is not None


# ----------------------------------------------------------------------------- recomputed in backward
# `RecomputedLinearLogprobs` (posttrain.models.fused_head) against full logits, log_softmax and
# gather, differentiated by autograd. Exact math, so float64; N = 13 rows so that most chunk sizes
# do not divide it.

N, H, V = 13, 8, 50
TRANSFORMS = {
    "plain": (LogitsTransform(), 1.0, False),
    "temperature": (LogitsTransform(), 0.7, False),
    "multiplier": (LogitsTransform(multiplier=2.5), 0.7, False),
    "softcap": (LogitsTransform(multiplier=0.5, softcap=3.0), 0.7, False),
    "bias": (LogitsTransform(), 0.7, True),
    "bias_softcap": (LogitsTransform(softcap=3.0), 1.0, True),
}


def _case(seed: int, dtype: torch.dtype, bias: bool = False):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen, dtype=dtype)
    head = torch.nn.Linear(H, V, bias=bias).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=gen, dtype=dtype))
        if bias:
            head.bias.copy_(torch.randn(V, generator=gen, dtype=dtype))
    targets = torch.randint(0, V, (N,), generator=gen)
    targets[:4] = 5  # repeated targets: their weight-gradient rows add up
    mask = torch.ones(N, dtype=dtype)
    mask[[2, 7, 12]] = 0  # ignored positions (masked out of the loss)
    upstream = (torch.randn(2, N, generator=gen, dtype=dtype) * mask).unbind()
    return hidden, head, targets, upstream


def _full_reference(hidden, head, targets, transform, temperature):
    """(lp, entropy) from the whole [N, V] logits, differentiated by autograd."""
    logp = torch.log_softmax(transform.apply(head(hidden)) / temperature, dim=-1)
    return logp.gather(1, targets.unsqueeze(1)).squeeze(1), -(logp.exp() * logp).sum(dim=-1)


def _grads(head, hidden, outputs, upstream):
    """d(Σ_k upstream_k · outputs_k) / d(hidden, weight, bias); an output paired with None is unused."""
    head.zero_grad(set_to_none=True)
    loss = sum((out * up).sum() for out, up in zip(outputs, upstream, strict=True) if up is not None)
    loss.backward()
    bias = None if head.bias is None else head.bias.grad.clone()
    return hidden.grad, head.weight.grad.clone(), bias


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 13, 64])
@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_recomputed_logprob_gradients_equal_full_logits(chunk_size, name):
    transform, temperature, bias = TRANSFORMS[name]
    hidden, head, targets, (g, _) = _case(2, torch.float64, bias)
    h1 = hidden.clone().requires_grad_()
    kw = dict(transform=transform, temperature=temperature)
    lp = chunked_logprobs(h1, targets, head, chunk_size, recompute=True, **kw)
    got = _grads(head, h1, [lp], [g])
    h2 = hidden.clone().requires_grad_()
    ref_lp, _ = _full_reference(h2, head, targets, transform, temperature)
    want = _grads(head, h2, [ref_lp], [g])
    torch.testing.assert_close(lp, ref_lp, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert got[0][[2, 7, 12]].abs().max() == 0  # ignored rows get no gradient


@pytest.mark.parametrize("uses", ["both", "entropy_only", "logprob_only"])
@pytest.mark.parametrize("chunk_size", [1, 5, 64])
@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_recomputed_entropy_and_its_gradient_equal_full_logits(uses, chunk_size, name):
    transform, temperature, bias = TRANSFORMS[name]
    hidden, head, targets, (g, e) = _case(3, torch.float64, bias)
    upstream = [None if uses == "entropy_only" else g, None if uses == "logprob_only" else e]
    h1 = hidden.clone().requires_grad_()
    kw = dict(transform=transform, temperature=temperature)
    outputs = chunked_logprobs_and_entropy(h1, targets, head, chunk_size, **kw)
    got = _grads(head, h1, outputs, upstream)
    h2 = hidden.clone().requires_grad_()
    ref = _full_reference(h2, head, targets, transform, temperature)
    want = _grads(head, h2, ref, upstream)
    for a, b in zip((*outputs, *got), (*ref, *want), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # the no-grad path gives the same values
        for a, b in zip(
            chunked_logprobs_and_entropy(hidden, targets, head, chunk_size, **kw), ref, strict=True
        ):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_entropy_hand_worked():
    """Two logits [0, log 3]: p = (1/4, 3/4), H = -(1/4 log 1/4 + 3/4 log 3/4) = log 4 - (3/4) log 3."""
    head = torch.nn.Linear(1, 2, bias=False).double()
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[0.0], [math.log(3.0)]], dtype=torch.float64))
    hidden = torch.ones(1, 1, dtype=torch.float64, requires_grad=True)
    lp, ent = chunked_logprobs_and_entropy(hidden, torch.tensor([1]), head, 4)
    assert float(lp.detach()) == pytest.approx(math.log(0.75), abs=1e-15)
    assert float(ent.detach()) == pytest.approx(math.log(4.0) - 0.75 * math.log(3.0), abs=1e-15)


def _saved_numel(fn) -> int:
    """Total elements of the tensors autograd saves for backward while `fn()` builds its graph."""
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(sizes)


@pytest.mark.parametrize("with_entropy", [False, True])
def test_nothing_of_size_tokens_times_vocabulary_is_kept_for_backward(with_entropy):
    """The default path on more rows than one chunk saves hidden [N, H], weight [V, H], targets and
    per-row scalars: N·H + V·H + 3N elements, where keeping the softmax adds N·V."""
    n, h, v = 64, 4, 1000
    hidden = torch.randn(n, h, requires_grad=True)
    head = torch.nn.Linear(h, v, bias=False)
    targets = torch.randint(0, v, (n,))
    fn = chunked_logprobs_and_entropy if with_entropy else chunked_logprobs
    saved = _saved_numel(lambda: fn(hidden, targets, head, 8))
    assert saved <= n * h + v * h + 3 * n
    stored = _saved_numel(lambda: chunked_logprobs(hidden, targets, head, 8, recompute=False))
    assert stored >= n * v  # what the kept softmax costs (the comparison the bound makes)


def _fp32_bound(hidden, weight, g, targets) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise bounds on the fp32 rounding error of d hidden and d weight of Σ g·lp, from float64
    copies. Logits z = h·w over H terms are off by at most γ_H |h|·|w| (γ_k = k·eps/(1 - k·eps)), so p
    by p·2γ_H·m_i (m_i = max_j |h_i|·|w_j|, the shift of lse included), so the logit gradient G by
    |g_i| p_ij 2γ_H m_i plus its own few roundings (4 eps |G|); the matmuls over V (or N) terms add
    γ_V |G|·|W| (γ_N |G|ᵀ·|h|). The bound doubles the sum."""
    eps = torch.finfo(torch.float32).eps
    gamma = lambda k: k * eps / (1 - k * eps)  # noqa: E731
    n, size = hidden.shape
    logp = torch.log_softmax(hidden @ weight.T, dim=-1)
    p = logp.exp()
    grad_z = -g[:, None] * p
    grad_z[torch.arange(n), targets] += g
    m = (hidden.abs() @ weight.abs().T).amax(dim=1, keepdim=True)
    delta = 2 * gamma(size) * m * g.abs()[:, None] * p + 4 * eps * grad_z.abs()
    bound_h = delta @ weight.abs() + gamma(weight.shape[0]) * grad_z.abs() @ weight.abs()
    bound_w = delta.T @ hidden.abs() + gamma(n) * grad_z.abs().T @ hidden.abs()
    return 2 * bound_h, 2 * bound_w


@pytest.mark.parametrize("chunk_size", [4, 13])
def test_recomputed_fp32_gradients_within_fp32_rounding(chunk_size):
    hidden, head, targets, (g, _) = _case(4, torch.float64)
    head32 = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head32.weight.copy_(head.weight)
    h32 = hidden.float().requires_grad_()
    lp = chunked_logprobs(h32, targets, head32, chunk_size, recompute=True)
    got_h, got_w, _ = _grads(head32, h32, [lp], [g.float()])
    h64 = hidden.clone().requires_grad_()
    want_h, want_w, _ = _grads(
        head, h64, [_full_reference(h64, head, targets, LogitsTransform(), 1.0)[0]], [g]
    )
    bound_h, bound_w = _fp32_bound(hidden, head.weight.detach(), g, targets)
    assert ((got_h.double() - want_h).abs() <= bound_h).all()
    assert ((got_w.double() - want_w).abs() <= bound_w).all()
    assert float(bound_w.max()) < 1e-4 * float(want_w.abs().max())  # the bound is tight enough to fail


def test_recompute_and_kept_softmax_agree_under_bf16_autocast():
    """Under autocast both fused paths run the projection's matmuls in bf16 (forward and backward):
    the same logits, so the same log-probabilities; their gradients differ only by where the logit
    gradient is rounded to bf16 (eps 2^-8, twice, at the size of |G|·|W|)."""
    hidden, head, targets, (g, _) = _case(5, torch.float32)
    results = []
    for recompute in (False, True):
        h = hidden.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp = chunked_logprobs(h, targets, head, 4, recompute=recompute)
        results.append((lp, *_grads(head, h, [lp], [g])))
    (lp0, h0, w0, _), (lp1, h1, w1, _) = results
    torch.testing.assert_close(lp0, lp1, rtol=0, atol=0)
    eps = 2.0**-8
    p = torch.softmax(hidden @ head.weight.detach().T, dim=-1)
    grad_z = (g.abs()[:, None] * (p + torch.nn.functional.one_hot(targets, V))).detach()
    w = head.weight.detach().abs()
    assert ((h0 - h1).abs() <= 4 * eps * (grad_z @ w) + 1e-6).all()
    assert ((w0 - w1).abs() <= 4 * eps * (grad_z.T @ hidden.abs()) + 1e-6).all()


def test_backward_holds_one_chunk_of_logit_gradients_at_a_time(monkeypatch):
    """Each chunk's [chunk, V] logit gradient is released before the next chunk's is made, so
    backward's peak is one chunk's whatever the number of rows."""
    import weakref

    from posttrain.models import fused_head

    made, alive_at_call = [], []
    original = fused_head._logits_grad_chunk

    def tracked(*args):
        alive_at_call.append(sum(ref() is not None for ref in made))
        grad = original(*args)
        made.append(weakref.ref(grad))
        return grad

    monkeypatch.setattr(fused_head, "_logits_grad_chunk", tracked)
    hidden = torch.randn(40, 4, requires_grad=True)
    head = torch.nn.Linear(4, 30, bias=False)
    chunked_logprobs(hidden, torch.randint(0, 30, (40,)), head, 8).sum().backward()
    assert alive_at_call == [0] * 5


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [8, 64])
def test_training_and_scoring_paths_give_bitwise_equal_logprobs(temperature, chunk_size):
    """With and without gradients, recomputing or keeping the softmax, the forward runs the same
    operations: an exactly on-policy ratio π_θ / π_old is exactly 1 before the first update."""
    gen = torch.Generator().manual_seed(6)
    hidden = torch.randn(37, 16, generator=gen)
    head = torch.nn.Linear(16, 300, bias=False)
    targets = torch.randint(0, 300, (37,), generator=gen)
    with torch.no_grad():
        scored = chunked_logprobs(hidden, targets, head, chunk_size, temperature=temperature)
    for recompute in (None, True, False):
        h = hidden.clone().requires_grad_()
        trained = chunked_logprobs(h, targets, head, chunk_size, temperature=temperature, recompute=recompute)
        assert torch.equal(trained, scored)
