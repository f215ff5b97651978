"""The fused lm_head + log-softmax (`LinearLogprobs`) against plain autograd."""

import pytest
import torch

from posttrain.models.logprobs import chunked_logprobs, gather_logprobs


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
