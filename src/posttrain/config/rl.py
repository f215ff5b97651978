"""The RL configs (`posttrain grpo` and `posttrain distill` here; ppo.py and reinforce_ma.py hold
theirs) and what they all share: their base `RLConfig` (the shared sections and the one set of
checks every RL config runs, `check_rl_config`), the data and loop sections and the teacher.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from posttrain.config.common import (
    _GRPO_ARITH_KWARGS,
    VALIDATION_HELP,
    CheckpointConfig,
    ClusterConfig,
    DatasetConfig,
    LoggingConfig,
    OptimizerConfig,
    PolicyConfig,
    PromptsConfig,
    SchedulerConfig,
    Strict,
    _default_grpo_validation,
    config_warning,
    generated_problems,
)
from posttrain.config.loss import AdvantageConfig, DAPOConfig, LossConfig
from posttrain.config.multienv import (
    TaskSourceConfig,
    check_environments,
    check_sources_alone,
    named_environment_entries,
    without_unused_data_keys,
    without_unused_sections,
)
from posttrain.config.rollout import (
    EnvironmentConfig,
    GenerationConfig,
    check_episode_budget,
    environment_sections,
)


class GRPODataConfig(PromptsConfig):
    train: DatasetConfig = Field(default_factory=lambda: generated_problems(5000, 11, _GRPO_ARITH_KWARGS))
    validation: DatasetConfig | None = Field(
        default_factory=_default_grpo_validation, description=VALIDATION_HELP
    )
    exclude_validation_from_train: bool = Field(
        True,
        description="Drop every training task whose prompt (its whole first messages) is a validation "
        "task's, so that the held-out set is held out; the run's first lines say how many were dropped. "
        "Small generated tasks repeat (the quickstart's 1-digit sums have 121 distinct problems). Tasks "
        "without messages (an environment's reset makes them) are not compared: such environments keep "
        "their pools apart themselves (e.g. environment_tasks.split).",
    )
    sources: dict[str, TaskSourceConfig] | None = Field(
        None,
        description="A run over several environments (`environments`): the named sources of its tasks, "
        "each with its splits, its environment (or rows that name theirs in `task_name`), its share of "
        "every batch (`weight`) and its own prompt settings, in place of data.train, data.validation, "
        "prompt_template, system_prompt and example_turns. null: data.train (and data.validation).",
    )

    @model_validator(mode="after")
    def _sources_alone(self) -> GRPODataConfig:
        check_sources_alone(self)
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return without_unused_data_keys(self, handler(self))


class RLLoopConfig(Strict):
    """The loop settings every RL algorithm has (the RL runtime reads them): how long, how many
    prompts and samples per step, updates per batch, validation, the seed. Each algorithm's section
    (grpo, ppo, distill, ...) is this plus its own settings, with its own defaults where they differ."""

    max_steps: int = Field(40, gt=0)
    prompts_per_step: int = Field(8, gt=0)
    generations_per_prompt: int = Field(4, gt=0, description="Samples per prompt.")
    updates_per_batch: int = Field(
        1, gt=0, description="Optimizer steps per rollout batch (1 = exactly on-policy)."
    )
    val_every: int = Field(10, gt=0)
    val_at_start: bool = True
    val_samples_per_prompt: int = Field(1, gt=0, description="n for pass@k on validation.")
    val_temperature: float = Field(0.0, ge=0, description="0 = greedy.")
    seed: int = 0


class GRPOTrainerConfig(RLLoopConfig):
    generations_per_prompt: int = Field(4, gt=1, description="G, the group size.")
    async_mode: bool = Field(
        False,
        description="Asynchronous GRPO (docs/async.md): generation workers keep producing rollout groups "
        "with the newest weights they have while the policy trains; needs generation.placement=split. "
        "Stale data gets π_old recomputed and the behaviour-vs-π_old importance weight "
        "(loss.importance_correction: auto makes it truncated).",
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
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="The teacher's weights and compute; auto: a posttrain checkpoint's compute dtype (the "
        "policy.dtype its run trained in: a bf16 run's fp32 master weights are not the policy it trained), "
        "float32 for any other model.",
    )
    batch_size: int = Field(16, gt=0, description="Sequences per teacher forward.")
    chunk_size: int = Field(
        2048, gt=0, description="Positions whose full-vocabulary logits exist at once in the teacher."
    )
    packed_sequences: bool = Field(True, description="Run the teacher's decoder on real tokens only.")


# ----------------------------------------------------------------- the RL configs' shared checks
def check_rl_config(cfg: Any, loop: str) -> None:
    """The checks every RL config (GRPOConfig, PPOConfig, DistillConfig) runs, in one place so that
    they cannot drift apart. `loop`: the name of its loop section (grpo, ppo, distill, ...), an
    `RLLoopConfig`. Raises ValueError; warns with ConfigWarning."""
    cfg.generation.check_lora_adapter(cfg.policy.lora)
    cfg.generation.check_hf_dtype()
    check_environments(cfg, loop)
    if cfg.generation.placement == "split":
        cfg.generation.check_refit_transport(cfg.cluster, sharded=cfg.policy.split_weights)
    check_minibatches(loop, getattr(cfg, loop), cfg.cluster.policy_workers(), "policy")
    check_episode_budget(cfg)
    if (teacher := getattr(cfg, "teacher", None)) is not None:
        check_local_workers("teacher", teacher.num_workers, cfg.cluster)
    loss = getattr(cfg, "loss", None)
    if loss is not None:
        default_importance_correction(cfg, loop)
        check_truncated_sampling(cfg, loop)
        g = cfg.generation
        if loss.importance_correction is not None and g.backend == "hf" and g.placement == "colocated":
            if g.sampling_dtype(cfg.policy.dtype) == cfg.policy.dtype:
                config_warning(
                    f"loss.importance_correction={loss.importance_correction} corrects for an inference "
                    "engine that differs from the trainer, but generation.backend=hf colocated samples with "
                    "the trainer's own model and weights (ratio 1 up to rounding): it has no effect here"
                )


def default_importance_correction(cfg: Any, loop: str) -> None:
    """Resolve loss.importance_correction="auto" (the default): "truncated" (π_old / π_gen clamped at
    loss.importance_cap) where the sampler's logprobs are not the trainer's, else None. They differ on
    every token with async GRPO (stale weights) and with a generator that samples in another dtype
    than training computes in (generation.vllm.dtype or generation.hf.dtype bfloat16 under a float32
    policy: faster rollouts, what GPU RL does); token_mult_prob_error and gen_kl show the mismatch it
    corrects."""
    loss = cfg.loss
    if loss.importance_correction != "auto":
        return
    g = cfg.generation
    stale = bool(getattr(getattr(cfg, loop), "async_mode", False))
    lower_precision = g.sampling_dtype(cfg.policy.dtype) != cfg.policy.dtype
    loss.importance_correction = "truncated" if stale or lower_precision else None


def check_local_workers(section: str, workers: int, cluster: ClusterConfig) -> None:
    """A worker group of its own (`section`: teacher, critic) with more than one worker needs Ray."""
    if cluster.backend == "local" and workers > 1:
        raise ValueError(
            f"{section}.num_workers={workers} with cluster.backend=local: the local backend runs one "
            f"in-process worker per group; set {section}.num_workers=1 or cluster.backend=ray"
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
    loss, section = cfg.loss, getattr(cfg, loop)
    uses = []
    if loss.importance_correction is not None:
        uses.append(f"loss.importance_correction={loss.importance_correction} weights by π_old / π_gen")
    if getattr(section, "async_mode", False):
        uses.append(f"{loop}.async_mode=true corrects stale data with the behaviour logprobs")
    if loss.kl_in_reward and loss.kl_beta > 0 and section.updates_per_batch == 1:
        uses.append(f"loss.kl_in_reward with {loop}.updates_per_batch=1 takes π_old from the generator")
    estimator = getattr(getattr(cfg, "advantage", None), "estimator", None)  # not every RL config has one
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


class RLConfig(Strict):
    """Base of the RL configs: the sections they all share, with the quickstart's defaults (each
    config adds its loop section, named by `LOOP`, and its own), and `check_rl_config` (the one
    shared set of checks), run before each config's own validators."""

    LOOP: ClassVar[str] = "grpo"

    policy: PolicyConfig = PolicyConfig(
        optimizer=OptimizerConfig(lr=2e-5, max_grad_norm=1.0),
        scheduler=SchedulerConfig(name="constant", warmup_steps=0),
        max_seq_len=128,
        train_micro_batch_size=8,
        logprob_batch_size=16,
    )
    data: GRPODataConfig = GRPODataConfig()
    generation: GenerationConfig = GenerationConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    environments: dict[str, EnvironmentConfig] | None = Field(
        None,
        description="One run over several environments, in place of `environment`: each by a name of "
        "your choice, with its own settings ({math: {name: math}, puzzle: {name: sliding_puzzle, kwargs: "
        "{...}, max_turns: 4}}; `name` defaults to the key). A task's environment is named by its row's "
        "`task_name` or its source's `environment` (data.sources); metrics per environment are logged "
        "as <name>/... and val/<name>/... See docs/environments.md, 'One run, many environments'.",
    )
    cluster: ClusterConfig = ClusterConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(save_every=10, metric="val/accuracy", mode="max")
    logging: LoggingConfig = LoggingConfig()

    @field_validator("environments", mode="before")
    @classmethod
    def _named(cls, value: Any) -> Any:
        return named_environment_entries(value)

    @model_validator(mode="after")
    def _rl_checks(self) -> RLConfig:
        check_rl_config(self, self.LOOP)
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return without_unused_sections(self, handler(self))


# ----------------------------------------------------------------- posttrain grpo
class GRPOConfig(RLConfig):
    """`posttrain grpo`."""

    advantage: AdvantageConfig = AdvantageConfig()
    loss: LossConfig = LossConfig()
    dapo: DAPOConfig = DAPOConfig()
    grpo: GRPOTrainerConfig = GRPOTrainerConfig()
    teacher: TeacherConfig | None = Field(
        None,
        description="The teacher of advantage.estimator=on_policy_distill (required by it, else unused).",
    )

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
        batches (its importance correction defaults to truncated IS: `default_importance_correction`)."""
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
        if any(e.max_turns > 1 and not e.turn_barrier for e in environment_sections(self).values()):
            raise ValueError(
                "grpo.partial_rollouts=true is not implemented in the continuous multi-turn decoder: set "
                "environment.turn_barrier=true"
            )


# ----------------------------------------------------------------- posttrain distill
class DistillTrainerConfig(RLLoopConfig):
    """The loop and the loss of on-policy distillation (see posttrain.algorithms.distillation)."""

    max_steps: int = Field(20, gt=0)
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


class DistillConfig(RLConfig):
    """`posttrain distill`: the student samples, the teacher scores its tokens (top-k), the student
    minimises the divergence on its own tokens. Default task: the GRPO quickstart's."""

    LOOP: ClassVar[str] = "distill"

    environment: EnvironmentConfig = Field(
        default_factory=EnvironmentConfig,
        description="Runs the episodes (several turns, tools) and scores them for the metrics and "
        "validation; rewards do not enter the loss.",
    )
    teacher: TeacherConfig = TeacherConfig()
    distill: DistillTrainerConfig = DistillTrainerConfig()
