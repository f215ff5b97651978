"""The RL configs' loss, advantage and reward-shaping (DAPO) sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from posttrain.config.common import Strict, config_warning


class LossConfig(Strict):
    """The policy-gradient loss (see posttrain.algorithms.policy_loss and docs/algorithms.md)."""

    policy_loss: Literal["clipped_pg", "cispo"] = Field(
        "clipped_pg",
        description="clipped_pg: PPO/GRPO's clipped surrogate (and its variants below); cispo: MiniMax-M1's "
        "CISPO, the stop-gradient IS weight clipped to [1 - clip_low, 1 + clip_high] times log π "
        "(no dual_clip, token ratio_level).",
    )
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.2, ge=0, description="DAPO clip-higher: e.g. 0.28.")
    dual_clip: float | None = Field(None, gt=1)
    ratio_level: Literal["token", "sequence"] = Field(
        "token", description="sequence: GSPO (with aggregation=sequence and clips of 3e-4 / 4e-4)."
    )
    aggregation: Literal["token", "sequence", "seq_mean_token_sum"] = Field(
        "token",
        description="token: mean over the batch's tokens (DAPO); sequence: mean over sequences of their "
        "token mean (GRPO paper); seq_mean_token_sum: token sums / (sequences × max_new_tokens) (Dr.GRPO).",
    )
    kl_beta: float = Field(0.0, ge=0, description="β of the KL(π || π_ref) penalty; 0: no reference model.")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="Schulman's per-token estimator of KL(π || π_ref) (value of the penalty)."
    )
    kl_gradient: Literal["exact", "plain"] = Field(
        "exact",
        description="exact: k1 and k3 get the score-function factor exp(log π - sg(log π)), so every "
        "estimator's expected gradient is ∇KL(π || π_ref). plain: the estimate as a plain loss term "
        "(DeepSeekMath's GRPO; with k3 its expected gradient is ∇KL(π_ref || π), with k1 zero).",
    )
    kl_input_clamp: float | None = Field(
        20.0, gt=0, description="Clamp log(π_ref / π) to ±this before the estimator; null: off."
    )
    kl_output_clamp: float | None = Field(
        10.0, gt=0, description="Clamp the per-token KL estimate to ±this; null: off."
    )
    kl_in_reward: bool = Field(
        False,
        description="Put β·KL into the reward instead of the loss (REINFORCE++, PPO-RLHF): each "
        "sequence's reward loses β Σ_t KL_t before the advantages (reinforce_pp: per token, β times the "
        "KL still to come). The loss then only reports the KL.",
    )
    importance_correction: Literal["auto", "plain", "truncated", "icepop", "seq_mask"] | None = Field(
        "auto",
        description="Weight the policy-gradient term by π_old / π_gen (inference-engine mismatch). "
        "truncated: clamp to [importance_min, importance_cap]; icepop: tokens outside the bounds get 0; "
        "seq_mask: sequences whose geometric-mean ratio is outside the bounds get 0. auto: truncated "
        "where the sampler is not the trainer (async GRPO's stale weights; a vLLM engine in another "
        "dtype than the policy, e.g. bfloat16 under float32), else off; null: off.",
    )
    importance_cap: float = Field(2.0, gt=0, description="Upper bound of the importance ratio.")
    importance_min: float | None = Field(
        None, ge=0, description="Lower bound of the importance ratio; null: 0 (no lower bound)."
    )
    disable_ppo_ratio: bool = Field(
        False,
        description="NeMo RL: disable_ppo_ratio. The REINFORCE / RLOO surrogate -A log π instead of the "
        "clipped ratio (same gradient on one update per batch; the logged pg_loss is -A log π). Use it "
        "for a REINFORCE-style recipe moved from NeMo RL; no dual_clip, token ratio_level, clipped_pg.",
    )
    on_policy_kl_approximation: bool = Field(
        False,
        description="NeMo RL: use_on_policy_kl_approximation. Weight the KL term by π / π_gen (held "
        "fixed), so the KL estimate is unbiased for tokens drawn by the engine rather than by π. Use it "
        "with kl_beta > 0 when the engine differs from the trainer (vLLM, async).",
    )
    seq_logprob_error_threshold: float | None = Field(
        None,
        ge=1,
        description="NeMo RL: grpo.seq_logprob_error_threshold. Leave out of the loss a sequence whose "
        "mean exp(|log π_old - log π_gen|) over its tokens exceeds this (e.g. 1.5); the count is logged "
        "as logprob_error/dropped_sequences. Use it when a few sequences' engine logprobs are broken; "
        "null: off (the error is only logged).",
    )
    skip_zero_advantage_rows: bool = Field(
        True,
        description="Leave out of the policy's forward and backward the rows whose gradient is exactly 0: "
        "no loss token, or (the loss being the advantage-weighted term alone: no KL term or reference "
        "logprobs, no positive-example NLL) advantages 0 on every loss token, e.g. a GRPO group whose "
        "rewards are all equal. The step is the same (the normalisers stay the batch's), the compute "
        "less; the loss's token means (clip fraction, ratios, engine mismatch) are then over the rows "
        "trained. Logged: skipped_row_fraction. false: train every row.",
    )
    positive_example_nll_weight: float = Field(
        0.0,
        ge=0,
        description="NeMo RL: loss_fn.positive_example_nll_weight (VAPO's μ, e.g. 0.1). Add μ times the "
        "NLL of the samples whose environment reward is > 0, a mean over their tokens in the whole "
        "batch. Use it to keep imitating the rare correct answers of a hard task; 0: off.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> LossConfig:
        if self.importance_min is not None and self.importance_min >= self.importance_cap:
            raise ValueError(
                f"loss.importance_min ({self.importance_min}) must be below loss.importance_cap "
                f"({self.importance_cap})"
            )
        if self.policy_loss == "cispo" and (self.dual_clip is not None or self.ratio_level != "token"):
            raise ValueError(
                "loss.policy_loss=cispo clips the importance weight itself: it takes no loss.dual_clip "
                "and only loss.ratio_level=token"
            )
        if self.disable_ppo_ratio and (
            self.policy_loss != "clipped_pg" or self.dual_clip is not None or self.ratio_level != "token"
        ):
            raise ValueError(
                "loss.disable_ppo_ratio=true uses -A log π, which has no ratio to clip: it takes "
                "loss.policy_loss=clipped_pg, no loss.dual_clip and loss.ratio_level=token"
            )
        if self.on_policy_kl_approximation and (self.kl_beta == 0 or self.kl_in_reward):
            config_warning(
                "loss.on_policy_kl_approximation=true weights the KL loss term, but there is none "
                f"(kl_beta={self.kl_beta}, kl_in_reward={self.kl_in_reward}): it has no effect"
            )
        if (
            self.kl_beta > 0
            and not self.kl_in_reward
            and self.kl_gradient == "plain"
            and self.kl_estimator == "k1"
        ):
            raise ValueError(
                "loss.kl_estimator=k1 with loss.kl_gradient=plain has zero expected gradient: the KL "
                "penalty would do nothing. Use kl_gradient=exact"
            )
        if self.ratio_level == "sequence" and max(self.clip_low, self.clip_high) > 0.01:
            config_warning(
                f"loss.ratio_level=sequence (GSPO) with clip_low={self.clip_low}, clip_high={self.clip_high}: "
                "a sequence ratio is a geometric mean of token ratios and stays close to 1, so token-level "
                "clips (0.2) almost never clip. GSPO uses clip_low=3e-4, clip_high=4e-4"
            )
        if self.ratio_level == "sequence" and self.aggregation != "sequence":
            config_warning(
                f"loss.ratio_level=sequence (GSPO) with aggregation={self.aggregation}: GSPO's objective "
                "averages over sequences; set loss.aggregation=sequence"
            )
        if self.kl_in_reward and self.kl_beta == 0:
            config_warning("loss.kl_in_reward=true with loss.kl_beta=0 penalises nothing; set kl_beta > 0")
        if self.importance_min is not None and self.importance_correction in (None, "plain"):
            config_warning(
                f"loss.importance_min is set but loss.importance_correction={self.importance_correction}: "
                "the bound is unused (use truncated, icepop or seq_mask)"
            )
        return self


class RewardScalingConfig(Strict):
    """NeMo RL's reward scaling: clamp the reward to [source_min, source_max], map it linearly onto
    [target_min, target_max]."""

    enabled: bool = False
    source_min: float = 0.0
    source_max: float = 1.0
    target_min: float = 0.0
    target_max: float = 1.0

    @model_validator(mode="after")
    def _ordered(self) -> RewardScalingConfig:
        if self.source_max <= self.source_min:
            raise ValueError(
                f"advantage.reward_scaling: source_min ({self.source_min}) must be below "
                f"source_max ({self.source_max})"
            )
        return self


class AdvantageConfig(Strict):
    """Advantages from rewards (see posttrain.algorithms.advantages and docs/algorithms.md)."""

    estimator: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "on_policy_distill", "gdpo"] = Field(
        "grpo",
        description="on_policy_distill: per-token A_t = distill_coef * (log pi_T(a_t) - log pi_S(a_t)) from "
        "a teacher (the `teacher` section), plus distill_reward_weight times the grpo advantage of the "
        "environment's rewards. gdpo (NeMo RL: adv_estimator.name=gdpo): the grpo advantage of each "
        "named reward component of the environment apart (normalize_std, leave_one_out, "
        "leave_one_out_std apply), their reward_weights sum, normalised over the batch; for an "
        "environment with several rewards of different spreads (correctness and format).",
    )
    normalize_std: bool = Field(True, description="grpo: divide by the group's reward std.")
    leave_one_out: bool = Field(
        False, description="grpo: baseline = mean of the OTHER samples of the group (RLOO's baseline)."
    )
    leave_one_out_std: bool = Field(
        False,
        description="grpo with leave_one_out: divide by the std of the other samples too (NeMo RL's "
        "default); where it is 0 the advantage stays r - baseline.",
    )
    clip: float | None = Field(None, gt=0, description="Clamp advantages to [-clip, clip]; null: off.")
    clip_low: float | None = Field(
        None,
        description="NeMo RL: grpo.advantage_clip_low. Lower bound of the advantages (e.g. -2), set apart "
        "from clip_high when the two sides need different bounds; null: open. Not with clip.",
    )
    clip_high: float | None = Field(
        None,
        description="NeMo RL: grpo.advantage_clip_high. Upper bound of the advantages (e.g. 3); null: open.",
    )
    minus_baseline: bool = Field(
        True,
        description="NeMo RL: adv_estimator.minus_baseline (the same default). reinforce_pp: subtract "
        "each prompt's group mean before the batch normalisation (REINFORCE++-baseline, for G > 1 "
        "samples per prompt); false: the batch mean only (plain REINFORCE++, posttrain's behaviour "
        "before this key existed). Other estimators ignore it.",
    )
    reward_scaling: RewardScalingConfig = Field(default_factory=RewardScalingConfig)
    invalid_tool_call_advantage: float | None = Field(
        None,
        description="NeMo RL: grpo.invalid_tool_call_advantage (e.g. -5). The advantage of every token of "
        "an assistant turn whose tool call could not be run (unreadable, unknown tool, arguments that do "
        "not fit; the tool environments flag it), instead of the episode's; then advantage.clip. For "
        "agents that keep writing broken calls; null: off.",
    )
    malformed_thinking_advantage: float | None = Field(
        None,
        description="NeMo RL: grpo.malformed_thinking_advantage (e.g. -5). The same for a turn whose "
        "<think> block is malformed (unclosed, repeated, or not at the start); an invalid tool call "
        "takes precedence. For reasoning models that leak or break their thinking tags; null: off.",
    )
    reward_weights: dict[str, float] | None = Field(
        None,
        description="NeMo RL: adv_estimator.reward_weights (a list there, in the components' "
        "alphabetical order; here by name). gdpo: the weight of each reward component's advantage, "
        "every component named; null: all 1.",
    )
    distill_coef: float = Field(
        1.0, gt=0, description="on_policy_distill: weight of the teacher-minus-student log-probability."
    )
    distill_reward_weight: float = Field(
        0.0,
        ge=0,
        description="on_policy_distill: weight of the environment reward's grpo advantage added to every "
        "token (0: distillation only).",
    )
    teacher_temperature: float = Field(
        1.0,
        gt=0,
        description="on_policy_distill: the teacher's log-probabilities are of softmax(logits / T).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> AdvantageConfig:
        if self.leave_one_out_std and not self.leave_one_out:
            raise ValueError("advantage.leave_one_out_std needs advantage.leave_one_out=true")
        if self.clip is not None and (self.clip_low is not None or self.clip_high is not None):
            raise ValueError(
                "advantage.clip is symmetric; advantage.clip_low / clip_high are its asymmetric form: "
                "set one or the other"
            )
        if self.clip_low is not None and self.clip_high is not None and self.clip_low >= self.clip_high:
            raise ValueError(
                f"advantage.clip_low ({self.clip_low}) must be below advantage.clip_high ({self.clip_high})"
            )
        if self.reward_weights is not None and self.estimator != "gdpo":
            config_warning(
                f"advantage.reward_weights apply to estimator=gdpo only; {self.estimator} ignores them"
            )
        if self.estimator not in ("grpo", "on_policy_distill", "gdpo") and (
            self.leave_one_out or self.leave_one_out_std or not self.normalize_std
        ):
            config_warning(
                f"advantage.normalize_std / leave_one_out / leave_one_out_std apply to estimator=grpo only; "
                f"estimator={self.estimator} ignores them"
            )
        return self


class DAPOConfig(Strict):
    dynamic_sampling: bool = Field(False, description="Drop groups whose rewards are all equal and refill.")
    max_generation_rounds: int = Field(
        4,
        gt=0,
        description="Dynamic sampling: generation rounds per step at most. If the batch is still short, "
        "the step trains on the groups kept (dapo/short_batch = 1), or skips its update if none "
        "(dapo/skipped_update = 1).",
    )
    overlong_filter: bool = Field(False, description="Exclude truncated samples from the loss.")
    overlong_buffer: int | None = Field(
        None, gt=0, description="Soft overlong penalty over the last N tokens."
    )
    overlong_penalty: float = Field(1.0, ge=0)
    stop_properly_penalty_coef: float | None = Field(
        None,
        ge=0,
        le=1,
        description="NeMo RL: reward_shaping.stop_properly_penalty_coef. Scale the reward of a truncated "
        "sample (no stop token) by this: 0 gives it nothing, 1 changes nothing. Use it to teach the policy "
        "to finish within the budget (rewards >= 0; a negative reward is scaled towards 0). Not with "
        "overlong_buffer; null: off.",
    )

    @model_validator(mode="after")
    def _one_length_shaping(self) -> DAPOConfig:
        if self.stop_properly_penalty_coef is not None and self.overlong_buffer is not None:
            raise ValueError(
                "dapo.stop_properly_penalty_coef and dapo.overlong_buffer both shape the reward of long "
                "samples (NeMo RL ignores the overlong penalty when the coefficient is set): set one of them"
            )
        return self
