"""The config sections every command shares: the policy (optimizer, scheduler, LoRA), datasets and
their splits, the cluster, checkpoints and logging; `Strict`, the base of every section.

Each model forbids unknown keys, so a typo fails at load time with the key's full path and
the closest valid key (see `posttrain.config.loader`). Every default of posttrain lives in
`posttrain.config`.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Strict(BaseModel):
    """Base for every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------------- policy
class OptimizerConfig(Strict):
    """AdamW."""

    lr: float = Field(2e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    max_grad_norm: float | None = Field(
        1.0, gt=0, description="Clip the global gradient norm; null disables."
    )


class SchedulerConfig(Strict):
    """Linear warmup from 0 to lr over `warmup_steps`, then constant or cosine decay to min_lr_ratio*lr."""

    name: Literal["constant", "cosine"] = "cosine"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)


class LoraConfig(Strict):
    """LoRA adapters on the policy (peft; `pip install 'posttrain[lora]'`). Only the adapters (and a
    reward model's score head) are trained; the base weights stay frozen. See docs/lora.md."""

    rank: int = Field(16, gt=0, description="r: the rank of each adapter (B [out, r] @ A [r, in]).")
    alpha: float = Field(32.0, gt=0, description="The adapter's output is scaled by alpha / rank.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on each adapter's input while training.")
    target_modules: Literal["all-linear"] | list[str] = Field(
        "all-linear",
        description="The Linear layers to adapt: all-linear (every Linear of the decoder, not the output "
        "layer), or module names / suffixes such as [q_proj, v_proj].",
    )
    init: Literal["default", "gaussian"] = Field(
        "default",
        description="How A is initialised (default: Kaiming-uniform, gaussian: N(0, 1/r)); B starts at zero "
        "either way, so step 0 computes the base model.",
    )
    rslora: bool = Field(False, description="Scale by alpha / sqrt(rank) instead of alpha / rank (rsLoRA).")

    @model_validator(mode="after")
    def _targets(self) -> LoraConfig:
        if isinstance(self.target_modules, list) and not self.target_modules:
            raise ValueError("policy.lora.target_modules is empty; name Linear modules or use all-linear")
        return self


CHAT_TEMPLATE_HELP = (
    "Set or replace the tokenizer's chat template: a Jinja string (it contains '{{' or '{%'), the path of "
    "a .jinja file, or `plain` (turns concatenated, assistant turns end with EOS). null: the tokenizer's "
    "own; a tokenizer without one (a base model) is then an error asking for this key. The run saves the "
    "tokenizer with it (<run_dir>/tokenizer, every checkpoint), so eval and export use it too."
)


class PolicyConfig(Strict):
    """The trained model and how one optimizer step is computed."""

    model_name: str = Field(
        "smollm2-135m-instruct",
        description="A posttrain model alias (see `posttrain models list`), a local HF folder, or a hub id.",
    )
    tokenizer_name: str | None = Field(None, description="Defaults to model_name.")
    chat_template: str | None = Field(None, description=CHAT_TEMPLATE_HELP)
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="The compute dtype of forward and backward passes. Parameters (master weights), "
        "gradients and AdamW state stay fp32 either way: bfloat16 computes under torch.autocast (FSDP2: "
        "its MixedPrecisionPolicy, gradients reduced in fp32). Generators (split HF workers with "
        "hf.dtype=auto, vLLM with vllm.dtype=auto) hold the weights in this dtype; refits cast them "
        "(generation.hf.dtype / vllm.dtype set another). Checkpoints hold the fp32 "
        "weights; `posttrain export` writes this dtype unless --dtype says otherwise.",
    )
    max_seq_len: int = Field(512, gt=1)
    train_micro_batch_size: int = Field(4, gt=0, description="Sequences per forward/backward on one worker.")
    logprob_batch_size: int = Field(8, gt=0, description="Sequences per forward in `logprobs`.")
    logprob_chunk_size: int = Field(
        2048, gt=0, description="Tokens whose full-vocabulary logits exist at once in `logprobs`."
    )
    logprob_temperature: float = Field(
        1.0,
        gt=0,
        description="Log-probabilities of softmax(logits / T); GRPO sets it to generation.temperature.",
    )
    packed_sequences: bool = Field(
        True,
        description="Run the decoder on a batch's real tokens only, end to end in one row (no padding "
        "through the linear layers); false: the padded [B, T] batch. Needs a model that calls attention "
        "through transformers' AttentionInterface (all current HF decoders).",
    )
    activation_checkpointing: bool = False
    compile: bool = Field(
        False,
        description="torch.compile each decoder layer (regional: one compilation shared by all layers). "
        "On a 2-core CPU, SFT steps get 6-10% faster after 20-70 s of compiling (cold cache): worth it "
        "for runs of hundreds of steps, not for the 60-step quickstart. See benchmarks/sft_mfu.py.",
    )
    fsdp: bool = Field(
        False,
        description="Shard parameters, gradients and optimizer state over the policy workers with FSDP2 "
        "(fully_shard): NCCL on GPUs; on CPU it runs over gloo (tested, slower than plain data parallelism).",
    )
    lora: LoraConfig | None = Field(
        None,
        description="Train LoRA adapters instead of every weight (null: full fine-tuning). The reference "
        "model is the base with the adapters off; refits send merged weights; checkpoints hold the adapter.",
    )
    optimizer: OptimizerConfig = OptimizerConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    seed: int = 0

    @property
    def split_weights(self) -> bool:
        """No process holds the generator's weights as plain parameters: FSDP2 shards them, LoRA keeps
        them as base + adapter (refits compute the merged tensors)."""
        return self.fsdp or self.lora is not None


# --------------------------------------------------------------------------------- data
class ReasoningGymConfig(Strict):
    """Problems generated offline by the `reasoning-gym` package."""

    task: str = "basic_arithmetic"
    size: int = Field(1000, gt=0)
    seed: int = 0
    kwargs: dict[str, int | float | str | bool | list[str]] = Field(default_factory=dict)


class EnvironmentTasksConfig(Strict):
    """Tasks the environment generates itself (`generate_tasks(size, seed)`: a puzzle from a seed)."""

    size: int = Field(1000, gt=0)
    seed: int = 0
    split: str | None = Field(
        None,
        description="Passed as generate_tasks(size, seed, split=...) when set, for an environment with "
        "separate task pools (wordle: train or heldout, disjoint secrets); null: the environment's default.",
    )


class DatasetConfig(Strict):
    """One split of a dataset: a local file, a `datasets` name, generated problems, or tasks the
    environment generates."""

    path: str | None = Field(
        None, description="A .jsonl/.json/.parquet file or a `datasets.load_dataset` name."
    )
    subset: str | None = None
    split: str = "train"
    reasoning_gym: ReasoningGymConfig | None = None
    environment_tasks: EnvironmentTasksConfig | None = Field(
        None, description="RL only: tasks from the environment's generate_tasks(size, seed)."
    )
    format: Literal["auto", "messages", "prompt_response"] = "auto"
    messages_key: str = "messages"
    prompt_key: str = "prompt"
    response_key: str = "response"
    context_key: str | None = Field(None, description="Prepended to the prompt, e.g. SQuAD's `context`.")
    problem_key: str = Field(
        "prompt", description="Math datasets: the problem column (GSM8K: question, MATH: problem)."
    )
    answer_key: str = Field("answer", description="Math datasets: the ground-truth column (MATH: solution).")
    answer_format: Literal["plain", "gsm8k", "boxed"] = Field(
        "plain",
        description="How to read the ground truth: as is, after GSM8K's '####', or MATH's last \\boxed{}.",
    )
    system_prompt: str | None = None
    max_samples: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> DatasetConfig:
        if sum(x is not None for x in (self.path, self.reasoning_gym, self.environment_tasks)) != 1:
            raise ValueError(
                "set exactly one of `path` (a file or dataset name), `reasoning_gym` (generated) or "
                "`environment_tasks` (generated by the environment)"
            )
        return self


def _given(section: Any) -> dict[str, Any]:
    """The keys a user gave for a section: a mapping's own, or a model's `model_fields_set`."""
    if isinstance(section, BaseModel):
        return {k: getattr(section, k) for k in section.model_fields_set}
    return dict(section) if isinstance(section, dict) else {}


def names_own_data(split: Any) -> bool:
    """Whether a user's dataset split picks data of its own: a `path`, `environment_tasks`, or another
    generated `reasoning_gym.task`. Changing only the size, seed, kwargs or samples of the generated
    default does not count."""
    given = _given(split)
    gym = _given(given.get("reasoning_gym"))
    return any(given.get(k) is not None for k in ("path", "environment_tasks")) or "task" in gym


def quickstart_keys_to_drop(data: Any, fields: Any) -> dict[str, Any]:
    """The keys of a `data` section whose default belongs to the quickstart's task (its held-out
    `validation` split, its worked `example_turns`), with the value that means "none", for a user's
    section that names data of its own (`train` for the trainers, `dataset` for eval) and leaves
    those keys unset. Only keys among `fields` (the section's own) are returned."""
    given = _given(data)
    if not (names_own_data(given.get("train")) or names_own_data(given.get("dataset"))):
        return {}
    none: dict[str, Any] = {"validation": None, "example_turns": []}
    return {k: v for k, v in none.items() if k in fields and k not in given}


VALIDATION_HELP = (
    "The held-out split; null: none. Default: the quickstart's generated problems, but none when "
    "`data.train` names data of its own (a `path`, `environment_tasks` or another `reasoning_gym.task`) "
    "and this key is not set: set it to validate on your own held-out data."
)


class SplitsConfig(Strict):
    """A `data` section whose defaults are the quickstart's task: naming data of one's own
    (`names_own_data` of `train`, or eval's `dataset`) without `validation` means no validation set
    (the default's held-out problems are another task), and likewise no `example_turns` where the
    section has them (the default's worked example is of the quickstart's task).
    `posttrain.config.load_config` applies the same rule to recipes."""

    @model_validator(mode="before")
    @classmethod
    def _no_foreign_validation(cls, data: Any) -> Any:
        if isinstance(data, dict) and (drop := quickstart_keys_to_drop(data, cls.model_fields)):
            return {**data, **drop}
        return data


# The quickstart's task (1-digit sums): the RL trainers' data, eval's and the reward model's.
_GRPO_ARITH_KWARGS: dict = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+"],
    "allow_parentheses": False,
    "allow_negation": False,
}


def generated_problems(size: int, seed: int, kwargs: dict) -> DatasetConfig:
    """A split of `size` problems generated by reasoning-gym's basic_arithmetic with `kwargs`."""
    return DatasetConfig(reasoning_gym=ReasoningGymConfig(size=size, seed=seed, kwargs=kwargs))


def _default_grpo_validation() -> DatasetConfig:
    return generated_problems(64, 99_999, _GRPO_ARITH_KWARGS)


class ChatTurn(Strict):
    """One message of a worked example shown before the task (`data.example_turns`)."""

    role: Literal["user", "assistant"]
    content: str = Field(min_length=1)


# The quickstart's worked example: SmolLM2-135M-Instruct copies a bare `\boxed{}` instruction (an
# empty box), but with one worked sum before the question it answers in the boxed form most of the
# time, so GRPO has a reward signal from its first step. 4 + 3 is not in the validation set.
QUICKSTART_EXAMPLE_TURNS: tuple[tuple[str, str], ...] = (
    ("user", "Calculate 4 + 3.\nPut your final answer within \\boxed{}."),
    ("assistant", "4 + 3 = 7\n\nThe answer is \\boxed{7}."),
)


def check_example_turns(turns: list[ChatTurn], key: str = "data.example_turns") -> None:
    """Worked examples alternate user and assistant turns, from a user turn to an assistant turn."""
    for i, turn in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if turn.role != expected:
            raise ValueError(
                f"{key}[{i}] has role {turn.role!r} where {expected!r} is expected: worked examples "
                "alternate user and assistant turns, starting with a user turn"
            )
    if turns and turns[-1].role != "assistant":
        raise ValueError(
            f"{key} ends with a user turn: end each worked example with the assistant's answer "
            "(the task's own user message follows the examples)"
        )


class PromptsConfig(SplitsConfig):
    """A `data` section of tasks shown as chat prompts (the RL configs', eval's): the user message's
    template, the system prompt and the worked examples before each task. `TASKS` names the
    section's split of tasks."""

    TASKS: ClassVar[str] = "train"

    prompt_template: str = Field(
        "{problem}", description="Formats the user message; `{problem}` is replaced."
    )
    system_prompt: str | None = "Put the final answer in \\boxed{}."
    example_turns: list[ChatTurn] = Field(
        default_factory=lambda: [ChatTurn(role=r, content=c) for r, c in QUICKSTART_EXAMPLE_TURNS],
        description="Worked examples as chat turns, inserted after the system prompt and before each task's "
        "own messages, the same at training, validation and `posttrain eval`: [{role: user, content: ...}, "
        "{role: assistant, content: ...}, ...], alternating, from a user turn to an assistant turn. "
        "[]: none. Default: one worked 1-digit sum (4 + 3, not a problem of the quickstart's validation "
        "set), dropped when the data names a task of its own (a `path`, `environment_tasks` or another "
        "`reasoning_gym.task`) and this key is not set. Tasks that an environment generates "
        "(`environment_tasks`) start from the environment's reset, which these turns do not reach.",
    )

    @model_validator(mode="after")
    def _examples(self) -> PromptsConfig:
        check_example_turns(self.example_turns)
        if self.example_turns and getattr(self, self.TASKS).environment_tasks is not None:
            raise ValueError(
                f"data.example_turns is set but data.{self.TASKS} uses environment_tasks, whose episodes "
                "start from the environment's reset (the turns would never be shown); set data.example_turns=[] "
                "and give the environment its own examples where it takes them (e.g. environment.kwargs.examples)"
            )
        return self


# --------------------------------------------------------------------------------- infra
class ClusterConfig(Strict):
    """Where workers run. `ray` starts a local cluster unless RAY_ADDRESS is set; `local` runs in-process."""

    backend: Literal["ray", "local"] = "ray"
    num_nodes: int = Field(1, gt=0)
    gpus_per_node: int = Field(0, ge=0, description="0 trains on CPU.")
    num_workers: int | None = Field(
        None, gt=0, description="Data-parallel policy workers; default: one per GPU, or 1 on CPU."
    )
    cpus_per_worker: int | None = Field(
        None,
        gt=0,
        description="CPU cores (and torch threads) per worker; default: on CPU, this machine's cores "
        "shared over the workers; with GPUs, 1.",
    )

    def policy_workers(self) -> int:
        if self.num_workers is not None:
            return self.num_workers
        return max(1, self.num_nodes * self.gpus_per_node)

    def worker_cpus(self) -> int:
        if self.cpus_per_worker is not None:
            return self.cpus_per_worker
        if self.gpus_per_node > 0:
            return 1
        return max(1, (os.cpu_count() or 1) // self.policy_workers())


class CheckpointConfig(Strict):
    """When checkpoints are written and which survive: the last `keep_last` plus the best `keep_best`."""

    enabled: bool = True
    save_every: int = Field(50, gt=0, description="Save every N steps (and always at the end).")
    keep_last: int = Field(2, gt=0)
    resume: str = Field(
        "auto", description="`auto`: latest in the run directory; `none`: start fresh; or a checkpoint path."
    )
    keep_best: int = Field(
        0, ge=0, description="Also keep the K checkpoints with the best `metric` (0: only keep_last)."
    )
    metric: str = Field(
        "val/loss",
        description="The logged metric that ranks checkpoints for keep_best; a checkpoint is scored by "
        "its latest value at or before the checkpoint's step.",
    )
    mode: Literal["max", "min"] = Field("min", description="Whether a higher or a lower `metric` is better.")
    deadline_s: float | None = Field(
        None,
        gt=0,
        description="Wall-clock budget of one invocation in seconds: when the next step and a save would "
        "not fit inside it, save a checkpoint and stop cleanly (resume with the same command).",
    )


class WandbConfig(Strict):
    """Weights & Biases (`pip install posttrain[wandb]`); files go under <run_dir>/wandb."""

    enabled: bool = False
    project: str = "posttrain"
    entity: str | None = None
    name: str | None = Field(None, description="Run name; default: the run directory's name.")
    mode: Literal["online", "offline"] | None = Field(
        None, description="null: W&B's own choice (the WANDB_MODE variable, else online)."
    )
    tags: list[str] = Field(default_factory=list)


class MlflowConfig(Strict):
    """MLflow (`pip install posttrain[mlflow]`)."""

    enabled: bool = False
    tracking_uri: str | None = Field(
        None, description="Default: a local file store, file:<run_dir>/mlruns; or an http(s) server."
    )
    experiment: str = "posttrain"
    run_name: str | None = Field(None, description="Default: the run directory's name.")


class LoggingConfig(Strict):
    run_dir: str | None = Field(None, description="Default: runs/<algorithm>.")
    log_every: int = Field(1, gt=0)
    jsonl: bool = True
    tensorboard: bool = True
    progress: bool = True
    wandb: WandbConfig = WandbConfig()
    mlflow: MlflowConfig = MlflowConfig()
    system_metrics: bool = Field(
        True, description="Sample CPU (and, with CUDA, GPU) memory and utilisation into each step's metrics."
    )
    plots: bool = Field(
        True, description="Write PNG plots of the main curves into <run_dir>/plots at the end."
    )


class ConfigWarning(UserWarning):
    """A configuration that runs but is probably not what was meant (a half-configured recipe)."""


def config_warning(message: str) -> None:
    warnings.warn(message, ConfigWarning, stacklevel=3)
