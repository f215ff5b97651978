"""GAE, per-token rewards, whitening, the clipped value loss and explained variance: hand-worked
values in float64 and a plain-loop reference."""

import math

import pytest
import torch

from posttrain.algorithms.gae import gae_advantages, length_adaptive_lambda, token_rewards, whiten
from posttrain.algorithms.value_loss import (
    clipped_value_loss,
    explained_variance,
    last_token_mask,
    monte_carlo_explained_variance,
)

F64 = torch.float64


def _t(rows):
    return torch.tensor(rows, dtype=F64)


def loop_gae(rewards, values, mask, gamma, lam):
    """The textbook recursion, one sequence at a time, on its valid tokens only (lists of floats)."""
    advantages = [[0.0] * len(row) for row in rewards]
    returns = [[0.0] * len(row) for row in rewards]
    for b in range(len(rewards)):
        lam_b = lam[b] if isinstance(lam, list) else lam
        idx = [t for t in range(len(rewards[b])) if mask[b][t]]
        next_v, next_a = 0.0, 0.0
        for t in reversed(idx):
            delta = rewards[b][t] + gamma * next_v - values[b][t]
            a = delta + gamma * lam_b * next_a
            advantages[b][t], returns[b][t] = a, a + values[b][t]
            next_v, next_a = values[b][t], a
    return advantages, returns


# --- hand-worked -------------------------------------------------------------------------------
# one sequence, positions 0..4, mask [0, 1, 1, 0, 1] (position 3 an observation token)
# rewards on valid tokens r = [_, 0, 0.5, _, 1], values V = [_, 0.2, 0.4, _, 0.6]; γ = 0.9, λ = 0.5
#   t=4 (last):  δ = 1 + 0.9*0 - 0.6 = 0.4;               A = 0.4
#   t=2 (next 4): δ = 0.5 + 0.9*0.6 - 0.4 = 0.64;         A = 0.64 + 0.45*0.4 = 0.82
#   t=1 (next 2): δ = 0 + 0.9*0.4 - 0.2 = 0.16;           A = 0.16 + 0.45*0.82 = 0.529
#   returns R = A + V: [_, 0.729, 1.22, _, 1.0]
MASK = _t([[0, 1, 1, 0, 1]])
REWARDS = _t([[7.0, 0.0, 0.5, 9.0, 1.0]])  # 7 and 9 sit on masked positions: ignored
VALUES = _t([[5.0, 0.2, 0.4, 3.0, 0.6]])


def test_gae_hand_worked_with_a_masked_token():
    out = gae_advantages(REWARDS, VALUES, MASK, gamma=0.9, lam=0.5)
    assert out.advantages.tolist()[0] == pytest.approx([0, 0.529, 0.82, 0, 0.4], abs=1e-12)
    assert out.returns.tolist()[0] == pytest.approx([0, 0.729, 1.22, 0, 1.0], abs=1e-12)


def test_lambda_gamma_one_is_return_minus_value():
    out = gae_advantages(REWARDS, VALUES, MASK, gamma=1.0, lam=1.0)
    # returns-to-go over valid tokens: [1.5, 1.5, 1.0]; A = R - V
    assert out.returns.tolist()[0] == pytest.approx([0, 1.5, 1.5, 0, 1.0], abs=1e-12)
    assert out.advantages.tolist()[0] == pytest.approx([0, 1.3, 1.1, 0, 0.4], abs=1e-12)


def test_lambda_zero_is_the_td_error():
    out = gae_advantages(REWARDS, VALUES, MASK, gamma=0.9, lam=0.0)
    assert out.advantages.tolist()[0] == pytest.approx([0, 0.16, 0.64, 0, 0.4], abs=1e-12)


def _random_case(seed, b=5, t=13):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(b, t, generator=g, dtype=F64)
    values = torch.randn(b, t, generator=g, dtype=F64)
    mask = (torch.rand(b, t, generator=g) < 0.6).to(F64)
    mask[0] = 0.0  # a sequence without valid tokens
    mask[1, -1] = 1.0  # one that ends on a valid token
    return rewards, values, mask


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.99, 0.95), (0.7, 0.0), (0.5, "per_sequence")])
def test_gae_equals_the_loop_reference_on_random_masked_inputs(seed, gamma, lam):
    rewards, values, mask = _random_case(seed)
    lam_value = torch.linspace(0.0, 1.0, 5, dtype=F64) if lam == "per_sequence" else lam
    out = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam_value)
    ref_a, ref_r = loop_gae(
        rewards.tolist(), values.tolist(), mask.tolist(), gamma,
        lam_value.tolist() if lam == "per_sequence" else lam,
    )  # fmt: skip
    torch.testing.assert_close(out.advantages, _t(ref_a), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.returns, _t(ref_r), rtol=1e-12, atol=1e-12)
    assert bool((out.advantages[mask == 0] == 0).all())


@pytest.mark.parametrize("seed", range(3))
def test_inserting_masked_observation_tokens_changes_no_assistant_advantage(seed):
    rewards, values, mask = _random_case(seed)
    before = gae_advantages(rewards, values, mask, gamma=0.95, lam=0.9)
    # insert 3 masked columns (arbitrary rewards and values: an observation) at positions 4 and 9
    g = torch.Generator().manual_seed(100 + seed)
    cols = [0, 1, 2, 3, -1, -1, -1, 4, 5, 6, 7, 8, -1, -1, -1, 9, 10, 11, 12]

    def widen(x, masked_fill):
        out = torch.stack([x[:, c] if c >= 0 else masked_fill[:, i] for i, c in enumerate(cols)], dim=1)
        return out

    noise = torch.randn(5, len(cols), generator=g, dtype=F64)
    wide_mask = widen(mask, torch.zeros(5, len(cols), dtype=F64))
    after = gae_advantages(widen(rewards, noise), widen(values, -noise), wide_mask, gamma=0.95, lam=0.9)
    kept = [i for i, c in enumerate(cols) if c >= 0]
    torch.testing.assert_close(after.advantages[:, kept], before.advantages, rtol=0, atol=0)
    torch.testing.assert_close(after.returns[:, kept], before.returns, rtol=0, atol=0)


def test_gae_rejects_bad_arguments():
    with pytest.raises(ValueError, match="lam"):
        gae_advantages(REWARDS, VALUES, MASK, gamma=1.0, lam=1.5)
    with pytest.raises(ValueError, match="gamma"):
        gae_advantages(REWARDS, VALUES, MASK, gamma=1.1, lam=1.0)
    with pytest.raises(ValueError, match="shapes"):
        gae_advantages(REWARDS, VALUES[:, :3], MASK, gamma=1.0, lam=1.0)


def test_length_adaptive_lambda():
    # α = 0.05: l = 100 -> 1 - 1/5 = 0.8; l = 40 -> 1 - 1/2 = 0.5; l = 10 -> 1 - 2 < 0 -> 0
    lam = length_adaptive_lambda(torch.tensor([100, 40, 10, 0]), alpha=0.05)
    assert lam.tolist() == pytest.approx([0.8, 0.5, 0.0, 0.0], abs=1e-12)


def test_whiten_over_valid_entries():
    x = _t([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]])
    m = _t([[1, 1, 0], [1, 1, 0]])
    # valid [1, 2, 3, 4]: mean 2.5, population var 1.25
    out = whiten(x, m, eps=0.0)
    s = math.sqrt(1.25)
    torch.testing.assert_close(out, _t([[-1.5 / s, -0.5 / s, 0], [0.5 / s, 1.5 / s, 0]]), rtol=0, atol=1e-12)
    kept_mean = whiten(x, m, shift_mean=False, eps=0.0)
    torch.testing.assert_close(kept_mean, _t([[1 / s, 2 / s, 0], [3 / s, 4 / s, 0]]), rtol=0, atol=1e-12)


def test_token_rewards_land_on_each_turns_last_assistant_token():
    # sequence 0: assistant tokens 2,3 (turn 1, ends at 4) and 6,7 (turn 2, ends at 8); obs at 4,5
    # sequence 1: one turn at 1..2 that ends at 3, and an empty turn (end 3): credited at 2
    mask = _t([[0, 0, 1, 1, 0, 0, 1, 1], [0, 1, 1, 0, 0, 0, 0, 0]])
    kl = torch.full((2, 8), 0.5, dtype=F64)
    out = token_rewards(
        [[0.25, 1.0], [0.5, 2.0]], [[4, 8], [3, 3]], (2, 8), mask,
        extra=_t([-0.1, 0.0]), kl=kl, kl_beta=0.2,
    )  # fmt: skip
    assert out.tolist()[0] == pytest.approx([0, 0, -0.1, 0.15, 0, 0, -0.1, 0.8], abs=1e-12)
    assert out.tolist()[1] == pytest.approx([0, -0.1, 2.4, 0, 0, 0, 0, 0], abs=1e-12)


def test_clipped_value_loss_hand_worked():
    # ε = 0.1, V_old = [0, 0, 0], V = [0.3, -0.05, 0.5], R = [1, 1, -1], third token masked
    #   t0: unclipped (0.3-1)^2 = 0.49; clipped V = 0.1: (0.1-1)^2 = 0.81 -> 0.81 (clipped branch)
    #   t1: V within ε: both (−0.05−1)^2 = 1.1025 -> 1.1025 (not clipped)
    #   loss = 0.5 * (0.81 + 1.1025) / 2 = 0.478125; clip fraction 1/2
    values = _t([[0.3, -0.05, 0.5]]).requires_grad_(True)
    loss, metrics = clipped_value_loss(
        values, _t([[0.0, 0.0, 0.0]]), _t([[1.0, 1.0, -1.0]]), _t([[1, 1, 0]]), normalizer=2.0, clip=0.1
    )
    assert float(loss.detach()) == pytest.approx(0.478125, abs=1e-12)
    assert metrics["value_clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    # gradient only through the unclipped token: d/dV 0.5 (V - R)^2 / 2 = (V - R) / 2 = -0.525
    assert values.grad.tolist()[0] == pytest.approx([0.0, -0.525, 0.0], abs=1e-12)
    plain, plain_metrics = clipped_value_loss(
        values, _t([[0.0, 0.0, 0.0]]), _t([[1.0, 1.0, -1.0]]), _t([[1, 1, 0]]), normalizer=2.0
    )
    assert float(plain.detach()) == pytest.approx(0.5 * (0.49 + 1.1025) / 2, abs=1e-12)
    assert plain_metrics["value_clip_fraction"] == 0.0


def test_explained_variance():
    m = _t([[1, 1, 1, 1, 0]])
    r = _t([[1.0, 2.0, 3.0, 4.0, 99.0]])
    assert explained_variance(r, r, m) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(r, 2.5), r, m) == pytest.approx(0.0)
    # V = R + [0.5, -0.5, 0.5, -0.5]: Var(R - V) = 0.25, Var(R) = 1.25 -> 1 - 0.2 = 0.8
    v = r + _t([[0.5, -0.5, 0.5, -0.5, 0.0]])
    assert explained_variance(v, r, m) == pytest.approx(0.8, abs=1e-12)
    assert explained_variance(v, torch.ones_like(r), m) == 0.0  # constant returns: defined as 0


def test_monte_carlo_explained_variance_by_hand():
    # R = [1, 0, 1], V̂ = [1, .5, .5], Var(ε) = [0, 1/16, 1/16]: R − V̂ = [0, −.5, .5], Var = 1/6;
    # Var(R) = 2/9; mean Var(ε) = 1/24 -> EV* = 1 − (1/6 − 1/24) / (2/9) = 21/48
    r, v, noise = _t([1.0, 0.0, 1.0]), _t([1.0, 0.5, 0.5]), _t([0.0, 1 / 16, 1 / 16])
    assert monte_carlo_explained_variance(r, v, noise) == pytest.approx(21 / 48, abs=1e-12)
    assert monte_carlo_explained_variance(r, r, torch.zeros(3)) == pytest.approx(1.0)
    assert monte_carlo_explained_variance(torch.ones(3), v, noise) == 0.0  # constant returns
    with pytest.raises(ValueError, match="one estimate per return"):
        monte_carlo_explained_variance(r, v[:2], noise)


def test_monte_carlo_explained_variance_removes_the_estimates_noise():
    # V* ~ U(0, 1), R ~ Bernoulli(V*): Var(R − V*) = E[V*(1 − V*)] = 1/6, Var(R) = 1/4, so the best
    # critic explains EV* = 1/3. V̂ from K = 4 draws adds Var(ε) = V*(1 − V*)/4 on average 1/24: the
    # plain EV of V̂ is 1 − (1/6 + 1/24) · 4 = 1/6. N = 50 000 states: standard errors ~0.005.
    g = torch.Generator().manual_seed(0)
    n, k = 50_000, 4
    v_star = torch.rand(n, generator=g, dtype=torch.float64)
    r = torch.bernoulli(v_star, generator=g)
    draws = torch.bernoulli(v_star.unsqueeze(1).expand(n, k), generator=g)
    v_hat, noise = draws.mean(1), draws.var(1, unbiased=True) / k
    assert monte_carlo_explained_variance(r, v_hat, noise) == pytest.approx(1 / 3, abs=0.03)
    assert explained_variance(v_hat, r, torch.ones(n)) == pytest.approx(1 / 6, abs=0.03)


def test_last_token_mask():
    m = _t([[1, 1, 0, 1, 0], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    assert last_token_mask(m).tolist() == [[0, 0, 0, 1, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]]
