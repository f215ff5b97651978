"""The commands that train on a fixed dataset, epoch by epoch: `posttrain sft`, `posttrain dpo` and
`posttrain rm` (SFT rows and preference pairs, their data and loop sections)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from posttrain.config.common import (
    _GRPO_ARITH_KWARGS,
    VALIDATION_HELP,
    CheckpointConfig,
    ClusterConfig,
    DatasetConfig,
    LoggingConfig,
    OptimizerConfig,
    PolicyConfig,
    ReasoningGymConfig,
    SchedulerConfig,
    SplitsConfig,
    Strict,
    generated_problems,
)

# 2-digit sums and differences: the default task of SFT and DPO.
_ARITH_KWARGS: dict = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 2,
    "operators": ["+", "-"],
}


class EpochLoopConfig(Strict):
    """The loop of a trainer that reads its dataset epoch by epoch (sft, dpo, rm)."""

    max_steps: int | None = Field(60, gt=0, description="Stop after this many optimizer steps.")
    num_epochs: int = Field(1, gt=0)
    global_batch_size: int = Field(8, gt=0, description="Sequences per optimizer step, over all workers.")
    val_every: int = Field(20, gt=0)
    val_at_start: bool = True
    val_batches: int | None = Field(None, gt=0, description="Cap on validation batches; null: whole set.")
    seed: int = 0


class EpochConfig(Strict):
    """Base of the sft, dpo and rm configs: the sections they share (each sets its policy's defaults)."""

    policy: PolicyConfig
    cluster: ClusterConfig = ClusterConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(save_every=20)
    logging: LoggingConfig = LoggingConfig()


# --------------------------------------------------------------------------------- sft
class SFTDataConfig(SplitsConfig):
    train: DatasetConfig = Field(default_factory=lambda: generated_problems(2000, 1, _ARITH_KWARGS))
    validation: DatasetConfig | None = Field(
        default_factory=lambda: generated_problems(64, 1_000_001, _ARITH_KWARGS), description=VALIDATION_HELP
    )
    overlong: Literal["truncate", "drop"] = Field(
        "truncate", description="What to do with sequences longer than policy.max_seq_len."
    )


class SFTTrainerConfig(EpochLoopConfig):
    """SFT's loop: batch sizes count sequences."""


class SFTConfig(EpochConfig):
    """`posttrain sft`."""

    policy: PolicyConfig = PolicyConfig(
        optimizer=OptimizerConfig(lr=5e-5), scheduler=SchedulerConfig(warmup_steps=5), max_seq_len=256
    )
    data: SFTDataConfig = SFTDataConfig()
    sft: SFTTrainerConfig = SFTTrainerConfig()


# --------------------------------------------------------------------------------- dpo and rm
class GeneratedPairsConfig(ReasoningGymConfig):
    """Preference pairs generated offline from reasoning-gym problems (right vs wrong final answer)."""

    system_prompt: str | None = Field(
        None, description="A system message for the generated prompts (dropped with this source)."
    )


class PreferenceDatasetConfig(Strict):
    """One split of preference pairs: a local file, a `datasets` name, or pairs generated offline.

    Row shapes (format `auto` picks by the keys present):
    - `chosen_rejected`: `prompt` (a string or a message list; optional when `chosen`/`rejected` are
      full conversations, as in HH-RLHF or UltraFeedback) plus `chosen` and `rejected` (strings,
      message lists, or HH-RLHF "\\n\\nHuman: ... \\n\\nAssistant: ..." transcripts);
    - `helpsteer3`: `context` (message list), `response1`, `response2`, `overall_preference`
      (< 0: response1 is better, > 0: response2; 0 ties are dropped).
    Generated (`reasoning_gym`): the prompt is a problem, `chosen` a worked answer ending in the
    right `\\boxed{}` answer, `rejected` the same with a wrong number.
    """

    path: str | None = Field(
        None, description="A .jsonl/.json/.parquet file or a `datasets.load_dataset` name."
    )
    subset: str | None = None
    split: str = "train"
    reasoning_gym: GeneratedPairsConfig | None = None
    format: Literal["auto", "chosen_rejected", "helpsteer3"] = "auto"
    prompt_key: str = "prompt"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    system_prompt: str | None = None
    max_samples: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> PreferenceDatasetConfig:
        if (self.path is None) == (self.reasoning_gym is None):
            raise ValueError(
                "set exactly one of `path` (a file or dataset name) or `reasoning_gym` (generated pairs)"
            )
        return self


def _generated_pairs(size: int, seed: int, kwargs: dict) -> PreferenceDatasetConfig:
    """`size` pairs generated from reasoning-gym's basic_arithmetic with `kwargs`, under the GRPO
    quickstart's system prompt (so a reward model fits its rollouts)."""
    system_prompt = "Put the final answer in \\boxed{}."
    gym = GeneratedPairsConfig(size=size, seed=seed, kwargs=kwargs, system_prompt=system_prompt)
    return PreferenceDatasetConfig(reasoning_gym=gym)


class PreferenceDataConfig(SplitsConfig):
    train: PreferenceDatasetConfig = Field(default_factory=lambda: _generated_pairs(2000, 21, _ARITH_KWARGS))
    validation: PreferenceDatasetConfig | None = Field(
        default_factory=lambda: _generated_pairs(128, 2_000_021, _ARITH_KWARGS), description=VALIDATION_HELP
    )
    overlong: Literal["truncate", "drop"] = Field(
        "truncate",
        description="Pairs with a sequence longer than policy.max_seq_len: cut both at max_seq_len, or drop "
        "the pair. A pair whose response would be empty after the cut is always dropped.",
    )


class PreferenceTrainerConfig(EpochLoopConfig):
    """Loop settings shared by DPO and RM. Batch sizes count PAIRS (each pair is two sequences)."""

    max_steps: int | None = Field(40, gt=0, description="Stop after this many optimizer steps.")
    global_batch_size: int = Field(8, gt=0, description="Pairs per optimizer step, over all workers.")


def _pairs_policy(lr: float) -> PolicyConfig:
    """DPO's and RM's policy defaults: a constant learning rate `lr`, sequences of 256 tokens."""
    return PolicyConfig(
        optimizer=OptimizerConfig(lr=lr),
        scheduler=SchedulerConfig(name="constant", warmup_steps=0),
        max_seq_len=256,
        train_micro_batch_size=8,
        logprob_batch_size=16,
    )


class DPOTrainerConfig(PreferenceTrainerConfig):
    """DPO: loss on h = (log π - log π_ref)(chosen) - (log π - log π_ref)(rejected)."""

    loss_type: Literal["sigmoid", "ipo"] = Field("sigmoid", description="sigmoid: DPO; ipo: IPO.")
    beta: float = Field(0.1, gt=0)
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="Conservative DPO: assumed label-flip probability (sigmoid only)."
    )
    average_logprobs: bool = Field(
        False, description="Length-average the response log-probabilities (IPO's choice) instead of summing."
    )
    sft_weight: float = Field(
        0.0, ge=0, description="Add this times the NLL of the chosen responses (per chosen token)."
    )
    preference_loss_weight: float = Field(
        1.0,
        ge=0,
        description="NeMo RL: dpo.preference_loss_weight. Weight of the preference term; lower it (or 0: SFT "
        "on the chosen only) when sft_weight should dominate.",
    )
    sft_normalization: Literal["token", "sum", "average"] = Field(
        "token",
        description="NeMo RL: dpo.sft_average_log_probs (false: sum, true: average). How the SFT term's NLL "
        "is averaged: token: per chosen token of the batch; sum: each chosen's summed NLL, per pair; "
        "average: each chosen's per-token mean, per pair. Use sum / average to match a NeMo RL recipe.",
    )

    @model_validator(mode="after")
    def _ipo_no_smoothing(self) -> DPOTrainerConfig:
        if self.loss_type == "ipo" and self.label_smoothing:
            raise ValueError("dpo.label_smoothing applies to loss_type=sigmoid; set it to 0 for ipo")
        return self


class DPOConfig(EpochConfig):
    """`posttrain dpo`. The reference policy is a frozen copy of the initial `policy.model_name`."""

    policy: PolicyConfig = _pairs_policy(lr=5e-6)
    data: PreferenceDataConfig = PreferenceDataConfig()
    dpo: DPOTrainerConfig = DPOTrainerConfig()


class RMTrainerConfig(PreferenceTrainerConfig):
    """Reward model: Bradley–Terry loss -log σ(r(chosen) - r(rejected)) on a scalar head."""

    max_steps: int | None = Field(60, gt=0, description="Stop after this many optimizer steps.")
    val_every: int = Field(30, gt=0)


def _default_rm_data() -> PreferenceDataConfig:
    """The GRPO quickstart's task (1-digit sums), so the reward model fits the rollouts it will score.

    On 2-digit sums and differences (the DPO default) 60 steps did not move held-out accuracy
    (52% -> 48%, measured); on 1-digit sums they do. There are only 100 distinct 1-digit problems,
    so held-out pairs share problems with training pairs (not their wrong answers).
    """
    return PreferenceDataConfig(
        train=_generated_pairs(2000, 21, _GRPO_ARITH_KWARGS),
        validation=_generated_pairs(128, 2_000_021, _GRPO_ARITH_KWARGS),
    )


class RMConfig(EpochConfig):
    """`posttrain rm`. `policy.model_name` is the backbone; a scalar head (num_labels=1) is added."""

    policy: PolicyConfig = _pairs_policy(lr=5e-5)
    data: PreferenceDataConfig = Field(default_factory=_default_rm_data)
    rm: RMTrainerConfig = RMTrainerConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(save_every=30)

    @model_validator(mode="after")
    def _no_fsdp(self) -> RMConfig:
        if self.policy.fsdp:  # scores come from the decoder and the score head called apart
            raise ValueError(
                "reward-model training does not support policy.fsdp=true yet; use data parallelism"
            )
        return self
