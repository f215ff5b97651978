"""Pure metrics for RL post-training: train/generation logprob agreement, entropy, pass@k, cons@k,
reward statistics. Tensor metrics return 0-dim tensors (call ``.item()`` to log them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

import torch

from posttrain.algorithms.advantages import group_statistics
from posttrain.algorithms.dapo import zero_variance_groups
from posttrain.algorithms.losses import masked_mean


def _diff(train_logprobs: torch.Tensor, gen_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    valid = mask.to(torch.bool)
    zero = torch.zeros_like(train_logprobs)
    gen = gen_logprobs.to(train_logprobs.dtype)
    return torch.where(valid, train_logprobs, zero) - torch.where(valid, gen, zero)


def token_mult_prob_error(
    train_logprobs: torch.Tensor, gen_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Mean multiplicative probability error between trainer and inference engine (NeMo RL's).

        error = (1/|valid|) sum_{valid t} exp(|log π_gen(x_t) - log π_train(x_t)|)

    1.0 means the two agree exactly on every sampled token; 1.05 means a 5 % typical gap.
    Shapes: [B, T] x3 -> scalar. No valid token -> 0.
    """
    return masked_mean(torch.exp(_diff(train_logprobs, gen_logprobs, mask).abs()), mask)


def generation_kl(
    train_logprobs: torch.Tensor, gen_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Estimate of KL(π_gen || π_train) from the tokens the inference engine sampled (x ~ π_gen).

    Schulman's k3 estimator with r = π_train(x) / π_gen(x):

        KL ≈ (1/|valid|) sum_{valid t} [ r_t - log r_t - 1 ],   log r_t = log π_train - log π_gen

    Unbiased for KL(π_gen || π_train) since E_{π_gen}[r] = 1, and >= 0 per token.
    Shapes: [B, T] x3 -> scalar. No valid token -> 0.
    """
    log_r = _diff(train_logprobs, gen_logprobs, mask)
    return masked_mean(torch.exp(log_r) - log_r - 1, mask)


def _k3(log_r: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_r) - log_r - 1


def engine_mismatch_metrics(
    train_logprobs: torch.Tensor, gen_logprobs: torch.Tensor, mask: torch.Tensor, *, normalizer: float
) -> dict[str, float]:
    """Per-token disagreement of trainer and engine on the sampled tokens, as shares of global token
    means: sum over this microbatch's valid tokens / ``normalizer`` (the global valid-token count).

    With d_t = log π_train(x_t) - log π_gen(x_t) and f(u) = exp(u) - u - 1 (Schulman's k3):

        token_mult_prob_error  exp(|d|)                      (``token_mult_prob_error``)
        gen_kl                 f(d)    KL(π_gen || π_train)   (``generation_kl``; unbiased, x ~ π_gen)
        policy_kl_error        f(-d)   NeMo RL's KL(π_train || π_gen) estimate; the tokens are drawn
                                       from π_gen, not π_train, so it is not unbiased for that KL
        js_divergence_error    ½ f(log π_train - log m) + ½ f(log π_gen - log m),
                               m = ½ π_train(x_t) + ½ π_gen(x_t)   (NeMo RL's Jensen-Shannon term)

    All four are 1, 0, 0, 0 where the two agree exactly. Shapes: [B, T] x3 -> dict of floats.
    """
    valid = mask.to(torch.bool)
    d = _diff(train_logprobs, gen_logprobs, mask)
    zero = torch.zeros_like(d)
    train = torch.where(valid, train_logprobs.to(d.dtype), zero)
    log_m = torch.logaddexp(train, train - d) - torch.log(torch.tensor(2.0, dtype=d.dtype))
    per_token = {
        "token_mult_prob_error": torch.exp(d.abs()),
        "gen_kl": _k3(d),
        "policy_kl_error": _k3(-d),
        "js_divergence_error": 0.5 * _k3(train - log_m) + 0.5 * _k3(train - d - log_m),
    }
    return {k: float(torch.where(valid, v, zero).sum() / normalizer) for k, v in per_token.items()}


def sequence_mult_prob_error(
    train_logprobs: torch.Tensor, gen_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per sequence, ``token_mult_prob_error`` over its own valid tokens (NeMo RL's seq error):

        e_b = (1/|valid_b|) sum_{valid t} exp(|log π_train(x_bt) - log π_gen(x_bt)|)

    A sequence with no valid token gets 0. Shapes: [B, T] x3 -> [B] (float64).
    """
    d = _diff(train_logprobs.double(), gen_logprobs.double(), mask)
    return masked_mean(torch.exp(d.abs()), mask, dim=-1)


def logprob_error_keep(
    train_logprobs: torch.Tensor, gen_logprobs: torch.Tensor, mask: torch.Tensor, *, threshold: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Which sequences stay in the loss under NeMo RL's ``seq_logprob_error_threshold``.

    keep_b = e_b <= threshold (``sequence_mult_prob_error``; a sequence exactly at the threshold
    stays; one with no valid token stays: it trains on nothing anyway). Returns (keep [B] bool,
    metrics): logprob_error/dropped_sequences (how many valid sequences were dropped) and
    logprob_error/seq_mult_prob_error_max (the largest e_b over sequences with a valid token).
    """
    errors = sequence_mult_prob_error(train_logprobs, gen_logprobs, mask)
    has_tokens = mask.to(torch.bool).any(-1)
    keep = (errors <= threshold) | ~has_tokens
    return keep, {
        "logprob_error/dropped_sequences": float((~keep).sum()),
        "logprob_error/seq_mult_prob_error_max": float(errors[has_tokens].max()) if has_tokens.any() else 0.0,
    }


def mismatch_and_staleness(
    old_logprobs: torch.Tensor,
    gen_logprobs: torch.Tensor,
    mask: torch.Tensor,
    versions: torch.Tensor,
    version: int,
) -> dict[str, float]:
    """The engine mismatch and the staleness of an asynchronous batch, reported apart.

    π_old (``old_logprobs``) is the trainer's policy at ``version``; row b was sampled by the engine
    with the weights of version ``versions[b]`` (-1: unknown), giving ``gen_logprobs``. Rows with
    versions[b] == version ("fresh") compare the engine with the trainer at the SAME weights: their
    ``engine_mismatch_metrics`` (token_mult_prob_error, gen_kl, policy_kl_error,
    js_divergence_error) are the engine mismatch alone. Every
    other row ("stale") compares the behaviour policy with a newer one: ``staleness_mult_prob_error``
    and ``staleness_kl`` (k3 estimate of KL(π_behav || π_old)) measure the policy's drift since,
    plus the engine mismatch (the trainer's logprobs at the behaviour version are not kept).
    ``fresh_token_fraction``: the fresh rows' share of the valid tokens. A metric whose rows hold no
    valid token is left out. Shapes: [B, T] x3, [B] -> dict of floats.
    """
    valid = mask.to(torch.bool)
    fresh_rows = (versions == version).to(valid.device)[:, None]
    fresh, stale = valid & fresh_rows, valid & ~fresh_rows
    out = {"fresh_token_fraction": float(fresh.sum()) / max(float(valid.sum()), 1.0)}
    if fresh.any():
        out.update(engine_mismatch_metrics(old_logprobs, gen_logprobs, fresh, normalizer=float(fresh.sum())))
    if stale.any():
        out["staleness_mult_prob_error"] = float(token_mult_prob_error(old_logprobs, gen_logprobs, stale))
        out["staleness_kl"] = float(generation_kl(old_logprobs, gen_logprobs, stale))
    return out


def accumulate_metrics(total: dict[str, float], new: dict[str, float], scale: float = 1.0) -> None:
    """Merge one microbatch's (or rank's, or update's) metrics into ``total``, in place.

    A key ending in ``_min`` keeps the smaller value, one ending in ``_max`` the larger (an extreme
    over the union of the parts); every other key is a share of a global mean and adds
    ``scale * value`` (scale = 1 / number of parts averages per-part means).
    """
    for key, value in new.items():
        if key.endswith("_min"):
            total[key] = min(total.get(key, value), value)
        elif key.endswith("_max"):
            total[key] = max(total.get(key, value), value)
        else:
            total[key] = total.get(key, 0.0) + scale * value


def approx_entropy(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Monte-Carlo entropy estimate from the sampled tokens: H ≈ -(1/|valid|) sum_{valid t} log π(x_t).

    Unbiased for the per-token entropy when the tokens were sampled from π (at temperature 1).
    Shapes: [B, T] x2 -> scalar.
    """
    return -masked_mean(logprobs, mask)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, Codex, arXiv:2107.03374).

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)

    The product form avoids huge binomials. If n - c < k every k-subset holds a correct sample: 1.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def majority_vote(
    answers: Sequence[Hashable | None], correct: Sequence[bool]
) -> tuple[Hashable | None, bool]:
    """Self-consistency majority vote (Wang et al. 2022, arXiv:2203.11171).

    The voted answer is the most frequent extracted answer; ``None`` (no answer extracted) never
    wins. Ties are broken by first occurrence: among the most frequent answers, the one whose
    first sample comes earliest in ``answers`` wins. The vote is correct iff the first sample
    carrying the voted answer is correct. All None (or empty) -> (None, False).
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers ({len(answers)}) and correct ({len(correct)}) differ in length")
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None, False
    best = max(counts.values())
    for answer, ok in zip(answers, correct, strict=True):
        if answer is not None and counts[answer] == best:
            return answer, bool(ok)
    raise AssertionError("unreachable")


def cons_at_k(answers: Sequence[Hashable | None], correct: Sequence[bool], k: int | None = None) -> float:
    """cons@k: 1.0 if the majority vote over the first k samples is correct, else 0.0.

    k = None uses all samples. Ties as in ``majority_vote`` (earliest first occurrence wins).
    """
    if k is not None:
        if not 1 <= k <= len(answers):
            raise ValueError(f"need 1 <= k <= {len(answers)}, got k={k}")
        answers, correct = answers[:k], correct[:k]
    return 1.0 if majority_vote(answers, correct)[1] else 0.0


def reward_statistics(rewards: torch.Tensor, group_ids: torch.Tensor | None = None) -> dict[str, float]:
    """Summary of a batch's rewards, for logging.

    mean, std (sample std, Bessel; 0 for one sample), min, max; with group_ids also
    group_std_mean (mean over samples of their group's sample std) and zero_variance_fraction
    (fraction of samples whose group has all-equal rewards: no GRPO learning signal).
    """
    r = rewards.to(torch.float64)
    if r.numel() == 0:
        return {}
    stats = {
        "mean": r.mean().item(),
        "std": r.std().item() if r.numel() > 1 else 0.0,
        "min": r.min().item(),
        "max": r.max().item(),
    }
    if group_ids is not None:
        stats["group_std_mean"] = group_statistics(r, group_ids).std.mean().item()
        stats["zero_variance_fraction"] = zero_variance_groups(r, group_ids).to(torch.float64).mean().item()
    return stats


def scored_reward_metrics(rewards: torch.Tensor, scored: torch.Tensor) -> dict[str, float]:
    """reward/mean and reward/std (Bessel; 0 for fewer than two) over the scored samples only: an
    unscored sample's reward 0 is no reward. reward/mean is 0 when nothing was scored."""
    r = rewards[scored.to(torch.bool)]
    return {
        "reward/mean": float(r.mean()) if len(r) else 0.0,
        "reward/std": float(r.std()) if len(r) > 1 else 0.0,
    }


def component_reward_metrics(
    names: list[str], matrix: torch.Tensor, scored: torch.Tensor
) -> dict[str, float]:
    """reward/<name>/mean for each named reward component, over the scored samples (0 when none)."""
    rows = matrix[scored.to(torch.bool)]
    return {
        f"reward/{name}/mean": float(rows[:, k].mean()) if len(rows) else 0.0 for k, name in enumerate(names)
    }


def importance_ratio_stats(
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float = 0.0,
    high: float = 2.0,
) -> dict[str, float]:
    """Statistics of the raw per-token importance ratio between the trainer's π_old and the policy
    that sampled the tokens (asynchronous GRPO: an older version, and another engine):

        w_t = exp(log π_old(x_t) - log π_behav(x_t))   over valid tokens t

    Returns mean, min, max, std (population) of w and out_of_bounds: the share of valid tokens with
    w < low or w > high (the correction's bounds). All 0 without a valid token. Shapes: [B, T] x3.
    """
    valid = mask.to(torch.bool)
    if not bool(valid.any()):
        return {"mean": 0.0, "min": 0.0, "max": 0.0, "std": 0.0, "out_of_bounds": 0.0}
    w = torch.exp(old_logprobs.to(torch.float64) - behaviour_logprobs.to(torch.float64))[valid]
    return {
        "mean": float(w.mean()),
        "min": float(w.min()),
        "max": float(w.max()),
        "std": float(w.std(correction=0)),
        "out_of_bounds": float(((w < low) | (w > high)).double().mean()),
    }
