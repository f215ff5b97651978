"""Batch phases that more than one RL algorithm uses: reward shaping, the KL reward, the loss
normalisers, the logprob-error filter and the policy's clipped-surrogate updates. Plain functions
of a config (read duck-typed: only the sections a function names) and tensors."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

from posttrain.algorithms.advantages import scale_rewards
from posttrain.algorithms.dapo import overlong_reward_shaping
from posttrain.algorithms.kl import kl_estimate
from posttrain.algorithms.metrics import accumulate_metrics, logprob_error_keep
from posttrain.algorithms.reward_shaping import stop_properly_penalty
from posttrain.algorithms.rl_loss import grpo_loss, loss_knobs, positive_tokens
from posttrain.config.rollout import run_episode_token_budget
from posttrain.distributed.policy_group import PolicyGroup
from posttrain.models.policy import TrainResult
from posttrain.rollout.rollout import RLBatch, Rollouts


def shaped_rewards(cfg: Any, rollouts: Rollouts) -> torch.Tensor:
    """Task rewards [N], scaled (advantage.reward_scaling), then a truncated sample's scaled by
    dapo.stop_properly_penalty_coef, or DAPO's soft overlong penalty on the episode's generated
    tokens over all its turns, against the episode token budget. Reads cfg.advantage.reward_scaling
    and cfg.dapo (cfg.generation and the environments only with dapo.overlong_buffer)."""
    rewards = rollouts.rewards
    scaling = cfg.advantage.reward_scaling
    if scaling.enabled:
        rewards = scale_rewards(
            rewards,
            source_min=scaling.source_min,
            source_max=scaling.source_max,
            target_min=scaling.target_min,
            target_max=scaling.target_max,
        )
    if cfg.dapo.stop_properly_penalty_coef is not None:
        rewards = stop_properly_penalty(rewards, rollouts.truncated, coef=cfg.dapo.stop_properly_penalty_coef)
    if cfg.dapo.overlong_buffer:
        rewards = rewards + overlong_reward_shaping(
            rollouts.response_lengths,
            max_len=run_episode_token_budget(cfg),
            buffer_len=cfg.dapo.overlong_buffer,
            penalty=cfg.dapo.overlong_penalty,
        )
    return rewards


def reward_kl(loss: Any, batch: RLBatch) -> torch.Tensor:
    """[B, T] per-token KL(π_old || π_ref) estimates (loss.kl_estimator and its clamps, float64) on the
    batch's loss tokens, 0 elsewhere: the KL that `loss.kl_in_reward` puts into the reward. π_old: the
    batch's old logprobs, else the generator's (one update on an on-policy batch: the same policy)."""
    policy = batch.old_logprobs if batch.old_logprobs is not None else batch.generation_logprobs
    kl = kl_estimate(
        policy.double(),
        batch.reference_logprobs.double(),
        loss.kl_estimator,
        input_clamp=loss.kl_input_clamp,
        output_clamp=loss.kl_output_clamp,
    )
    return torch.where(batch.loss_mask.bool(), kl, torch.zeros_like(kl))


def loss_normalizers(cfg: Any, batch: RLBatch) -> tuple[float, float]:
    """(loss normaliser for cfg.loss.aggregation, global count of valid tokens).

    Sequence counts include only sequences with at least one valid token: a sample the overlong
    filter (or an unscored episode) took out of the loss does not dilute the mean.
    seq_mean_token_sum (Dr.GRPO) divides by sequences × the episode token budget (one turn:
    max_new_tokens), the most tokens a sequence can train on.
    """
    tokens = max(1.0, float(batch.loss_mask.sum()))
    aggregation = cfg.loss.aggregation
    if aggregation == "token":
        return tokens, tokens
    sequences = max(1.0, float((batch.loss_mask.sum(-1) > 0).sum()))
    if aggregation == "sequence":
        return sequences, tokens
    return sequences * run_episode_token_budget(cfg), tokens


def add_mean(metrics: dict[str, float], out: TrainResult, updates: int, prefix: str = "") -> None:
    """Add one update's loss metrics and gradient norm to `metrics` as a share of the mean over
    `updates` updates; the learning rate is the latest update's."""
    new = {prefix + k: v for k, v in {**out.loss_metrics, "grad_norm": out.grad_norm}.items()}
    accumulate_metrics(metrics, new, 1 / updates)  # *_min / *_max: extremes over the updates
    metrics[prefix + "lr"] = out.lr


def rows_with_gradient(cfg: Any, batch: RLBatch) -> torch.Tensor:
    """[B] bool: the rows whose loss can have a non-zero gradient. A row without a loss token never
    has one. When the loss is the advantage-weighted term alone (kl_beta = 0 or the KL in the
    reward, no reference logprobs in the batch, positive_example_nll_weight = 0), neither has a row
    whose advantages are 0 on all its loss tokens: every policy loss multiplies each token's term
    by its advantage (a GRPO group whose rewards are all equal). All rows when
    loss.skip_zero_advantage_rows is off."""
    loss = cfg.loss
    if not loss.skip_zero_advantage_rows:
        return torch.ones(len(batch), dtype=torch.bool)
    mask = batch.loss_mask != 0
    keep = mask.any(-1)
    kl_in_loss = loss.kl_beta > 0 and not loss.kl_in_reward
    if kl_in_loss or batch.reference_logprobs is not None or loss.positive_example_nll_weight > 0:
        return keep
    advantages = batch.advantages
    if advantages.dim() == 1:
        return keep & (advantages != 0)
    return keep & ((advantages != 0) & mask).any(-1)


def gradient_rows(cfg: Any, batch: RLBatch, world_size: int) -> RLBatch:
    """The rows of `batch` that `rows_with_gradient` keeps, in order, topped up with rows it drops
    (their gradient is 0) to a positive multiple of `world_size`, so that the data-parallel workers
    get equal shards and the optimizer still steps (AdamW moves on a zero gradient: its moments). The
    step equals the whole batch's when the caller keeps the whole batch's loss normalisers."""
    keep = rows_with_gradient(cfg, batch).tolist()
    kept = [i for i, k in enumerate(keep) if k]
    if len(kept) == len(batch):
        return batch
    dropped = [i for i, k in enumerate(keep) if not k]
    count = max(world_size, -(-len(kept) // world_size) * world_size)
    return batch.reorder(kept + dropped).select(0, count)


def policy_updates(
    policy: PolicyGroup, cfg: Any, minibatches: Iterable[RLBatch], updates: int
) -> dict[str, float]:
    """One optimizer step of the policy per minibatch on GRPO's clipped surrogate (`grpo_loss` with
    every loss.* knob), normalised by the minibatch's global counts (`loss_normalizers`), on the
    minibatch's rows that have a gradient (`gradient_rows`: the same step, less compute). Metrics:
    means over the `updates` steps (`add_mean`), the learning rate the last one's; the loss's token
    means (clip fraction, ratios, engine mismatch) are over the rows trained, and
    `skipped_row_fraction` is the share of rows left out."""
    metrics: dict[str, float] = {}
    knobs = loss_knobs(cfg.loss)
    for mb in minibatches:
        normalizer, _ = loss_normalizers(cfg, mb)
        trained = gradient_rows(cfg, mb, policy.world_size)
        tokens = max(1.0, float(trained.loss_mask.sum()))
        loss_fn = functools.partial(
            grpo_loss, token_normalizer=tokens, positive_normalizer=positive_tokens(mb), **knobs
        )
        add_mean(metrics, policy.train(trained, loss_fn, normalizer), updates)
        metrics["skipped_row_fraction"] = (
            metrics.get("skipped_row_fraction", 0.0) + (1 - len(trained) / len(mb)) / updates
        )
    return metrics


def filter_logprob_errors(threshold: float | None, batch: RLBatch) -> dict[str, float]:
    """loss.seq_logprob_error_threshold: take the sequences whose engine logprobs disagree with
    π_old by more than it out of the loss (their loss_mask rows zeroed; `logprob_error_keep`),
    after the advantages (their rewards stay in the baselines, as in NeMo RL). No-op when None."""
    if threshold is None:
        return {}
    keep, metrics = logprob_error_keep(
        batch.old_logprobs, batch.generation_logprobs, batch.loss_mask, threshold=threshold
    )
    batch.loss_mask = batch.loss_mask * keep.to(batch.loss_mask.dtype)[:, None]
    return metrics


def batch_stats(
    rollouts: Rollouts, mask: torch.Tensor, generation_logprobs: torch.Tensor
) -> dict[str, float]:
    """response_length, truncation_rate and entropy (minus the generator's mean logprob over the
    loss's tokens) of a batch."""
    return {
        "response_length": float(rollouts.response_lengths.mean()),
        "truncation_rate": float(rollouts.truncated.float().mean()),
        "entropy": float(-(generation_logprobs * mask).sum() / mask.sum().clamp(min=1)),
    }
