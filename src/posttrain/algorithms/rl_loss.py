"""The policy loss on an RL batch (``grpo_loss``; GRPO and PPO train with it) and its config mapping
(``loss_knobs``).

This floor does not import the batch or the config types (import-linter contract "algorithms:
pure math"): both are duck-typed, as the ``Protocol``s ``PolicyLossBatch`` (what ``grpo_loss``
reads of ``posttrain.rollout.rollout.RLBatch``) and ``LossSettings`` (what ``loss_knobs`` reads of
``posttrain.config.LossConfig``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from posttrain.algorithms.metrics import engine_mismatch_metrics
from posttrain.algorithms.policy_loss import POLICY_LOSSES


class PolicyLossBatch(Protocol):
    """The fields of a (micro)batch that ``grpo_loss`` reads; B rows, T positions.

    advantages: [B] or [B, T]; loss_mask: [B, T]; old_logprobs, generation_logprobs,
    reference_logprobs: [B, T] or None; rewards: [B] environment rewards or None.
    """

    advantages: torch.Tensor | None
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor | None
    generation_logprobs: torch.Tensor | None
    reference_logprobs: torch.Tensor | None
    rewards: torch.Tensor | None


class LossSettings(Protocol):
    """What ``loss_knobs`` reads of the loss config (a pydantic model): its fields as a dict, and two."""

    policy_loss: str
    kl_in_reward: bool

    def model_dump(self, *, exclude: set[str]) -> dict[str, Any]: ...


def grpo_loss(
    logprobs: torch.Tensor,
    batch: PolicyLossBatch,
    normalizer: float,
    *,
    token_normalizer: float,
    positive_normalizer: float | None = None,
    policy_loss: str = "clipped_pg",
    **knobs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss (``POLICY_LOSSES[policy_loss]``) plus generation-vs-training diagnostics.

    Metrics are this microbatch's shares of global means. token_mult_prob_error, gen_kl,
    policy_kl_error and js_divergence_error (``engine_mismatch_metrics``) compare the generator with π_old, the policy that the batch was sampled for (``old_logprobs``
    when the batch gets several updates, else the current policy, which then is π_old): they
    measure the engine mismatch, not how far the policy has moved since (NeMo RL's definition).
    That holds for rows sampled by π_old's own weights; in async mode stale rows also carry the
    policy's drift, so the trainer replaces both with their values over the fresh rows and reports
    the stale rows' gap apart (`posttrain.trainers.rl.asynchronous.logprob_gap_metrics`).

    VAPO (``positive_example_nll_weight``): the positive samples are the rows whose environment
    reward (``batch.rewards``) is > 0, ``positive_normalizer`` their valid tokens in the whole
    minibatch (`positive_tokens`), as the trainer counts them before splitting it.
    """
    old = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
    positive = batch.rewards > 0 if batch.rewards is not None else None
    loss, metrics = POLICY_LOSSES[policy_loss](
        logprobs,
        old,
        batch.advantages,
        batch.loss_mask,
        normalizer=normalizer,
        generation_logprobs=batch.generation_logprobs,
        reference_logprobs=batch.reference_logprobs,
        token_normalizer=token_normalizer,
        positive_samples=positive,
        positive_normalizer=positive_normalizer,
        **knobs,
    )
    metrics.update(
        engine_mismatch_metrics(
            old.detach(), batch.generation_logprobs, batch.loss_mask, normalizer=token_normalizer
        )
    )
    return loss, metrics


def positive_tokens(batch: PolicyLossBatch) -> float:
    """VAPO's normaliser: the valid tokens of the rows whose environment reward is > 0, over the
    whole (mini)batch that the workers split (0 without rewards)."""
    if batch.rewards is None:
        return 0.0
    return float((batch.loss_mask * (batch.rewards > 0).to(batch.loss_mask.dtype)[:, None]).sum())


TRAINER_ONLY_LOSS_FIELDS = frozenset(
    {"kl_in_reward", "seq_logprob_error_threshold", "skip_zero_advantage_rows"}
)
"""LossConfig fields the trainer acts on; they are not arguments of the pure loss functions."""


def loss_knobs(loss: LossSettings) -> dict[str, Any]:
    """Keyword arguments of ``grpo_loss`` from the loss config: ``policy_loss`` picks the function,
    the others are its hyper-parameters. With ``kl_in_reward`` the KL is in the advantages and the
    loss gets kl_beta = 0 (it still reports the KL, the reference logprobs being in the batch)."""
    knobs = loss.model_dump(exclude=set(TRAINER_ONLY_LOSS_FIELDS))
    if knobs.get("importance_correction") == "auto":  # a run's config resolves it; alone, no engine differs
        knobs["importance_correction"] = None
    if loss.kl_in_reward:
        knobs["kl_beta"] = 0.0
    if loss.policy_loss == "cispo":  # the config rejects non-defaults for these
        knobs.pop("dual_clip"), knobs.pop("ratio_level"), knobs.pop("disable_ppo_ratio")
    return knobs
