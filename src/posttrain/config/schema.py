"""Typed configuration models. Every default of posttrain lives in this file.

Each model forbids unknown keys, so a typo fails at load time with the key's full path and
the closest valid key (see `posttrain.config.loader`).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from posttrain.config.agent import AgentConfig


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
        "its MixedPrecisionPolicy, gradients reduced in fp32). Generators (split HF workers, vLLM with "
        "vllm.dtype=auto) hold the weights in this dtype; refits cast them. Checkpoints hold the fp32 "
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


def names_own_train_data(data: Any) -> bool:
    """Whether a user's `data` section picks training data of its own: `train.path`,
    `train.environment_tasks`, or another generated `train.reasoning_gym.task`. Changing only the
    size, seed or samples of the generated default does not count."""
    train = _given(_given(data).get("train"))
    gym = _given(train.get("reasoning_gym"))
    return any(train.get(k) is not None for k in ("path", "environment_tasks")) or "task" in gym


VALIDATION_HELP = (
    "The held-out split; null: none. Default: the quickstart's generated problems, but none when "
    "`data.train` names data of its own (a `path`, `environment_tasks` or another `reasoning_gym.task`) "
    "and this key is not set: set it to validate on your own held-out data."
)


class SplitsConfig(Strict):
    """A `data` section with `train` and `validation` splits. Naming training data of one's own
    (`names_own_train_data`) without `validation` means no validation set: the default's held-out
    problems are another task. `posttrain.config.load_config` applies the same rule to recipes."""

    @model_validator(mode="before")
    @classmethod
    def _no_foreign_validation(cls, data: Any) -> Any:
        if isinstance(data, dict) and "validation" not in data and names_own_train_data(data):
            return {**data, "validation": None}
        return data


def _default_sft_train() -> DatasetConfig:
    return DatasetConfig(reasoning_gym=ReasoningGymConfig(size=2000, seed=1, kwargs=_ARITH_KWARGS))


def _default_sft_validation() -> DatasetConfig:
    return DatasetConfig(reasoning_gym=ReasoningGymConfig(size=64, seed=1_000_001, kwargs=_ARITH_KWARGS))


_ARITH_KWARGS: dict = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 2,
    "operators": ["+", "-"],
}


class SFTDataConfig(SplitsConfig):
    train: DatasetConfig = Field(default_factory=_default_sft_train)
    validation: DatasetConfig | None = Field(
        default_factory=_default_sft_validation, description=VALIDATION_HELP
    )
    overlong: Literal["truncate", "drop"] = Field(
        "truncate", description="What to do with sequences longer than policy.max_seq_len."
    )


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


class SFTTrainerConfig(Strict):
    max_steps: int | None = Field(60, gt=0, description="Stop after this many optimizer steps.")
    num_epochs: int = Field(1, gt=0)
    global_batch_size: int = Field(8, gt=0, description="Sequences per optimizer step, over all workers.")
    val_every: int = Field(20, gt=0)
    val_at_start: bool = True
    val_batches: int | None = Field(None, gt=0, description="Cap on validation batches; null: whole set.")
    seed: int = 0


class SFTConfig(Strict):
    """`posttrain sft`."""

    policy: PolicyConfig = PolicyConfig(
        optimizer=OptimizerConfig(lr=5e-5), scheduler=SchedulerConfig(warmup_steps=5), max_seq_len=256
    )
    data: SFTDataConfig = SFTDataConfig()
    sft: SFTTrainerConfig = SFTTrainerConfig()
    cluster: ClusterConfig = ClusterConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(save_every=20)
    logging: LoggingConfig = LoggingConfig()


# --------------------------------------------------------------------------------- GRPO
_GRPO_ARITH_KWARGS: dict = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+"],
    "allow_parentheses": False,
    "allow_negation": False,
}


def _default_grpo_train() -> DatasetConfig:
    return DatasetConfig(reasoning_gym=ReasoningGymConfig(size=5000, seed=11, kwargs=_GRPO_ARITH_KWARGS))


def _default_grpo_validation() -> DatasetConfig:
    return DatasetConfig(reasoning_gym=ReasoningGymConfig(size=64, seed=99_999, kwargs=_GRPO_ARITH_KWARGS))


class GRPODataConfig(SplitsConfig):
    train: DatasetConfig = Field(default_factory=_default_grpo_train)
    validation: DatasetConfig | None = Field(
        default_factory=_default_grpo_validation, description=VALIDATION_HELP
    )
    prompt_template: str = Field(
        "{problem}", description="Formats the user message; `{problem}` is replaced."
    )
    system_prompt: str | None = "Put the final answer in \\boxed{}."


class VLLMConfig(Strict):
    """Settings of the vLLM backend (generation.backend=vllm)."""

    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="GPU: share of memory for vLLM.")
    cpu_kv_cache_gib: int = Field(1, gt=0, description="CPU: KV cache GiB (VLLM_CPU_KVCACHE_SPACE).")
    enforce_eager: bool = Field(
        True,
        description="true: the model runs eagerly, the engine starts sooner. false: vLLM compiles it (GPU: "
        "torch.compile and CUDA graphs; CPU: torch.compile with inductor, which needs a C++ compiler). "
        "Measured on a 2-core CPU, SmolLM2-135M bf16 (benchmarks/vllm_refit_generation.py): decoding "
        "2.10-2.37x transformers' generate against 1.78-1.80x eager; engine start 56-68 s against 12-13 s, "
        "at every start (vllm-cpu 0.32 cannot reload its compiled artifact). Refits write into "
        "the parameters the compiled graph reads (tested).",
    )
    prefix_caching: bool = Field(True, description="Prefill a prompt once for its G samples.")
    max_num_seqs: int = Field(256, gt=0, description="Sequences decoded together.")
    sleep: bool = Field(False, description="GPU: release vLLM's memory while the policy trains.")
    cpu_prepack: bool = Field(
        False,
        description="CPU: vLLM's prepacked oneDNN/AMX matmul weights, rebuilt after every refit: faster "
        "decoding (+12% fp32, +25% bf16 measured), slower refits (0.3-0.5 s for 135M parameters against "
        "0.06 s), linear weights held twice. false: F.linear on plain weights; a refit is one copy.",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="The engine's weights and compute; auto: the policy's dtype. bfloat16 under a float32 "
        "policy generates faster (GPUs; CPUs with AMX) and refits cast the weights; generation logprobs "
        "then differ more from training's (watch token_mult_prob_error; loss.importance_correction "
        "corrects for it). The checksum refit check compares the policy's weights cast to this dtype.",
    )
    lora_adapter: bool = Field(
        False,
        description="With policy.lora: the engine runs the base weights with vLLM's LoRA support and each "
        "refit sends only the adapter (A, B), served as a new vLLM LoRA adapter; false: refits send the "
        "merged weights W + s·BA. The checksum refit check then compares the adapter tensors. See docs/lora.md.",
    )


class RefitCheckConfig(Strict):
    """After every weight transfer, check that the generator runs the trained weights; fail if not.

    checksum: compare (Σw, Σw²) of the policy and the engine (cheap; catches a skipped or partial
    refit). logprobs: sample a small probe batch with the generator and compare its logprobs to
    the policy's on the same tokens (token_mult_prob_error; catches anything that changes outputs).
    """

    mode: Literal["off", "checksum", "logprobs"] = "checksum"
    max_mult_prob_error: float = Field(1.02, ge=1, description="logprobs mode: fail above this.")
    prompts: int = Field(2, gt=0, description="logprobs mode: probe prompts.")
    new_tokens: int = Field(8, gt=0, description="logprobs mode: tokens sampled per probe prompt.")
    relative_tolerance: float = Field(1e-9, gt=0, description="checksum mode.")


VLLM_MAX_LORA_RANK = 512
"""The largest `max_lora_rank` vLLM accepts."""

RefitTransport = Literal["shared_memory", "object_store", "collective"]


class GenerationConfig(Strict):
    """How rollouts are sampled. Generation logprobs are of softmax(logits / temperature), the
    distribution the policy trains (temperature 1 when greedy)."""

    backend: Literal["hf", "vllm"] = "hf"
    placement: Literal["colocated", "split"] = Field(
        "colocated",
        description="colocated: generate with the training weights in the policy workers; split: "
        "separate generation workers that receive new weights after each update.",
    )
    num_workers: int = Field(1, gt=0, description="Generation workers (split placement).")
    cpus_per_worker: int = Field(1, gt=0, description="CPU cores per generation worker (split placement).")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(None, gt=0)
    max_new_tokens: int = Field(32, gt=0)
    max_episode_tokens: int | None = Field(
        None,
        gt=0,
        description="The episode token budget: generated tokens one episode may have over all its turns "
        "(an episode that reaches it ends, truncated). It is the L_max of DAPO's soft overlong penalty "
        "and of Dr.GRPO's normaliser (loss.aggregation=seq_mean_token_sum). null: environment.max_turns "
        "× max_new_tokens (one turn: max_new_tokens). Must lie between max_new_tokens and that product, "
        "and hold dapo.overlong_buffer.",
    )
    stop_strings: list[str] = Field(default_factory=list)
    batch_size: int = Field(64, gt=0, description="Prompts per generate call.")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    refit_check: RefitCheckConfig = Field(default_factory=RefitCheckConfig)
    refit_transport: Literal["auto", "shared_memory", "object_store", "collective"] = Field(
        "auto",
        description="Split placement: how new weights reach the generation workers. shared_memory: they "
        "map the policy's weights, kept in /dev/shm (one CPU machine); object_store: policy rank 0 packs "
        "them into buckets that travel through the Ray object store (any nodes; via host memory); "
        "collective: policy rank 0 broadcasts the buckets over a process group of its own with the "
        "workers (NCCL on GPU, gloo on CPU). auto: shared_memory on one CPU machine, collective with "
        "GPUs on Ray, object_store otherwise (CPU across machines, or GPUs with cluster.backend=local).",
    )

    def resolved_refit_transport(self, cluster: ClusterConfig, sharded: bool = False) -> RefitTransport:
        """The transport `auto` stands for on this cluster (an explicit choice is returned as is).
        `sharded`: no process holds the generator's weights as plain parameters (FSDP2 or LoRA, see
        `PolicyConfig.split_weights`)."""
        if self.refit_transport != "auto":
            return self.refit_transport
        if cluster.gpus_per_node == 0 and cluster.num_nodes == 1 and not sharded:
            return "shared_memory"
        if (cluster.gpus_per_node > 0 or sharded) and cluster.backend == "ray":
            return "collective"
        return "object_store"

    def check_lora_adapter(self, lora: LoraConfig | None) -> None:
        """Raise ValueError when `vllm.lora_adapter` cannot work: it serves the policy's LoRA adapter
        with vLLM's LoRA support (ranks up to 512; dropout and init only matter in training)."""
        if not self.vllm.lora_adapter:
            return
        if self.backend != "vllm":
            raise ValueError(
                "generation.vllm.lora_adapter=true serves the adapter with vLLM's LoRA support, but "
                f"generation.backend={self.backend}; set generation.backend=vllm or lora_adapter=false"
            )
        if lora is None:
            raise ValueError(
                "generation.vllm.lora_adapter=true serves the policy's LoRA adapter, but policy.lora is not "
                "set; set policy.lora (e.g. policy.lora.rank=16) or generation.vllm.lora_adapter=false"
            )
        if lora.rank > VLLM_MAX_LORA_RANK:
            raise ValueError(
                f"generation.vllm.lora_adapter=true: vLLM serves LoRA ranks up to {VLLM_MAX_LORA_RANK}, "
                f"policy.lora.rank={lora.rank}; lower the rank or set generation.vllm.lora_adapter=false "
                "(merged-weight refits)"
            )

    def check_refit_transport(self, cluster: ClusterConfig, sharded: bool = False) -> None:
        """Raise ValueError when split placement's refit transport cannot work on `cluster`."""
        transport = self.resolved_refit_transport(cluster, sharded)
        if transport == "shared_memory" and sharded:
            raise ValueError(
                "generation.refit_transport=shared_memory cannot serve an FSDP2-sharded policy "
                "(policy.fsdp=true) or a LoRA policy (policy.lora): no process holds the generator's "
                "weights as plain parameters. Use refit_transport=auto"
            )
        if transport == "shared_memory" and (cluster.gpus_per_node > 0 or cluster.num_nodes > 1):
            raise ValueError(
                "generation.refit_transport=shared_memory needs one CPU machine (cluster.num_nodes=1, "
                f"cluster.gpus_per_node=0; got {cluster.num_nodes} nodes, {cluster.gpus_per_node} GPUs "
                "per node): the weights are shared through /dev/shm. Use refit_transport=auto"
            )
        if transport == "collective" and cluster.backend == "local" and cluster.gpus_per_node > 0:
            raise ValueError(
                "generation.refit_transport=collective with cluster.backend=local and GPUs would put "
                "both NCCL ranks on one GPU in one process, which NCCL refuses; use cluster.backend=ray "
                "or refit_transport=object_store"
            )


def named_callables(value: Any) -> Any:
    """`value` with every function in it (inside lists, tuples and dicts) replaced by its import path
    "module:qualname"; plain data unchanged."""
    if isinstance(value, dict):
        return {k: named_callables(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [named_callables(v) for v in value]
    if callable(value):
        return (
            f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', type(value).__qualname__)}"
        )
    return value


class EnvironmentConfig(Strict):
    name: str = Field("math", description="A registered environment or `package.module:Class`.")
    kwargs: dict = Field(
        default_factory=dict,
        description="Constructor arguments; math: timeout_s, format_reward (for a boxed but wrong answer, 0.1); "
        "reward_fn: reward_fn as `module:function`.",
    )
    max_error_fraction: float | None = Field(
        0.5,
        ge=0,
        le=1,
        description="Stop the run with an error (naming the environment, showing the first error) when more "
        "than this fraction of one generation batch's samples are verifier errors (a reward function that "
        "raises, a verifier that times out); null: never.",
    )
    num_workers: int = Field(1, gt=0)
    max_turns: int = Field(1, gt=0)
    max_observation_tokens: int | None = Field(
        None,
        gt=0,
        description="A hard cap on an environment observation's content tokens (all its messages "
        "together, the cut marker included; the chat template's own tokens not counted): a longer one "
        "is cut in the middle (its start and end are kept); null: never cut. An episode that would "
        "exceed policy.max_seq_len ends, truncated, either way.",
    )
    turn_barrier: bool = Field(
        False,
        description="Multi-turn episodes: false: each episode's next turn starts as soon as its "
        "observation is ready, while the other episodes keep decoding (HF backend: a continuously "
        "batched decode; vLLM: one engine request per turn, submitted when the environment has "
        "stepped the episode); true: the turn-by-turn loop (every episode generates, then every one "
        "is stepped). An FSDP2-sharded colocated policy with the HF backend always uses the "
        "turn-by-turn loop.",
    )
    max_concurrent_steps: int = Field(
        4,
        gt=0,
        description="Without a turn barrier, environment calls run off the decoder's thread while it "
        "decodes the other episodes: at most this many calls in flight per generation worker (and "
        "at once in each Ray environment worker), for an environment that may be stepped from several "
        "threads (`concurrent_steps = True`, e.g. `latency`); any other is stepped one call at a time. "
        "Turns that end while the bound is reached wait and go together in the next call.",
    )
    agent: AgentConfig | None = Field(
        None,
        description="Agent rollouts (docs/agents.md): your agent function or program plays each episode "
        "through an OpenAI-compatible endpoint over the generator; the environment (or the agent) gives "
        "the reward. null: the environment plays the episodes in process.",
    )

    @field_serializer("kwargs", when_used="json")
    def _callables_by_name(self, kwargs: dict) -> dict:
        """config.yaml and loggers record a Python callable (the Python API's reward functions) by its
        import path, "module:qualname"."""
        return named_callables(kwargs)

    @model_validator(mode="after")
    def _resolves(self) -> EnvironmentConfig:
        """The name (or import path) is an environment class, the kwargs fit its constructor and its
        function arguments given as `module:function` import (`check_environment`)."""
        if self.model_fields_set & {"name", "kwargs"}:
            import posttrain.environments  # noqa: F401  (registers the built-in environments)
            from posttrain.environments.interface import check_environment

            check_environment(self.name, self.kwargs)
        return self

    @model_validator(mode="after")
    def _turn_limits_agree(self) -> EnvironmentConfig:
        """An episode the environment allows n turns needs max_turns >= n: the rollout would otherwise
        end it first and the environment's last turn (its shaped reward, its last try) is never paid."""
        limit = environment_turn_limit(self.name, self.kwargs) if self.model_fields_set else None
        if limit is not None and limit[1] > self.max_turns:
            key, value = limit
            raise ValueError(
                f"environment.kwargs.{key}={value} is above environment.max_turns={self.max_turns}: the "
                f"rollout would end an episode after {self.max_turns} turns, before the {self.name} "
                f"environment has scored its last allowed turn (the sliding puzzle's shaped reward, "
                f"reasoning-gym's last try would never be paid). Set environment.max_turns={value}, "
                f"or environment.kwargs.{key}={self.max_turns}"
            )
        return self


def environment_turn_limit(name: str, kwargs: dict[str, Any]) -> tuple[str, int] | None:
    """The constructor argument that bounds an episode's turns of the registered environment `name`,
    and its value (`posttrain.environments.interface.episode_turn_limit`); None for an environment
    without one, or a name that is not registered (an import path is not imported here)."""
    import posttrain.environments  # noqa: F401  (registers the built-in environments)
    from posttrain.environments.interface import ENVIRONMENTS, episode_turn_limit

    cls = ENVIRONMENTS.get(name)
    return None if cls is None else episode_turn_limit(cls, kwargs)


class ConfigWarning(UserWarning):
    """A configuration that runs but is probably not what was meant (a half-configured recipe)."""


def config_warning(message: str) -> None:
    warnings.warn(message, ConfigWarning, stacklevel=3)


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
    importance_correction: Literal["plain", "truncated", "icepop", "seq_mask"] | None = Field(
        None,
        description="Weight the policy-gradient term by π_old / π_gen (inference-engine mismatch). "
        "truncated: clamp to [importance_min, importance_cap]; icepop: tokens outside the bounds get 0; "
        "seq_mask: sequences whose geometric-mean ratio is outside the bounds get 0.",
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
        False,
        description="NeMo RL: adv_estimator.minus_baseline (its default there: true). reinforce_pp: "
        "subtract each prompt's group mean before the batch normalisation (REINFORCE++-baseline, for "
        "G > 1 samples per prompt); false: the batch mean only (plain REINFORCE++).",
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
        if self.minus_baseline and self.estimator != "reinforce_pp":
            config_warning(
                f"advantage.minus_baseline applies to estimator=reinforce_pp; {self.estimator} ignores it"
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


class GRPOTrainerConfig(Strict):
    max_steps: int = Field(40, gt=0)
    prompts_per_step: int = Field(8, gt=0)
    generations_per_prompt: int = Field(4, gt=1, description="G, the group size.")
    updates_per_batch: int = Field(
        1, gt=0, description="Optimizer steps per rollout batch (1 = exactly on-policy)."
    )
    val_every: int = Field(10, gt=0)
    val_at_start: bool = True
    val_samples_per_prompt: int = Field(1, gt=0, description="n for pass@k on validation.")
    val_temperature: float = Field(0.0, ge=0, description="0 = greedy.")
    seed: int = 0
    async_mode: bool = Field(
        False,
        description="Asynchronous GRPO (docs/async.md): generation workers keep producing rollout groups "
        "with the newest weights they have while the policy trains; needs generation.placement=split. "
        "Stale data gets π_old recomputed and the behaviour-vs-π_old importance weight "
        "(loss.importance_correction, truncated unless set).",
    )
    max_trajectory_age_steps: int = Field(
        1,
        ge=0,
        description="Async: the most policy updates a trajectory's generating weights may lag the trainer; "
        "older groups are dropped (async/dropped_stale). 0: exactly on-policy (same steps as sync).",
    )
    async_buffer_groups: int | None = Field(
        None,
        gt=0,
        description="Async: replay buffer capacity in groups; null: prompts_per_step × (max_trajectory_age_steps + 1).",
    )
    partial_rollouts: bool = Field(
        False,
        description="Async: a generation may pick up newer weights between tokens (the HF sampler "
        "loads a newer published snapshot between decode steps and recomputes its KV cache). Each token "
        "keeps the logprob and version it was sampled with; a trajectory's age counts from its oldest "
        "token. Needs async_mode, generation.backend=hf and the shared_memory refit transport.",
    )
    async_watchdog_s: float = Field(
        600.0,
        gt=0,
        description="Async: stop the run with an error when no rollout batch arrives for this long while the "
        "trainer waits (a hung generation worker or environment).",
    )


# The RL trainers' (grpo, ppo, distill) defaults for the policy and checkpoints: the quickstart's.
RL_POLICY = PolicyConfig(
    optimizer=OptimizerConfig(lr=2e-5, max_grad_norm=1.0),
    scheduler=SchedulerConfig(name="constant", warmup_steps=0),
    max_seq_len=128,
    train_micro_batch_size=8,
    logprob_batch_size=16,
)
RL_CHECKPOINT = CheckpointConfig(save_every=10, metric="val/accuracy", mode="max")


# ----------------------------------------------------------------- the RL configs' shared checks
def episode_token_budget(generation: GenerationConfig, environment: EnvironmentConfig) -> int:
    """The most generated tokens of one episode: generation.max_episode_tokens, else
    environment.max_turns × generation.max_new_tokens (what max_turns full turns generate)."""
    if generation.max_episode_tokens is not None:
        return generation.max_episode_tokens
    return environment.max_turns * generation.max_new_tokens


def check_episode_budget(cfg: Any) -> None:
    """Raise ValueError where the episode token budget disagrees with the limits it derives from:
    an explicit budget below one turn (max_new_tokens) or above what max_turns turns can generate,
    or a DAPO overlong buffer (the budget's last N tokens) longer than the budget."""
    g, turns = cfg.generation, cfg.environment.max_turns
    budget, most = episode_token_budget(g, cfg.environment), turns * g.max_new_tokens
    if g.max_episode_tokens is not None and not g.max_new_tokens <= budget <= most:
        raise ValueError(
            f"generation.max_episode_tokens={budget} must lie between one turn (generation.max_new_tokens="
            f"{g.max_new_tokens}) and what environment.max_turns={turns} turns generate ({most}): below, no "
            "turn could use max_new_tokens; above, no episode reaches it. Set it in that range, or null "
            f"for {most}"
        )
    buffer = getattr(getattr(cfg, "dapo", None), "overlong_buffer", None)
    if buffer is not None and buffer > budget:
        raise ValueError(
            f"dapo.overlong_buffer={buffer} is longer than the episode token budget {budget} (generation."
            f"max_episode_tokens, else environment.max_turns × generation.max_new_tokens): the soft overlong "
            "penalty runs over the budget's last overlong_buffer tokens. Lower dapo.overlong_buffer or "
            "raise the budget"
        )


def check_rl_config(cfg: Any, loop: str) -> None:
    """The checks every RL config (GRPOConfig, PPOConfig, DistillConfig) runs, in one place so that
    they cannot drift apart. `loop`: the name of its loop section (grpo, ppo, distill); `cfg.grpo` is
    that section under the name the shared trainer reads. Raises ValueError; warns with ConfigWarning."""
    cfg.generation.check_lora_adapter(cfg.policy.lora)
    if cfg.generation.placement == "split":
        cfg.generation.check_refit_transport(cfg.cluster, sharded=cfg.policy.split_weights)
    check_minibatches(loop, cfg.grpo, cfg.cluster.policy_workers(), "policy")
    check_episode_budget(cfg)
    teacher = getattr(cfg, "teacher", None)
    if teacher is not None and cfg.cluster.backend == "local" and teacher.num_workers > 1:
        raise ValueError(
            f"teacher.num_workers={teacher.num_workers} with cluster.backend=local: the local backend "
            "runs one in-process worker per group; set teacher.num_workers=1 or cluster.backend=ray"
        )
    loss = getattr(cfg, "loss", None)
    if loss is not None:
        check_truncated_sampling(cfg, loop)
        if loss.importance_correction is not None and cfg.generation.backend == "hf":
            if cfg.generation.placement == "colocated":
                config_warning(
                    f"loss.importance_correction={loss.importance_correction} corrects for an inference "
                    "engine that differs from the trainer, but generation.backend=hf colocated samples with "
                    "the trainer's own model and weights (ratio 1 up to rounding): it has no effect here"
                )


def check_minibatches(loop: str, section: Any, workers: int, role: str) -> None:
    """Each of the `updates_per_batch` minibatches must split evenly over `workers` data-parallel ranks.

    The batch (prompts_per_step × generations_per_prompt sequences) is cut into `updates_per_batch`
    contiguous minibatches whose sizes differ by at most one, and every minibatch into equal shards,
    one per rank (FSDP2 ranks run collectives in every forward, so they must take the same
    microbatches). With several workers the batch must therefore be a multiple of updates_per_batch ×
    workers; one worker takes any updates_per_batch up to the batch size. Otherwise the run would
    fail at its first update."""
    updates, batch = section.updates_per_batch, section.prompts_per_step * section.generations_per_prompt
    if batch % (updates * workers) == 0 or (workers == 1 and updates <= batch):
        return
    fits = [u for u in range(1, batch + 1) if batch % (u * workers) == 0]
    if workers == 1:
        hint = f"Set {loop}.updates_per_batch to at most {batch}"
    elif fits:
        hint = f"Set {loop}.updates_per_batch to one of {fits}"
    else:
        hint = f"Make {loop}.prompts_per_step × {loop}.generations_per_prompt a multiple of the {workers} workers"
    raise ValueError(
        f"{loop}.updates_per_batch={updates} does not split the rollout batch of {batch} sequences "
        f"({loop}.prompts_per_step={section.prompts_per_step} × {loop}.generations_per_prompt="
        f"{section.generations_per_prompt}) into minibatches that divide evenly over the {workers} {role} "
        f"worker(s): with several workers the batch must be a multiple of updates_per_batch × workers. "
        f"{hint}, or change {loop}.prompts_per_step or the number of workers"
    )


def generation_logprob_uses(cfg: Any, loop: str) -> list[str]:
    """What feeds the generator's logprobs into the loss or the advantages (not only into metrics)."""
    loss, section = cfg.loss, cfg.grpo
    uses = []
    if loss.importance_correction is not None:
        uses.append(f"loss.importance_correction={loss.importance_correction} weights by π_old / π_gen")
    if getattr(section, "async_mode", False):
        uses.append(f"{loop}.async_mode=true corrects stale data with the behaviour logprobs")
    if loss.kl_in_reward and loss.kl_beta > 0 and section.updates_per_batch == 1:
        uses.append(f"loss.kl_in_reward with {loop}.updates_per_batch=1 takes π_old from the generator")
    estimator = getattr(cfg.advantage, "estimator", None)
    if estimator == "on_policy_distill" and section.updates_per_batch == 1:
        uses.append(
            f"advantage.estimator=on_policy_distill with {loop}.updates_per_batch=1 takes the student's "
            "logprobs from the generator"
        )
    return uses


def check_truncated_sampling(cfg: Any, loop: str) -> None:
    """vLLM with top_p < 1 or top_k reports the logprobs of the truncated distribution it samples
    from (`processed_logprobs`); the trainer computes the full softmax (posttrain's HF sampler reports
    that one). Refused where the generator's logprobs enter the loss or the advantages (the ratios
    would be biased by the truncation); else a warning that the engine-mismatch metrics include it."""
    g = cfg.generation
    if g.backend != "vllm" or g.temperature == 0 or (g.top_p >= 1.0 and g.top_k is None):
        return
    knobs = f"generation.top_p={g.top_p}, generation.top_k={g.top_k}"
    if uses := generation_logprob_uses(cfg, loop):
        raise ValueError(
            f"generation.backend=vllm with {knobs}: vLLM's logprobs are of the truncated distribution it "
            f"samples from, while training computes the full softmax, so log π_gen is too high on every "
            f"token and the ratios against it are biased; but {'; '.join(uses)}. Set generation.top_p=1 "
            "and generation.top_k=null, or use generation.backend=hf (its logprobs are of the full "
            "softmax), or turn those off"
        )
    config_warning(
        f"generation.backend=vllm with {knobs}: vLLM's logprobs are of the truncated distribution, so "
        "token_mult_prob_error, gen_kl and entropy include the truncation, not only the engine mismatch"
    )


class RLChecks(Strict):
    """Base of the RL configs: runs `check_rl_config` (the one shared set) before each config's own
    validators. `LOOP` names the config's loop section."""

    LOOP: ClassVar[str] = "grpo"

    @model_validator(mode="after")
    def _rl_checks(self) -> RLChecks:
        check_rl_config(self, self.LOOP)
        return self


class GRPOConfig(RLChecks):
    """`posttrain grpo`."""

    policy: PolicyConfig = RL_POLICY
    data: GRPODataConfig = GRPODataConfig()
    generation: GenerationConfig = GenerationConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    loss: LossConfig = LossConfig()
    dapo: DAPOConfig = DAPOConfig()
    grpo: GRPOTrainerConfig = GRPOTrainerConfig()
    teacher: TeacherConfig | None = Field(
        None,
        description="The teacher of advantage.estimator=on_policy_distill (required by it, else unused).",
    )
    cluster: ClusterConfig = ClusterConfig()
    checkpoint: CheckpointConfig = RL_CHECKPOINT
    logging: LoggingConfig = LoggingConfig()

    @model_validator(mode="after")
    def _algorithm_combinations(self) -> GRPOConfig:
        """Warn about half-configured recipes whose sections disagree (see docs/algorithms.md)."""
        estimator, aggregation = self.advantage.estimator, self.loss.aggregation
        if estimator == "dr_grpo" and aggregation != "seq_mean_token_sum":
            config_warning(
                f"advantage.estimator=dr_grpo with loss.aggregation={aggregation}: Dr.GRPO removes both the "
                "std and the per-sequence length normalisation; set loss.aggregation=seq_mean_token_sum"
            )
        return self

    @model_validator(mode="after")
    def _gdpo_takes_the_components_as_given(self) -> GRPOConfig:
        """gdpo normalises the environment's reward components; shaping that moves the scalar reward
        (scaling, truncation and overlong penalties, the KL in the reward) would not reach them."""
        if self.advantage.estimator != "gdpo":
            return self
        shaping = {
            "advantage.reward_scaling.enabled": self.advantage.reward_scaling.enabled,
            "dapo.stop_properly_penalty_coef": self.dapo.stop_properly_penalty_coef is not None,
            "dapo.overlong_buffer": self.dapo.overlong_buffer is not None,
            "loss.kl_in_reward": self.loss.kl_in_reward,
        }
        used = [key for key, on in shaping.items() if on]
        if used:
            raise ValueError(
                f"advantage.estimator=gdpo normalises the environment's reward components as they come; "
                f"{', '.join(used)} shape(s) the scalar reward only and would be ignored: turn it off, "
                "or use estimator=grpo"
            )
        return self

    @model_validator(mode="after")
    def _teacher_for_distill_advantage(self) -> GRPOConfig:
        distill = self.advantage.estimator == "on_policy_distill"
        has_teacher = self.teacher is not None and self.teacher.model_name is not None
        if distill and not has_teacher:
            raise ValueError(
                "advantage.estimator=on_policy_distill needs a teacher: set teacher.model_name (a posttrain "
                "run directory, checkpoint or HF folder with the policy's tokenizer)"
            )
        if self.teacher is not None and not distill:
            raise ValueError(
                "the teacher section is used only by advantage.estimator=on_policy_distill; set that "
                "estimator or remove the teacher"
            )
        return self

    @model_validator(mode="after")
    def _async_mode(self) -> GRPOConfig:
        """Asynchronous GRPO needs generation workers of its own, a snapshot-capable refit and whole
        batches; its importance correction defaults to truncated IS."""
        g = self.grpo
        self._check_partial_rollouts()
        if not g.async_mode:
            return self
        if self.generation.placement != "split":
            raise ValueError(
                "grpo.async_mode=true generates while the policy trains, so generation needs workers of "
                "its own: set generation.placement=split"
            )
        transport = self.generation.resolved_refit_transport(self.cluster, self.policy.split_weights)
        if transport == "collective":
            raise ValueError(
                "grpo.async_mode=true loads weight snapshots between generation batches; the collective "
                "transport needs both sides at once. Set generation.refit_transport=object_store "
                "(or shared_memory on one CPU machine)"
            )
        if self.dapo.dynamic_sampling:
            raise ValueError(
                "grpo.async_mode=true does not combine with dapo.dynamic_sampling yet: set one of them to false"
            )
        if g.async_buffer_groups is not None and g.async_buffer_groups < g.prompts_per_step:
            raise ValueError(
                f"grpo.async_buffer_groups={g.async_buffer_groups} cannot hold one step's "
                f"{g.prompts_per_step} groups (grpo.prompts_per_step); raise it or leave it null"
            )
        if "importance_correction" not in self.loss.model_fields_set:
            self.loss.importance_correction = "truncated"
        return self

    def _check_partial_rollouts(self) -> None:
        """grpo.partial_rollouts: async mode, posttrain's HF sampler, shared-memory snapshots (whose
        version word a worker polls between decode steps), turn-by-turn multi-turn episodes."""
        if not self.grpo.partial_rollouts:
            return
        if not self.grpo.async_mode:
            raise ValueError(
                "grpo.partial_rollouts=true updates a generation's weights while the policy trains: it "
                "needs grpo.async_mode=true"
            )
        if self.generation.backend != "hf":
            raise ValueError(
                f"grpo.partial_rollouts=true is implemented in posttrain's HF sampler, not in "
                f"generation.backend={self.generation.backend}: set generation.backend=hf"
            )
        transport = self.generation.resolved_refit_transport(self.cluster, self.policy.split_weights)
        if transport != "shared_memory":
            raise ValueError(
                f"grpo.partial_rollouts=true polls the policy's shared-memory snapshot between decode steps; "
                f"the refit transport here is {transport}: set generation.refit_transport=shared_memory "
                "(one CPU machine)"
            )
        if self.environment.max_turns > 1 and not self.environment.turn_barrier:
            raise ValueError(
                "grpo.partial_rollouts=true is not implemented in the continuous multi-turn decoder: set "
                "environment.turn_barrier=true"
            )


ALGORITHM_CONFIGS: dict[str, type[Strict]] = {"sft": SFTConfig, "grpo": GRPOConfig}


# --------------------------------------------------------------------------------- eval
class EvalDataConfig(Strict):
    dataset: DatasetConfig = Field(
        default_factory=_default_grpo_validation,
        description="Default: the GRPO quickstart's held-out problems.",
    )
    prompt_template: str = Field(
        "{problem}", description="Formats the user message; `{problem}` is replaced."
    )
    system_prompt: str | None = "Put the final answer in \\boxed{}."
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
    dtype: Literal["float32", "bfloat16"] = "float32"
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


ALGORITHM_CONFIGS["eval"] = EvalConfig


# --------------------------------------------------------------------------------- preferences (DPO, RM)
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


_PREF_ARITH_KWARGS: dict = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 2,
    "operators": ["+", "-"],
}


_PREF_SYSTEM_PROMPT = (
    "Put the final answer in \\boxed{}."  # the GRPO quickstart's, so an RM fits its rollouts
)


def _default_pref_train() -> PreferenceDatasetConfig:
    gym = GeneratedPairsConfig(
        size=2000, seed=21, kwargs=_PREF_ARITH_KWARGS, system_prompt=_PREF_SYSTEM_PROMPT
    )
    return PreferenceDatasetConfig(reasoning_gym=gym)


def _default_pref_validation() -> PreferenceDatasetConfig:
    gym = GeneratedPairsConfig(
        size=128, seed=2_000_021, kwargs=_PREF_ARITH_KWARGS, system_prompt=_PREF_SYSTEM_PROMPT
    )
    return PreferenceDatasetConfig(reasoning_gym=gym)


class PreferenceDataConfig(SplitsConfig):
    train: PreferenceDatasetConfig = Field(default_factory=_default_pref_train)
    validation: PreferenceDatasetConfig | None = Field(
        default_factory=_default_pref_validation, description=VALIDATION_HELP
    )
    overlong: Literal["truncate", "drop"] = Field(
        "truncate",
        description="Pairs with a sequence longer than policy.max_seq_len: cut both at max_seq_len, or drop "
        "the pair. A pair whose response would be empty after the cut is always dropped.",
    )


class PreferenceTrainerConfig(Strict):
    """Loop settings shared by DPO and RM. Batch sizes count PAIRS (each pair is two sequences)."""

    max_steps: int | None = Field(40, gt=0, description="Stop after this many optimizer steps.")
    num_epochs: int = Field(1, gt=0)
    global_batch_size: int = Field(8, gt=0, description="Pairs per optimizer step, over all workers.")
    val_every: int = Field(20, gt=0)
    val_at_start: bool = True
    val_batches: int | None = Field(None, gt=0, description="Cap on validation batches; null: whole set.")
    seed: int = 0


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


class DPOConfig(Strict):
    """`posttrain dpo`. The reference policy is a frozen copy of the initial `policy.model_name`."""

    policy: PolicyConfig = PolicyConfig(
        optimizer=OptimizerConfig(lr=5e-6),
        scheduler=SchedulerConfig(name="constant", warmup_steps=0),
        max_seq_len=256,
        train_micro_batch_size=8,
        logprob_batch_size=16,
    )
    data: PreferenceDataConfig = PreferenceDataConfig()
    dpo: DPOTrainerConfig = DPOTrainerConfig()
    cluster: ClusterConfig = ClusterConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(save_every=20)
    logging: LoggingConfig = LoggingConfig()


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
    gym = {"kwargs": _GRPO_ARITH_KWARGS, "system_prompt": _PREF_SYSTEM_PROMPT}
    return PreferenceDataConfig(
        train=PreferenceDatasetConfig(reasoning_gym=GeneratedPairsConfig(size=2000, seed=21, **gym)),
        validation=PreferenceDatasetConfig(
            reasoning_gym=GeneratedPairsConfig(size=128, seed=2_000_021, **gym)
        ),
    )


class RMConfig(Strict):
    """`posttrain rm`. `policy.model_name` is the backbone; a scalar head (num_labels=1) is added."""

    policy: PolicyConfig = PolicyConfig(
        optimizer=OptimizerConfig(lr=5e-5),
        scheduler=SchedulerConfig(name="constant", warmup_steps=0),
        max_seq_len=256,
        train_micro_batch_size=8,
        logprob_batch_size=16,
    )
    data: PreferenceDataConfig = Field(default_factory=_default_rm_data)
    rm: RMTrainerConfig = RMTrainerConfig()
    cluster: ClusterConfig = ClusterConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(save_every=30)
    logging: LoggingConfig = LoggingConfig()

    @model_validator(mode="after")
    def _no_fsdp(self) -> RMConfig:
        if self.policy.fsdp:  # scores come from the decoder and the score head called apart
            raise ValueError(
                "reward-model training does not support policy.fsdp=true yet; use data parallelism"
            )
        return self


ALGORITHM_CONFIGS.update({"dpo": DPOConfig, "rm": RMConfig})


# -------------------------------------------------------------------------------- sandbox
class SandboxConfig(Strict):
    """`posttrain.sandbox`: isolated execution of untrusted (model-written) Python code.

    Each run gets a fresh `python -I -S` in new namespaces with these limits; see docs/sandbox.md.
    """

    backend: Literal["auto", "bwrap", "unshare", "none"] = Field(
        "auto",
        description="Isolation: bubblewrap, util-linux unshare, or none (rlimits only; needs "
        "allow_unsafe). auto takes the first that passes a probe run.",
    )
    allow_unsafe: bool = Field(
        False,
        description="Run code even when network or filesystem isolation is unavailable (loud warning).",
    )
    workers: int = Field(2, gt=0, description="Pre-started sandboxed interpreters (parallel runs).")
    timeout_s: float = Field(10.0, gt=0, description="Wall clock per run; the whole sandbox is killed.")
    cpu_s: int = Field(10, gt=0, description="CPU seconds per run (RLIMIT_CPU).")
    memory_mb: int = Field(1024, ge=64, description="Address space per process (RLIMIT_AS).")
    max_output_bytes: int = Field(
        65536, gt=0, description="Per stream; past it the run is killed (status output_limit)."
    )
    max_processes: int = Field(
        16, gt=0, description="Processes of the sandbox's uid (RLIMIT_NPROC); each gets memory_mb."
    )
    max_open_files: int = Field(64, ge=16, description="RLIMIT_NOFILE.")
    max_file_mb: int = Field(16, gt=0, description="Largest file the code may write (RLIMIT_FSIZE).")
    disk_mb: int = Field(64, gt=0, description="Size of the in-memory working directory and of /tmp (each).")
    seccomp: bool = Field(
        True,
        description="Install the syscall filter (keyrings, ptrace, bpf, io_uring, namespaces... get "
        "EPERM). Off only to test the other layers alone; protections() then lists it as a problem.",
    )


# --------------------------------------------------------------------------------- distillation
class TeacherConfig(Strict):
    """The teacher of `posttrain distill`: a frozen model with the student's tokenizer, in workers of
    its own (split) or inside the student's (colocated, like the reference model)."""

    model_name: str | None = Field(
        None,
        description="Required: a posttrain run directory or checkpoint (e.g. runs/grpo, the GRPO "
        "quickstart's: its latest checkpoint), an HF folder, a hub id or an alias. Its tokenizer must "
        "be the student's.",
    )
    tokenizer_name: str | None = Field(
        None, description="Default: the teacher's own (a checkpoint's, or its run's policy tokenizer)."
    )
    placement: Literal["colocated", "split"] = Field(
        "colocated",
        description="colocated: the teacher is held in every student worker, on its device (like the "
        "reference model; no resources of its own: the teacher scores while the student waits anyway). "
        "split: teacher workers of their own (Ray actors with teacher.cpus_per_worker CPUs and, with "
        "GPUs, one GPU each; one in-process worker with cluster.backend=local): a teacher too large to "
        "share the student's device. On a CPU machine leave it room: cluster.cpus_per_worker defaults "
        "to all cores.",
    )
    num_workers: int = Field(1, gt=0, description="Teacher workers (split placement).")
    cpus_per_worker: int = Field(1, gt=0, description="CPU cores per teacher worker (split placement).")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="The teacher's weights and compute.")
    batch_size: int = Field(16, gt=0, description="Sequences per teacher forward.")
    chunk_size: int = Field(
        2048, gt=0, description="Positions whose full-vocabulary logits exist at once in the teacher."
    )
    packed_sequences: bool = Field(True, description="Run the teacher's decoder on real tokens only.")


class DistillTrainerConfig(Strict):
    """The loop and the loss of on-policy distillation (see posttrain.algorithms.distillation)."""

    max_steps: int = Field(20, gt=0)
    prompts_per_step: int = Field(8, gt=0)
    generations_per_prompt: int = Field(4, gt=0, description="Student samples per prompt.")
    updates_per_batch: int = Field(
        1, gt=0, description="Optimizer steps per batch of samples (1 = exactly on-policy)."
    )
    loss: Literal["forward_kl", "reverse_kl", "mixed_kl", "jsd"] = Field(
        "mixed_kl",
        description="forward_kl: KL(teacher || student); reverse_kl: KL(student || teacher); mixed_kl: "
        "mixed_kl_weight * forward + (1 - mixed_kl_weight) * reverse (NeMo RL's default); jsd: "
        "generalised Jensen-Shannon with jsd_beta (GKD).",
    )
    topk_logits_k: int = Field(
        64, gt=0, description="Teacher tokens per position sent to the student (never the full vocabulary)."
    )
    top_k_mode: Literal["tail", "renormalized"] = Field(
        "tail",
        description="tail: the k tokens plus a bucket holding the rest of the mass, on both sides (a "
        "valid divergence, which sees the student's mass outside the teacher's top-k); renormalized: "
        "both distributions renormalised over the k tokens.",
    )
    teacher_temperature: float = Field(
        1.0, gt=0, description="The teacher's distribution is softmax(logits / teacher_temperature)."
    )
    mixed_kl_weight: float = Field(0.5, ge=0, le=1, description="mixed_kl: the weight of the forward KL.")
    jsd_beta: float = Field(0.5, gt=0, lt=1, description="jsd: β, the teacher's weight in the mixture.")
    val_every: int = Field(5, gt=0)
    val_at_start: bool = True
    val_samples_per_prompt: int = Field(1, gt=0, description="n for pass@k on validation.")
    val_temperature: float = Field(0.0, ge=0, description="0 = greedy.")
    seed: int = 0


class DistillConfig(RLChecks):
    """`posttrain distill`: the student samples, the teacher scores its tokens (top-k), the student
    minimises the divergence on its own tokens. Default task: the GRPO quickstart's."""

    LOOP: ClassVar[str] = "distill"

    policy: PolicyConfig = RL_POLICY
    teacher: TeacherConfig = TeacherConfig()
    data: GRPODataConfig = GRPODataConfig()
    generation: GenerationConfig = GenerationConfig()
    environment: EnvironmentConfig = Field(
        default_factory=EnvironmentConfig,
        description="Runs the episodes (several turns, tools) and scores them for the metrics and "
        "validation; rewards do not enter the loss.",
    )
    distill: DistillTrainerConfig = DistillTrainerConfig()
    cluster: ClusterConfig = ClusterConfig()
    checkpoint: CheckpointConfig = RL_CHECKPOINT
    logging: LoggingConfig = LoggingConfig()

    @property
    def grpo(self) -> DistillTrainerConfig:
        """The loop settings under the name the shared RL phases (GRPOTrainer's) read."""
        return self.distill


ALGORITHM_CONFIGS["distill"] = DistillConfig


# --------------------------------------------------------------------------------- PPO
class CriticConfig(Strict):
    """The value model of `posttrain ppo`: a causal LM's decoder with a zero-initialised scalar head,
    trained by its own AdamW on the clipped value loss."""

    model_name: str | None = Field(
        None, description="The backbone (an alias, HF folder or hub id); null: the policy's model."
    )
    placement: Literal["colocated", "split"] = Field(
        "colocated",
        description="colocated: the critic is held in every policy worker, on its device (like the "
        "reference model; the policy and the critic never compute at the same time). split: critic "
        "workers of their own (Ray actors with critic.cpus_per_worker CPUs and, with GPUs, one GPU each; "
        "one in-process worker with cluster.backend=local). On a CPU machine leave them room: "
        "cluster.cpus_per_worker defaults to all cores.",
    )
    num_workers: int = Field(1, gt=0, description="Data-parallel critic workers (split placement).")
    cpus_per_worker: int = Field(1, gt=0, description="CPU cores per critic worker (split placement).")
    dtype: Literal["float32", "bfloat16"] | None = Field(
        None, description="Compute dtype (weights and AdamW state stay fp32); null: policy.dtype."
    )
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=5e-5, max_grad_norm=1.0),
        description="The critic's own AdamW and learning rate.",
    )
    scheduler: SchedulerConfig = Field(
        default_factory=lambda: SchedulerConfig(name="constant", warmup_steps=0)
    )
    value_loss_scale: float = Field(
        1.0,
        gt=0,
        description="NeMo RL: value_loss_fn.scale. Multiplies the value loss. The critic has its own AdamW, "
        "so the scale mostly moves the loss against critic.optimizer.max_grad_norm and Adam's eps.",
    )
    value_clip: float | None = Field(
        0.5,
        gt=0,
        description="ε of the clipped value loss: V is kept within ±ε of the values the batch was "
        "collected with (null: plain squared error).",
    )
    train_micro_batch_size: int = Field(8, gt=0, description="Sequences per forward/backward on one worker.")
    batch_size: int = Field(16, gt=0, description="Sequences per forward when computing values.")
    activation_checkpointing: bool = False

    def policy_config(self, policy: PolicyConfig) -> PolicyConfig:
        """The `PolicyConfig` the critic's workers run (sequence length, packing and seed: the policy's)."""
        return PolicyConfig(
            model_name=self.model_name or policy.model_name,
            dtype=self.dtype or policy.dtype,
            max_seq_len=policy.max_seq_len,
            train_micro_batch_size=self.train_micro_batch_size,
            logprob_batch_size=self.batch_size,
            packed_sequences=policy.packed_sequences,
            activation_checkpointing=self.activation_checkpointing,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            seed=policy.seed,
        )


class GAEConfig(Strict):
    """Per-token rewards and generalised advantage estimation (see posttrain.algorithms.gae, docs/ppo.md)."""

    estimator: Literal["gae", "raw_reward"] = Field(
        "gae",
        description="NeMo RL: ppo.adv_estimator.name. gae: the critic's GAE advantages. raw_reward: A = the "
        "episode's (shaped) reward on every assistant token, no critic and no baseline in the advantage "
        "(whitened when whiten is true; the critic still trains); a baseline-free ablation.",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount γ per assistant token.")
    lam_critic: float = Field(
        1.0, ge=0, le=1, description="GAE λ of the value targets R = A + V (1: Monte-Carlo returns)."
    )
    lam_actor: float = Field(0.95, ge=0, le=1, description="GAE λ of the policy's advantages.")
    lam_actor_alpha: float | None = Field(
        None,
        gt=0,
        description="VAPO's length-adaptive λ for the policy: λ = 1 − 1/(α·l), l the sequence's "
        "assistant tokens (clamped to [0, 1]); replaces lam_actor. VAPO: 0.05.",
    )
    whiten: bool = Field(
        True, description="Standardise the policy's advantages over the batch's assistant tokens."
    )
    clip: float | None = Field(
        None, gt=0, description="Clamp the (whitened) advantages to [-clip, clip]; null: off."
    )
    reward_scaling: RewardScalingConfig = Field(
        default_factory=RewardScalingConfig,
        description="Applied to each episode's total reward; the change lands on its last assistant token.",
    )


class PPOTrainerConfig(GRPOTrainerConfig):
    """The PPO loop: prompts and samples per step, critic warm-up, epochs and minibatches."""

    prompts_per_step: int = Field(32, gt=0)
    generations_per_prompt: int = Field(
        1, gt=0, description="Samples per prompt (the critic is the baseline: 1 is enough)."
    )
    updates_per_batch: int = Field(
        1, gt=0, description="Minibatches per PPO epoch (optimizer steps per epoch, policy and critic)."
    )
    ppo_epochs: int = Field(2, gt=0, description="Passes over each rollout batch.")
    critic_epochs: int | None = Field(
        None,
        gt=0,
        description="The critic's passes over each rollout batch (null: ppo_epochs). More than the "
        "policy's fit the values to each batch better without taking the policy further from the one "
        "that sampled it.",
    )
    critic_warmup_steps: int = Field(
        5, ge=0, description="The first N steps train only the critic (the policy stays as it is)."
    )
    critic_replay_batches: int = Field(
        0,
        ge=0,
        description="The critic also trains on the last N rollout batches (value replay: more samples "
        "per update rather than more passes over one batch). Their stored returns are the targets; the "
        "clipped loss's V_old is recomputed by the current critic. Each critic epoch then has "
        "updates_per_batch x (1 + replayed batches) minibatches, shuffled together.",
    )


class PPOConfig(RLChecks):
    """`posttrain ppo`: PPO with a learned critic and GAE, on GRPO's rollouts, environments and losses."""

    LOOP: ClassVar[str] = "ppo"

    policy: PolicyConfig = RL_POLICY
    critic: CriticConfig = CriticConfig()
    data: GRPODataConfig = GRPODataConfig()
    generation: GenerationConfig = GenerationConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    advantage: GAEConfig = GAEConfig()
    loss: LossConfig = LossConfig()
    dapo: DAPOConfig = Field(
        default_factory=DAPOConfig,
        description="overlong_filter and the soft overlong penalty apply; dynamic sampling does not.",
    )
    ppo: PPOTrainerConfig = PPOTrainerConfig()
    cluster: ClusterConfig = ClusterConfig()
    checkpoint: CheckpointConfig = RL_CHECKPOINT
    logging: LoggingConfig = LoggingConfig(run_dir="runs/ppo")

    @property
    def grpo(self) -> PPOTrainerConfig:
        """The loop settings under the name the shared RL phases (GRPOTrainer's) read."""
        return self.ppo

    @property
    def teacher(self) -> None:
        """PPO has no on-policy-distillation teacher (GRPOTrainer's setup reads this)."""
        return None

    @model_validator(mode="after")
    def _consistent(self) -> PPOConfig:
        if self.ppo.async_mode:
            raise ValueError(
                "ppo.async_mode=true: asynchronous rollouts are not supported by PPO yet (its critic's "
                "values and the policy's pi_old assume on-policy batches); set it to false"
            )
        if self.dapo.dynamic_sampling:
            raise ValueError(
                "dapo.dynamic_sampling drops groups whose rewards are all equal, which PPO's critic "
                "baseline does not need (and a group of one sample always has): set it to false"
            )
        if (
            self.critic.placement == "split"
            and self.cluster.backend == "local"
            and self.critic.num_workers > 1
        ):
            raise ValueError(
                f"critic.num_workers={self.critic.num_workers} with cluster.backend=local: the local "
                "backend runs one in-process worker per group; set critic.num_workers=1 or cluster.backend=ray"
            )
        if self.critic.placement == "split":  # the policy's workers: in check_rl_config
            check_minibatches("ppo", self.ppo, self.critic.num_workers, "critic")
        return self


ALGORITHM_CONFIGS["ppo"] = PPOConfig
