"""`posttrain eval`: its data and sampling sections."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from posttrain.config.common import DatasetConfig, PromptsConfig, Strict, _default_grpo_validation
from posttrain.config.rollout import EnvironmentConfig, GenerationConfig, check_episode_budget


class EvalDataConfig(PromptsConfig):
    TASKS: ClassVar[str] = "dataset"

    dataset: DatasetConfig = Field(
        default_factory=_default_grpo_validation,
        description="Default: the GRPO quickstart's held-out problems.",
    )
    max_prompt_len: int = Field(512, gt=0, description="Prompts longer than this (in tokens) are skipped.")


class EvalSamplingConfig(Strict):
    """n samples per prompt and the k of pass@k / cons@k."""

    samples_per_prompt: int = Field(1, gt=0, description="n: completions sampled per problem.")
    k: list[int] = Field(
        default_factory=lambda: [1], description="Report pass@k and cons@k for each k (each <= n)."
    )
    seed: int = 0


class EvalConfig(Strict):
    """`posttrain eval`: run n episodes per task (math problems by default, any environment, one turn
    or several) and score them with the environment's reward (mean reward, pass@k, cons@k, turns);
    or, with `metric: loss`, the held-out loss and perplexity of SFT rows."""

    model: str = Field(
        "smollm2-135m-instruct",
        description="A posttrain model alias, a local HF folder, a hub id, or a posttrain checkpoint "
        "(a step_* folder, or a run directory: its latest checkpoint).",
    )
    tokenizer_name: str | None = Field(None, description="Default: the model's (or checkpoint's) tokenizer.")
    chat_template: str | None = Field(
        None,
        description="As policy.chat_template: a Jinja string, a .jinja file or `plain`; null: the tokenizer's.",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="The weights and compute of the evaluated model. auto: a posttrain checkpoint's "
        "compute dtype (the policy.dtype its run trained and sampled in), float32 for any other model. A "
        "checkpoint holds fp32 master weights; under bf16 compute an update smaller than bf16's rounding "
        "step moves them without moving the function the run trained, so in float32 they can play "
        "differently from the policy the run validated.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available.")
    max_seq_len: int = Field(
        2048, gt=1, description="Longest episode in tokens: prompt, every turn and every observation."
    )
    data: EvalDataConfig = EvalDataConfig()
    generation: GenerationConfig = Field(
        default_factory=lambda: GenerationConfig(temperature=0.0),
        description="backend, temperature (0 = greedy), top_p, top_k, max_new_tokens, stop_strings, "
        "batch_size; placement and worker counts are for training and ignored here.",
    )
    sampling: EvalSamplingConfig = EvalSamplingConfig()
    environment: EnvironmentConfig = Field(
        default_factory=EnvironmentConfig,
        description="Scores completions; needs info['correct'] and info['extracted_answer'] (math does).",
    )
    metric: Literal["episodes", "loss"] = Field(
        "episodes",
        description="episodes: sample replies and score them with `environment` (any environment's reward "
        "is the metric: mean_reward, accuracy, pass@k, cons@k). loss: the held-out loss of SFT rows "
        "(`messages` or prompt/response, as `posttrain sft` reads them): mean NLL per assistant token and "
        "perplexity = exp(loss); nothing is generated.",
    )
    output_dir: str | None = Field(
        None, description="Default: runs/eval. Gets summary.json and samples.jsonl."
    )

    @model_validator(mode="after")
    def _k_within_n(self) -> EvalConfig:
        self.generation.check_lora_adapter(None)  # eval serves whole models (a LoRA run is exported merged)
        check_episode_budget(self)
        n = self.sampling.samples_per_prompt
        bad = [k for k in self.sampling.k if not 1 <= k <= n]
        if bad or not self.sampling.k:
            raise ValueError(
                f"sampling.k={self.sampling.k}: every k must be between 1 and sampling.samples_per_prompt={n}; "
                f"raise samples_per_prompt or lower k"
            )
        return self
