"""The vocabulary projection fused with log-softmax (and entropy), its logits recomputed in backward.

For a linear head (weight W [V, H], optional bias b) and N hidden states h [N, H], the logits are
y = softcap(h @ W.T + b) / T (softcap(z) = c * tanh(z / c), or none), and per row

    lp_i  = y[i, t_i] - lse_i,       lse_i = log Σ_j exp(y_ij)          (log-probability of target t_i)
    ent_i = -Σ_j p_ij log p_ij,      p_ij  = exp(y_ij - lse_i)          (entropy of the distribution)

`RecomputedLinearLogprobs` computes them `chunk_size` rows at a time and keeps for backward only h, W,
b, the targets and the per-row scalars lse (and ent): [N] numbers where a kept softmax is [N, V].
Backward projects each chunk again and turns it into the gradient on the logits,

    dL/dy_ij = g_i (1[j = t_i] - p_ij) - e_i p_ij (log p_ij + ent_i)     (g, e: upstream of lp, ent)
    dL/dz_ij = dL/dy_ij * (1 - (y_ij T / c)^2) / T                       (soft-cap and temperature)

and then d h = dL/dz @ W, d W = Σ_chunks dL/dz.T @ h, d b = Σ_rows dL/dz. So at most one chunk's
[chunk, V] logits exist at a time (two with entropy or a soft-cap), in forward and in backward,
whatever N is: the memory of Liger's fused linear cross-entropy and of Cut Cross-Entropy, for the
price of the projection's matmul once more in backward.

`LinearLogprobs` is the earlier fused function, which keeps every chunk's softmax [N, V] for
backward instead (no recompute: faster, [N, V] fp32 of memory); `chunked_logprobs` uses it when the
rows fit in one chunk, where it costs no more memory than recomputing, and `benchmarks/head_memory.py`
compares the two.
"""

from __future__ import annotations

from typing import Any

import torch


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """x in fp32 when it is a narrower float (bf16, fp16); fp32 and fp64 stay as they are (no copy)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _linear_logprobs_chunk(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, keep_probs: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(hidden @ weight.T)[target] in fp32 ([n]) and, if `keep_probs`, the softmax [n, V].

    One [n, V] buffer: the logits, turned in place into exp(logits - max) and then probabilities.
    lp = logit[target] - (max + log sum exp(logits - max)), the same sum as torch.logsumexp.
    """
    logits = at_least_fp32(hidden @ weight.T)
    target_logits = logits.gather(1, targets.unsqueeze(1)).squeeze(1)
    row_max = logits.amax(dim=1, keepdim=True)
    exp = logits.sub_(row_max).exp_()
    row_sum = exp.sum(dim=1, keepdim=True)
    lp = target_logits - (row_max + row_sum.log()).squeeze(1)
    return lp, exp.div_(row_sum) if keep_probs else None


class LinearLogprobs(torch.autograd.Function):
    """lp[i] = log softmax(hidden @ weight.T)[i, targets[i]] with a lean backward.

    Shapes: hidden [N, H], weight [V, H] (a bias-free lm_head), targets [N] -> lp [N] in fp32.
    Forward keeps only the softmax P [N, V] (as autograd would keep the logits). With upstream
    gradient g [N], d lp_i / d logits_ij = 1[j = t_i] - P_ij, so

        d hidden = -g * (P @ W) + g * W[t]           (row-wise scaling, a row gather)
        d weight = P.T @ (-g * hidden) + scatter_add(t, g * hidden)

    i.e. two matmuls and no elementwise pass over the [N, V] matrix. P is not modified, so a
    second backward (retain_graph) is correct too. Chunks of `chunk_size` rows bound the size
    of one matmul and its temporary; all chunks' P are kept for backward.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size):  # type: ignore[override]
        # under autocast (bf16 compute over fp32 weights) the forward matmul runs in the autocast dtype;
        # backward, which autocast does not cover, runs its two matmuls in that dtype too
        device_type = hidden.device.type
        ctx.compute_dtype = (
            torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        )
        lps, probs = [], []
        for start in range(0, hidden.shape[0], chunk_size):
            stop = start + chunk_size
            lp, p = _linear_logprobs_chunk(hidden[start:stop], weight, targets[start:stop], keep_probs=True)
            lps.append(lp)
            probs.append(p)
        ctx.chunk_size = chunk_size
        ctx.save_for_backward(hidden, weight, targets, *probs)
        return torch.cat(lps) if len(lps) > 1 else lps[0]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_lp):  # type: ignore[override]
        hidden, weight, targets, *probs = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        g = grad_lp.to(hidden.dtype).unsqueeze(1)  # [N, 1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = None
        compute = ctx.compute_dtype
        if compute is not None and compute != weight.dtype:  # autocast: the matmuls in its dtype
            w_c = weight.to(compute)
            for i, p in enumerate(probs):
                rows = slice(i * ctx.chunk_size, (i + 1) * ctx.chunk_size)
                p = p.to(compute)
                g_c, t_c = g[rows], targets[rows]
                if need_hidden:
                    grad_hidden[rows] = (p @ w_c).to(hidden.dtype)
                    grad_hidden[rows].mul_(-g_c).addcmul_(g_c, w_c[t_c].to(hidden.dtype))
                if need_weight:
                    h_g = hidden[rows] * g_c
                    part = (p.T @ h_g.neg().to(compute)).to(weight.dtype)
                    grad_weight = part if grad_weight is None else grad_weight.add_(part)
                    grad_weight.index_add_(0, t_c, h_g.to(weight.dtype))
            return grad_hidden, grad_weight, None, None
        for i, p in enumerate(probs):
            rows = slice(i * ctx.chunk_size, (i + 1) * ctx.chunk_size)
            p = p.to(weight.dtype)  # no copy when already fp32
            g_c, t_c = g[rows], targets[rows]
            if need_hidden:
                torch.mm(p, weight, out=grad_hidden[rows])
                grad_hidden[rows].mul_(-g_c).addcmul_(g_c, weight[t_c])
            if need_weight:
                h_g = hidden[rows] * g_c
                if grad_weight is None:
                    grad_weight = p.T @ h_g.neg()
                else:
                    grad_weight.addmm_(p.T, h_g, alpha=-1)
                grad_weight.index_add_(0, t_c, h_g)
        return grad_hidden, grad_weight, None, None


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the softmax is computed in: fp64 stays fp64, everything else becomes fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class _Head:
    """The projection h -> y = softcap(h @ W.T + b) / T of one call, with W and b cast once to the
    autocast dtype when the call runs under autocast (the matmuls then run in that dtype, forward and
    backward alike, so backward recomputes exactly the logits forward normalised)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        compute: torch.dtype | None,
        softcap: float | None,
        temperature: float,
    ) -> None:
        self.compute = compute
        self.weight = weight if compute is None else weight.to(compute)
        self.bias = bias if bias is None or compute is None else bias.to(compute)
        self.softcap, self.temperature = softcap, temperature

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[c, H] -> [c, V] logits y in fp32 (fp64 for fp64 inputs), a fresh buffer."""
        h = hidden if self.compute is None else hidden.to(self.compute)
        z = h @ self.weight.T if self.bias is None else torch.addmm(self.bias, h, self.weight.T)
        y = z if z.dtype == _float_dtype(z.dtype) else z.to(_float_dtype(z.dtype))
        if self.softcap is not None:  # in place: z is a fresh matmul output
            y = y.div_(self.softcap).tanh_().mul_(self.softcap)
        return y.div_(self.temperature) if self.temperature != 1.0 else y

    def logits_derivative(self, y: torch.Tensor) -> torch.Tensor | None:
        """dy/dz without the 1/T factor, elementwise [c, V]: 1 - tanh(z / c)^2 = 1 - (y T / c)^2 with a
        soft-cap; None (1) without."""
        if self.softcap is None:
            return None
        return (y * (self.temperature / self.softcap)).square_().neg_().add_(1.0)


def _forward_chunk(
    head: _Head, hidden: torch.Tensor, targets: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(lp, lse, ent) of one chunk, [c] each (ent None unless `with_entropy`); the [c, V] logits are
    overwritten in place (one buffer; a second for the exponentials when the entropy is asked for).
    With u = y - max: lse = max + log S, S = Σ exp(u); ent = lse - Σ p y = log S - Σ exp(u) u / S."""
    y = head.logits(hidden)
    target = y.gather(1, targets.unsqueeze(1)).squeeze(1)
    row_max = y.amax(dim=1, keepdim=True)
    u = y.sub_(row_max)
    if with_entropy:
        exp = u.exp()
        total = exp.sum(dim=1)
        ent = total.log() - u.mul_(exp).sum(dim=1) / total
    else:
        total, ent = u.exp_().sum(dim=1), None
    lse = row_max.squeeze(1) + total.log()
    return target - lse, lse, ent


def _logits_grad_chunk(
    head: _Head,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    ent: torch.Tensor | None,
    g: torch.Tensor | None,
    e: torch.Tensor | None,
) -> torch.Tensor:
    """dL/dz [c, V] for one chunk (the formula in the module docstring, before the 1/T factor), from
    the recomputed logits; `g`, `e`: the upstream gradients of lp and ent ([c] or None for zero)."""
    y = head.logits(hidden)
    derivative = head.logits_derivative(y)
    logp = y.sub_(lse.unsqueeze(1))
    if e is None:
        grad = logp.exp_().mul_(-g.unsqueeze(1))
    else:
        p = logp.exp()
        coeff = logp.add_(ent.unsqueeze(1)).mul_(e.unsqueeze(1))
        if g is not None:
            coeff.add_(g.unsqueeze(1))
        grad = coeff.mul_(p).neg_()
        del p
    if g is not None:
        grad.scatter_add_(1, targets.unsqueeze(1), g.unsqueeze(1))
    return grad if derivative is None else grad.mul_(derivative)


class RecomputedLinearLogprobs(torch.autograd.Function):
    """(lp [N], ent [N]) of softcap(hidden @ weight.T + bias) / T at `targets` (module docstring);
    saves hidden, weight, bias, targets and the [N] log-sum-exp (and entropy) for backward, never the
    logits. ent is an empty tensor unless `with_entropy`. Shapes: hidden [N, H], weight [V, H], bias
    [V] or None, targets [N] (int64); outputs fp32 (fp64 for fp64 inputs)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        chunk_size: int,
        softcap: float | None,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        device_type = hidden.device.type
        compute = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        with torch.autocast(device_type, enabled=False):
            lp, lse, ent = head_forward(
                hidden, weight, bias, targets, chunk_size, softcap, temperature, with_entropy, compute
            )
        ctx.set_materialize_grads(False)
        if ent is None:
            ent_out = lp.new_zeros(0)
            ctx.mark_non_differentiable(ent_out)
        ctx.args = (chunk_size, softcap, temperature, compute)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent)
        return lp, ent if ent is not None else ent_out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_lp: torch.Tensor | None, grad_ent: torch.Tensor | None) -> tuple:  # type: ignore[override]
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        chunk_size, softcap, temperature, compute = ctx.args
        if ent is None:
            grad_ent = None
        grads = head_backward(
            _Head(weight, bias, compute, softcap, temperature),
            (hidden, weight, bias, targets, lse, ent),
            grad_lp,
            grad_ent,
            chunk_size,
            ctx.needs_input_grad[:3],
        )
        return (*grads, None, None, None, None, None)


def head_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    chunk_size: int,
    softcap: float | None,
    temperature: float,
    with_entropy: bool,
    compute: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(lp, lse, ent) over all N rows, `chunk_size` rows at a time, no autograd graph kept; matmuls in
    `compute` (an autocast dtype) when given, else in the inputs' dtype."""
    head = _Head(weight, bias, compute, softcap, temperature)
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=_float_dtype(hidden.dtype))
        return empty, empty, empty if with_entropy else None
    parts = [
        _forward_chunk(head, hidden[i : i + chunk_size], targets[i : i + chunk_size], with_entropy)
        for i in range(0, hidden.shape[0], chunk_size)
    ]
    lp, lse, ent = zip(*parts, strict=True)
    return torch.cat(lp), torch.cat(lse), torch.cat(ent) if with_entropy else None


def head_backward(
    head: _Head,
    saved: tuple[torch.Tensor, ...],
    grad_lp: torch.Tensor | None,
    grad_ent: torch.Tensor | None,
    chunk_size: int,
    needs: tuple[bool, ...],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(d hidden, d weight, d bias), each None where `needs` says it is not wanted or no upstream
    gradient arrived; d weight and d bias accumulate over chunks in the parameters' dtype."""
    hidden, weight, bias, targets, lse, ent = saved
    if grad_lp is None and grad_ent is None:
        return None, None, None
    grad_h = torch.empty_like(hidden) if needs[0] else None
    grad_w = torch.zeros_like(weight) if needs[1] else None
    grad_b = torch.zeros_like(bias) if bias is not None and needs[2] else None
    inv_t = 1.0 / head.temperature
    for i in range(0, hidden.shape[0], chunk_size):
        rows = slice(i, i + chunk_size)
        g = None if grad_lp is None else grad_lp[rows].to(lse.dtype)
        e = None if grad_ent is None else grad_ent[rows].to(lse.dtype)
        ent_c = None if ent is None else ent[rows]
        grad_z = _logits_grad_chunk(head, hidden[rows], targets[rows], lse[rows], ent_c, g, e)
        if grad_b is not None:
            grad_b.add_(grad_z.sum(dim=0).to(grad_b.dtype), alpha=inv_t)
        grad_z = grad_z.to(head.weight.dtype)  # the matmul dtype; no copy when it is already
        if grad_h is not None:
            grad_h[rows] = (grad_z @ head.weight).mul_(inv_t).to(hidden.dtype)
        if grad_w is not None:
            h = hidden[rows].to(head.weight.dtype)
            if grad_w.dtype == h.dtype:
                grad_w.addmm_(grad_z.T, h, alpha=inv_t)
            else:  # autocast: the matmul in its dtype, the sum in the weight's
                grad_w.add_((grad_z.T @ h).to(grad_w.dtype), alpha=inv_t)
        del grad_z  # before the next chunk's is made: one [chunk, V] buffer at a time
    return grad_h, grad_w, grad_b
