"""Pure torch math: losses, advantages and metrics. Imports nothing but torch (no ray, vllm or transformers)."""

from posttrain.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    dr_grpo_advantages,
    group_statistics,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from posttrain.algorithms.dapo import overlong_filter_mask, overlong_reward_shaping, zero_variance_groups
from posttrain.algorithms.losses import masked_sum, nll_loss
from posttrain.algorithms.metrics import (
    approx_entropy,
    cons_at_k,
    generation_kl,
    majority_vote,
    pass_at_k,
    reward_statistics,
    token_mult_prob_error,
)
from posttrain.algorithms.policy_loss import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregate,
    clipped_pg_loss,
    kl_estimate,
    masked_mean,
    sequence_log_ratio,
)
from posttrain.algorithms.preference import (
    PREFERENCE_LOSSES,
    bradley_terry_loss,
    dpo_sigmoid_loss,
    ipo_loss,
    preference_accuracy_and_margin,
    preference_logits,
    sequence_logprobs,
)

__all__ = [
    "masked_sum",
    "nll_loss",
    "ADVANTAGE_ESTIMATORS",
    "compute_advantages",
    "dr_grpo_advantages",
    "group_statistics",
    "grpo_advantages",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "overlong_filter_mask",
    "overlong_reward_shaping",
    "zero_variance_groups",
    "approx_entropy",
    "cons_at_k",
    "generation_kl",
    "majority_vote",
    "pass_at_k",
    "reward_statistics",
    "token_mult_prob_error",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "aggregate",
    "clipped_pg_loss",
    "kl_estimate",
    "masked_mean",
    "sequence_log_ratio",
    "PREFERENCE_LOSSES",
    "bradley_terry_loss",
    "dpo_sigmoid_loss",
    "ipo_loss",
    "preference_accuracy_and_margin",
    "preference_logits",
    "sequence_logprobs",
]
