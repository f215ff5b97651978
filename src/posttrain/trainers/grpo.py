"""Group Relative Policy Optimisation (and its DAPO / GSPO / Dr.GRPO / RLOO variants).

One step:
  1. sample `prompts_per_step` problems and generate G = `generations_per_prompt` answers each;
  2. score them in the environment: reward r_i (math: 1 if the \\boxed{} answer is right);
  3. advantages per group, e.g. GRPO: A_i = (r_i - mean_g r) / (std_g r + eps);
  4. maximise the clipped surrogate  min(ρ_t A, clip(ρ_t, 1-ε_low, 1+ε_high) A) - β KL(π || π_ref)
     over generated tokens, ρ_t = π(y_t|·) / π_old(y_t|·), normalised by the GLOBAL token count.
     With one update per batch π_old is the current policy (ρ = 1 in value, the on-policy
     shortcut: no extra forward pass).
Generation uses the training weights in place (colocated) or separate workers refitted after
every update (split).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posttrain.algorithms.advantages import (
    clip_advantages,
    message_advantage_penalties,
    scale_rewards,
    trainable_samples,
)
from posttrain.algorithms.dapo import overlong_filter_mask, overlong_reward_shaping, zero_variance_groups
from posttrain.algorithms.estimators import AdvantageInputs, estimate_advantages
from posttrain.algorithms.kl import kl_estimate
from posttrain.algorithms.metrics import (
    accumulate_metrics,
    component_reward_metrics,
    logprob_error_keep,
    pass_at_k,
    scored_reward_metrics,
)
from posttrain.algorithms.reward_shaping import stop_properly_penalty
from posttrain.algorithms.rl_loss import grpo_loss, loss_knobs, positive_tokens
from posttrain.checkpoint import Deadline, resolve_resume
from posttrain.config.schema import (
    AdvantageConfig,
    DatasetConfig,
    GRPOConfig,
    episode_token_budget,
)
from posttrain.data.batching import EpochSampler
from posttrain.data.tasks import Task
from posttrain.distributed.actor_group import ActorGroup, GenerationGroup
from posttrain.distributed.refit_check import check_refit
from posttrain.distributed.teacher_group import (
    StudentGroup,
    TeacherGroup,
    prepare_teacher,
    teacher_worker_kwargs,
)
from posttrain.environments.group import EnvironmentGroup
from posttrain.environments.interface import check_verifier_errors
from posttrain.errors import WorkerLostError
from posttrain.generation.sampling import SamplingParams
from posttrain.generation.worker import refit_cast_dtype
from posttrain.logging import MetricsLogger, Timer
from posttrain.logging.plots import plot_run
from posttrain.logging.progress import staged
from posttrain.modeling.tokenizer import training_tokenizer
from posttrain.rollout.agent import run_agent_rollouts
from posttrain.rollout.rollout import (
    RLBatch,
    Rollouts,
    Trajectory,
    build_rl_batch,
    flagged_turn_tokens,
    prompt_ids_of,
    run_rollouts,
    start_episodes,
    transcript,
)
from posttrain.rollout.tasks import load_tasks
from posttrain.trainers.common import (
    graceful_stop,
    latest_values,
    load_controller_state,
    make_checkpointer,
    prepare_run_dir,
    print_interrupted,
    run_summary,
    save_controller_state,
    seed_everything,
    truncate_step_log,
)
from posttrain.trainers.grpo_async import (
    AsyncRollouts,
    behaviour_ratio_metrics,
    exactly_on_policy,
    logprob_gap_metrics,
)

PLOTS = [
    "reward/mean",
    "env/accuracy",
    "env/solved_rate",
    "env/pass_rate",
    "env/tool_call_rate",
    "episode/turns_mean",
    "val/accuracy",
    "pg_loss",
    "kl",
    "token_mult_prob_error",
    "gen_kl",
    "response_length",
    "timing/step",
]


def apply_message_penalties(
    adv: AdvantageConfig, advantages: torch.Tensor, mask: torch.Tensor, trajectories: list[Trajectory]
) -> tuple[torch.Tensor, dict[str, float]]:
    """advantage.invalid_tool_call_advantage / malformed_thinking_advantage on the tokens of flagged
    turns (`message_advantage_penalties`), then advantage.clip again (NeMo RL clips after them);
    with both null, the advantages as they are and no metrics. Metrics: invalid_tool_call_rate and
    malformed_thinking_rate, the shares of all assistant turns flagged (NeMo RL's names)."""
    if adv.invalid_tool_call_advantage is None and adv.malformed_thinking_advantage is None:
        return advantages, {}
    invalid, malformed = flagged_turn_tokens(trajectories, tuple(mask.shape))
    penalised = message_advantage_penalties(
        advantages, mask, invalid_tool_call=invalid, malformed_thinking=malformed,
        invalid_tool_call_advantage=adv.invalid_tool_call_advantage,
        malformed_thinking_advantage=adv.malformed_thinking_advantage,
    )  # fmt: skip
    turns = max(sum(t.num_turns for t in trajectories), 1)
    metrics = {
        "invalid_tool_call_rate": sum(sum(t.turn_invalid_tool_call) for t in trajectories) / turns,
        "malformed_thinking_rate": sum(sum(t.turn_malformed_thinking) for t in trajectories) / turns,
    }
    return clip_advantages(penalised, adv.clip, low=adv.clip_low, high=adv.clip_high), metrics


def collect_groups(
    draw: Callable[[int], Rollouts],
    *,
    groups: int,
    group_size: int,
    dynamic_sampling: bool,
    max_rounds: int,
    unit: int = 1,
) -> tuple[Rollouts, dict[str, float]]:
    """The trajectories of one step; with dynamic sampling (DAPO), only groups whose rewards differ.

    ``draw(round)`` generates and scores one round (``groups`` prompts × ``group_size``, round
    1, 2, ...). Without dynamic sampling that one round is the batch. With it, groups with all-equal
    rewards among their scored samples (or fewer than two scored: ``zero_variance_groups``) are
    dropped and rounds are drawn until ``groups`` groups are kept, at most ``max_rounds``. If the
    batch is still short then, it trains on the groups kept (whole groups, as many as give a
    multiple of ``unit`` sequences: the batch must split evenly over updates × data-parallel workers): ``dapo/short_batch`` = 1. If none can be kept, the
    trajectories are empty and the caller skips the update: ``dapo/skipped_update`` = 1.

    Returns (Rollouts, stats) with stats dapo/generation_rounds, reward/zero_variance_fraction and,
    with dynamic sampling, dapo/kept_groups, dapo/short_batch, dapo/skipped_update.
    """
    kept: list[Trajectory] = []
    env_metrics: dict[str, float] = {}
    zero_fraction: list[float] = []
    target = groups * group_size
    rounds = 0
    while True:
        rounds += 1
        batch = draw(rounds)
        env_metrics = env_metrics or batch.env_metrics
        zero = zero_variance_groups(batch.rewards, batch.group_ids, scored=batch.scored)
        zero_fraction.append(float(zero.float().mean()))
        if not dynamic_sampling:
            kept = batch.trajectories
            break
        kept += [t for t, z in zip(batch.trajectories, zero.tolist(), strict=True) if not z]
        if len(kept) >= target or rounds >= max_rounds:
            break
    stats = {
        "dapo/generation_rounds": float(rounds),
        "reward/zero_variance_fraction": sum(zero_fraction) / rounds,
    }
    if dynamic_sampling:
        short = len(kept) < target
        if short:  # whole groups (kept holds whole groups, in order), a multiple of `unit` sequences
            kept_groups = len(kept) // group_size
            while kept_groups > 0 and (kept_groups * group_size) % unit:
                kept_groups -= 1
            kept = kept[: kept_groups * group_size]
        else:
            kept = kept[:target]
        stats["dapo/kept_groups"] = float(len(kept) // group_size)
        stats["dapo/short_batch"] = float(short)
        stats["dapo/skipped_update"] = float(not kept)
    return Rollouts(kept, env_metrics), stats


@dataclass
class GRPOResult:
    run_dir: Path
    step: int
    history: list[dict[str, float]] = field(default_factory=list)
    last_checkpoint: Path | None = None
    stopped_by_deadline: bool = False


class GRPOTrainer:
    """Holds the workers and data of one run; `fit()` is the loop."""

    algorithm = "GRPO"
    """The name in the run's log lines."""
    run_kind = "grpo"
    """The run directory's default name, runs/<run_kind>."""
    plots = PLOTS
    """The metrics plotted into <run_dir>/plots at the end."""
    policy_group_cls: type[ActorGroup] = ActorGroup
    """The policy's worker group; a subclass's workers may hold more models (PPO: a colocated critic)."""

    def policy_worker_kwargs(self) -> dict[str, Any]:
        """Extra constructor arguments of the policy workers (GRPO: none)."""
        return {}

    def policy_optimizer_steps(self) -> int:
        """The policy's optimizer steps over the run: the length of its learning-rate schedule."""
        return self.cfg.grpo.max_steps * self.cfg.grpo.updates_per_batch

    def needs_reference(self) -> bool:
        """Whether the policy workers load π_ref (a KL penalty)."""
        return self.cfg.loss.kl_beta > 0

    def make_loss_knobs(self) -> dict[str, Any]:
        """Keyword arguments of the loss function (`train_on`)."""
        return loss_knobs(self.cfg.loss)

    def async_mode(self) -> bool:
        """Whether generation runs ahead of training (`grpo.async_mode`)."""
        return self.cfg.grpo.async_mode

    def run_description(self) -> str:
        """More of the run's first log line (GRPO: nothing)."""
        return ""

    def __init__(self, cfg: GRPOConfig) -> None:
        self.cfg = cfg
        from posttrain.models.hub import resolve_model

        self.model_path = resolve_model(cfg.policy.model_name)  # a missing model fails before the run dir
        self.run_dir = prepare_run_dir(cfg.logging.run_dir, self.run_kind, cfg)
        seed_everything(cfg.grpo.seed)
        self.tokenizer, tokenizer_path = training_tokenizer(
            cfg.policy.tokenizer_name or self.model_path,
            cfg.policy.chat_template,
            self.run_dir,
            "policy.chat_template",
        )
        max_prompt = cfg.policy.max_seq_len - cfg.generation.max_new_tokens
        if max_prompt <= 0:
            raise ValueError(
                f"policy.max_seq_len ({cfg.policy.max_seq_len}) must exceed generation.max_new_tokens "
                f"({cfg.generation.max_new_tokens}) to leave room for the prompt"
            )
        self.train_problems = self.build_tasks(cfg.data.train, max_prompt)
        self.val_problems = self.build_tasks(cfg.data.validation, max_prompt) if cfg.data.validation else []
        self.sampler = EpochSampler(len(self.train_problems), cfg.grpo.prompts_per_step, seed=cfg.grpo.seed)
        self.total_steps = cfg.grpo.max_steps
        self.next_group_id = 0
        self.checkpointer = make_checkpointer(self.run_dir / "checkpoints", cfg.checkpoint)
        # the policy trains softmax(logits / T), the distribution rollouts are sampled from
        policy_cfg = cfg.policy.model_copy(update={"logprob_temperature": cfg.generation.temperature or 1.0})
        self.split = cfg.generation.placement == "split"
        transport = (
            cfg.generation.resolved_refit_transport(cfg.cluster, cfg.policy.split_weights)
            if self.split
            else None
        )
        teacher_path, teacher_cut, held_teacher = self.teacher_setup()
        self.policy = (StudentGroup if held_teacher else self.policy_group_cls)(
            policy_cfg,
            cfg.cluster,
            model_path=self.model_path,
            total_steps=self.policy_optimizer_steps(),
            tokenizer_path=tokenizer_path,
            reference=self.needs_reference(),
            generation=None if cfg.generation.placement == "split" else cfg.generation,
            # generation workers map the policy's weights, which then live in shared memory
            shared_weights=transport == "shared_memory",
            lora_adapter_refit=cfg.generation.vllm.lora_adapter,
            **self.policy_worker_kwargs(),
            **({"teacher": held_teacher} if held_teacher else {}),
        )
        self.teacher = (
            TeacherGroup(
                cfg.teacher, cfg.cluster, model_path=teacher_path, vocab_size=teacher_cut, student=self.policy
            )
            if cfg.teacher is not None
            else None
        )
        self.generator: ActorGroup | GenerationGroup = self.policy
        # weights move to a separate engine after every update: split workers or a colocated vLLM
        self.refits = self.split or cfg.generation.backend == "vllm"
        self.engine_dtype = refit_cast_dtype(cfg.generation, cfg.policy)  # the refit check casts to it
        if self.split:
            self.generator = GenerationGroup(
                cfg.generation,
                policy_cfg,
                cfg.cluster,
                model_path=self.model_path,
                tokenizer_path=tokenizer_path,
                transport=transport,
            )
        self.environment = EnvironmentGroup(
            cfg.environment.name,
            cfg.environment.kwargs,
            num_workers=cfg.environment.num_workers,
            backend=cfg.cluster.backend,
            max_concurrent_steps=cfg.environment.max_concurrent_steps,
        )
        self.loss_fn_knobs = self.make_loss_knobs()
        self.timer = Timer()
        # episodes without a turn barrier run where the sampler is: a vLLM engine, or an HF model that is
        # whole on each worker (an FSDP2-sharded colocated policy decodes collectively: turn by turn)
        sharded_hf = cfg.policy.fsdp and not self.split and cfg.generation.backend != "vllm"
        self.turn_barrier = cfg.environment.turn_barrier or sharded_hf
        probe_tasks = self.train_problems[: cfg.generation.refit_check.prompts]
        starts = start_episodes(self.environment, probe_tasks, list(range(len(probe_tasks))))
        self.probe_prompts = [prompt_ids_of(self.tokenizer, s) for s in starts]
        self.policy_version = 0  # policy updates so far; every trajectory records the one it was sampled with
        self.async_rollouts = AsyncRollouts(self) if self.async_mode() else None

    def teacher_setup(self) -> tuple[str | None, int | None, dict[str, Any] | None]:
        """on_policy_distill: (teacher folder, vocabulary cut, the teacher's worker arguments when the
        policy workers hold it (colocated) else None); (None, None, None) without a teacher."""
        cfg = self.cfg
        if cfg.teacher is None:
            return None, None, None
        path, cut = prepare_teacher(
            cfg.teacher.model_name,
            cfg.teacher.tokenizer_name,
            student_tokenizer=self.tokenizer,
            student_path=self.model_path,
            student_name=cfg.policy.model_name,
        )
        held = teacher_worker_kwargs(cfg.teacher, model_path=path, vocab_size=cut)
        return path, cut, held if cfg.teacher.placement == "colocated" else None

    def teacher_logprobs(self, batch: RLBatch) -> torch.Tensor:
        """[N, T] the teacher's log-probability of every generated token (0 elsewhere); only the
        sampled token's value travels (top-1 of the teacher's payload is ignored)."""
        with self.timer("teacher"):
            scores = self.teacher.topk(batch, 1, self.cfg.advantage.teacher_temperature)
        selected = batch.loss_mask.bool().clone()
        selected[:, 0] = False
        out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
        out[selected] = scores.sampled_logprob.float()
        return out

    def build_tasks(self, split: DatasetConfig, max_prompt_len: int) -> list[Task]:
        """A split's tasks (rows, or the environment's own), prompts over `max_prompt_len` dropped."""
        return load_tasks(
            split,
            self.cfg.environment,
            prompt_template=self.cfg.data.prompt_template,
            system_prompt=self.cfg.data.system_prompt,
            tokenizer=self.tokenizer,
            max_prompt_len=max_prompt_len,
        )

    # ---------------------------------------------------------------- phases
    def sampling_params(self, *, validation: bool, seed: int) -> SamplingParams:
        g = self.cfg.generation
        temperature = self.cfg.grpo.val_temperature if validation else g.temperature
        return SamplingParams(
            temperature=temperature,
            top_p=g.top_p,
            top_k=g.top_k,
            max_new_tokens=g.max_new_tokens,
            stop_strings=tuple(g.stop_strings),
            seed=seed,
        )

    def rollouts(
        self,
        problems: list[Task],
        generations: int,
        params: SamplingParams,
        timer: Timer | None = None,
        progress: str = "generation",
    ) -> Rollouts:
        """G rollouts per problem; `progress` names the phase's bar on a terminal. With
        `environment.agent` the user's agent plays them through the endpoint (`run_agent_rollouts`)."""
        agent = self.cfg.environment.agent
        out = (run_rollouts if agent is None else functools.partial(run_agent_rollouts, agent=agent))(
            problems,
            generations_per_prompt=generations,
            generator=self.generator,
            environment=self.environment,
            tokenizer=self.tokenizer,
            params=params,
            batch_size=self.cfg.generation.batch_size,
            max_turns=self.cfg.environment.max_turns,
            max_seq_len=self.cfg.policy.max_seq_len,
            max_observation_tokens=self.cfg.environment.max_observation_tokens,
            max_episode_tokens=episode_token_budget(self.cfg.generation, self.cfg.environment),
            first_group_id=self.next_group_id,
            timer=timer or self.timer,
            turn_barrier=self.turn_barrier,
            progress=progress,
        )
        self.next_group_id += len(problems)
        env = self.cfg.environment
        check_verifier_errors([t.info for t in out.trajectories], env.max_error_fraction, env.name)
        for t in out.trajectories:
            t.policy_version = self.policy_version
        if self.cfg.generation.vllm.sleep and not self.split:
            self.policy.sleep_generator()  # free the engine's memory for training
        return out

    def collect(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """Rollouts for one step; with dynamic sampling, only groups whose rewards differ, refilled
        (see ``collect_groups``: a batch still short after max_generation_rounds trains on what was
        kept; empty trajectories mean: skip this step's update). Async: the replay buffer's next groups."""
        if self.async_rollouts is not None:
            return self.async_rollouts.next_rollouts(step)
        g, dapo = self.cfg.grpo, self.cfg.dapo

        def draw(round_: int) -> Rollouts:
            problems = [self.train_problems[i] for i in self.sampler.next_batch()]
            seed = g.seed * 1_000_003 + step * 101 + round_
            return self.rollouts(
                problems, g.generations_per_prompt, self.sampling_params(validation=False, seed=seed)
            )

        workers = self.cfg.cluster.policy_workers()
        return collect_groups(
            draw,
            groups=g.prompts_per_step,
            group_size=g.generations_per_prompt,
            dynamic_sampling=dapo.dynamic_sampling,
            max_rounds=dapo.max_generation_rounds,
            unit=g.updates_per_batch * workers if workers > 1 else 1,
        )

    def rewards(self, rollouts: Rollouts) -> torch.Tensor:
        """Task rewards, scaled (advantage.reward_scaling), then a truncated sample's scaled by
        dapo.stop_properly_penalty_coef, or DAPO's soft overlong penalty on the episode's generated
        tokens over all its turns, against the episode token budget."""
        cfg = self.cfg
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
            rewards = stop_properly_penalty(
                rewards, rollouts.truncated, coef=cfg.dapo.stop_properly_penalty_coef
            )
        if cfg.dapo.overlong_buffer:
            rewards = rewards + overlong_reward_shaping(
                rollouts.response_lengths,
                max_len=episode_token_budget(cfg.generation, cfg.environment),
                buffer_len=cfg.dapo.overlong_buffer,
                penalty=cfg.dapo.overlong_penalty,
            )
        return rewards

    def make_batch(self, rollouts: Rollouts) -> tuple[RLBatch, dict[str, float]]:
        cfg, loss = self.cfg, self.cfg.loss
        rewards = self.rewards(rollouts)
        lengths = rollouts.response_lengths
        batch = build_rl_batch(rollouts.trajectories, torch.zeros(len(rewards)), self.tokenizer.pad_token_id)
        metrics: dict[str, float] = {}
        kl = None
        if loss.kl_in_reward and loss.kl_beta > 0:
            # the KL reward needs π_ref (and π_old) before the advantages; π_old is the trainer's
            # when the batch gets several updates, else the sampler's (the same distribution)
            self.add_logprobs(batch)
            policy_lp = batch.old_logprobs if batch.old_logprobs is not None else batch.generation_logprobs
            kl = kl_estimate(
                policy_lp.double(),
                batch.reference_logprobs.double(),
                loss.kl_estimator,
                input_clamp=loss.kl_input_clamp,
                output_clamp=loss.kl_output_clamp,
            )
            kl = torch.where(batch.loss_mask.bool(), kl, torch.zeros_like(kl))
            metrics["reward/kl_penalty"] = float(loss.kl_beta * kl.sum(-1).mean())
        teacher_lp = student_lp = None
        if self.teacher is not None:
            self.add_logprobs(batch)  # π_old, when the batch gets several updates
            teacher_lp = self.teacher_logprobs(batch)
            student_lp = batch.old_logprobs if batch.old_logprobs is not None else batch.generation_logprobs
            m = batch.loss_mask
            tokens = m.sum().clamp(min=1)
            metrics["distill/teacher_logprob"] = float((teacher_lp * m).sum() / tokens)
            metrics["distill/reverse_kl"] = float(((student_lp - teacher_lp) * m).sum() / tokens)
        components = rollouts.reward_components() if cfg.advantage.estimator == "gdpo" else None
        if components is not None:
            metrics.update(component_reward_metrics(*components, rollouts.scored))
        names, matrix = components if components is not None else ((), None)
        inputs = AdvantageInputs(
            rewards, rollouts.group_ids, mask=batch.loss_mask, scored=rollouts.scored, kl=kl,
            kl_beta=loss.kl_beta, teacher_logprobs=teacher_lp, student_logprobs=student_lp,
            components=matrix, component_names=tuple(names),
        )  # fmt: skip
        batch.advantages = estimate_advantages(cfg.advantage, inputs)
        batch.advantages, penalty_metrics = apply_message_penalties(
            cfg.advantage, batch.advantages, batch.loss_mask, rollouts.trajectories
        )
        metrics.update(penalty_metrics)
        if cfg.advantage.estimator != "on_policy_distill":  # the teacher's signal needs no group
            trainable = trainable_samples(rollouts.group_ids, rollouts.scored)
            batch.loss_mask = batch.loss_mask * trainable.float()[:, None]
        if cfg.dapo.overlong_filter:
            batch.loss_mask = batch.loss_mask * overlong_filter_mask(rollouts.truncated).float()[:, None]
        mask = batch.loss_mask
        metrics.update(
            {
                **scored_reward_metrics(rewards, rollouts.scored),
                "response_length": float(lengths.mean()),
                "truncation_rate": float(rollouts.truncated.float().mean()),
                "entropy": float(-(batch.generation_logprobs * mask).sum() / mask.sum().clamp(min=1)),
            }
        )
        return batch, metrics

    def normalizers(self, batch: RLBatch) -> tuple[float, float]:
        """(loss normaliser for the configured aggregation, global count of valid tokens).

        Sequence counts include only sequences with at least one valid token: a sample the
        overlong filter (or an unscored episode) took out of the loss does not dilute the mean.
        seq_mean_token_sum (Dr.GRPO) divides by sequences × the episode token budget (one turn:
        max_new_tokens), the most tokens a sequence can train on.
        """
        tokens = max(1.0, float(batch.loss_mask.sum()))
        aggregation = self.cfg.loss.aggregation
        if aggregation == "token":
            return tokens, tokens
        sequences = max(1.0, float((batch.loss_mask.sum(-1) > 0).sum()))
        if aggregation == "sequence":
            return sequences, tokens
        return sequences * episode_token_budget(self.cfg.generation, self.cfg.environment), tokens

    def add_logprobs(self, batch: RLBatch) -> None:
        """π_ref's logprobs (KL penalty) and π_old's, unless present. π_old is skipped (the on-policy
        shortcut: the current policy is π_old) only for one update on a batch that is exactly on-policy,
        every row sampled by the current weights version (`exactly_on_policy`), and without
        loss.seq_logprob_error_threshold (which measures the engine against π_old before training)."""
        cfg = self.cfg
        if cfg.loss.kl_beta > 0 and batch.reference_logprobs is None:
            with self.timer("reference_logprobs"):
                batch.reference_logprobs = self.policy.reference_logprobs(batch)
        on_policy = exactly_on_policy(batch.policy_versions, self.policy_version)
        needs_old = cfg.loss.seq_logprob_error_threshold is not None  # the error is against π_old
        if (cfg.grpo.updates_per_batch > 1 or not on_policy or needs_old) and batch.old_logprobs is None:
            with self.timer("old_logprobs"):
                batch.old_logprobs = self.policy.logprobs(batch)

    def drop_logprob_errors(self, batch: RLBatch) -> dict[str, float]:
        """loss.seq_logprob_error_threshold: take the sequences whose engine logprobs disagree with
        π_old by more than it out of the loss (their loss_mask rows zeroed; `logprob_error_keep`),
        after the advantages (their rewards stay in the baselines, as in NeMo RL). No-op when null."""
        threshold = self.cfg.loss.seq_logprob_error_threshold
        if threshold is None:
            return {}
        keep, metrics = logprob_error_keep(
            batch.old_logprobs, batch.generation_logprobs, batch.loss_mask, threshold=threshold
        )
        batch.loss_mask = batch.loss_mask * keep.to(batch.loss_mask.dtype)[:, None]
        return metrics

    def train_on(self, batch: RLBatch) -> dict[str, float]:
        """`updates_per_batch` optimizer steps over contiguous minibatches of the rollout batch; metrics
        (the gradient norm included) are means over them, the learning rate the last one's."""
        cfg = self.cfg
        self.add_logprobs(batch)
        metrics: dict[str, float] = self.drop_logprob_errors(batch)
        minibatches = batch.chunks(cfg.grpo.updates_per_batch)
        with self.timer("training"):
            for mb in minibatches:
                normalizer, tokens = self.normalizers(mb)
                loss_fn = functools.partial(
                    grpo_loss, token_normalizer=tokens, positive_normalizer=positive_tokens(mb),
                    **self.loss_fn_knobs,
                )  # fmt: skip
                out = self.policy.train(mb, loss_fn, normalizer)
                accumulate_metrics(
                    metrics, {**out.loss_metrics, "grad_norm": out.grad_norm}, 1 / len(minibatches)
                )
                metrics["lr"] = out.lr
        if self.async_rollouts is not None:
            metrics.update(
                behaviour_ratio_metrics(batch, cfg.loss.importance_min or 0.0, cfg.loss.importance_cap)
            )
            metrics = logprob_gap_metrics(metrics, batch, self.policy_version)  # π_old's version
        self.policy_version += 1
        metrics.update(self.refit())
        return metrics

    def refit(self) -> dict[str, float]:
        """Give the generator the policy's weights, then check that it runs them (the parity gate)."""
        if self.async_rollouts is not None:  # the generator loads it between its batches
            return self.async_rollouts.publish(self.policy_version)
        if not self.refits:
            return {}
        with self.timer("refit"):
            if self.split:
                self.generator.refit(self.policy)
            else:
                self.policy.refit_engine()
        return self.check_generator()

    def check_generator(self) -> dict[str, float]:
        with self.timer("refit_check"):
            return check_refit(
                self.cfg.generation.refit_check,
                self.policy,
                self.generator,
                self.probe_prompts,
                self.sampling_params(validation=False, seed=self.cfg.grpo.seed),
                self.tokenizer.pad_token_id,
                engine_dtype=self.engine_dtype,
            )

    @staged("validate")
    def validate(self) -> dict[str, float]:
        if not self.val_problems:
            return {}
        if self.async_rollouts is not None:
            with self.async_rollouts.synced():  # generation paused; the generator has the newest weights
                self.check_generator()
                return self.validate_now()
        return self.validate_now()

    def validate_now(self) -> dict[str, float]:
        n = self.cfg.grpo.val_samples_per_prompt
        start = time.perf_counter()
        params = self.sampling_params(validation=True, seed=self.cfg.grpo.seed)
        # its own timer: validation's generation must not count in the next training step's timings
        r = self.rollouts(self.val_problems, n, params, timer=Timer(), progress="validation")
        correct = [bool(t.info.get("correct", t.reward >= 1.0)) for t in r.trajectories]
        per_problem = [sum(correct[i * n : (i + 1) * n]) for i in range(len(self.val_problems))]
        metrics = {
            "val/accuracy": sum(correct) / len(correct),
            "val/reward": scored_reward_metrics(r.rewards, r.scored)["reward/mean"],
            "val/response_length": float(r.response_lengths.mean()),
            "timing/validation": time.perf_counter() - start,
        }
        if n > 1:
            metrics[f"val/pass@{n}"] = sum(pass_at_k(n, c, n) for c in per_problem) / len(per_problem)
        return metrics

    def write_samples(self, step: int, rollouts: Rollouts, count: int = 4) -> None:
        """A few trajectories per step in samples.jsonl, to read what the model writes."""
        with open(self.run_dir / "samples.jsonl", "a") as f:
            for t in rollouts.trajectories[:count]:
                f.write(json.dumps({"step": step, **transcript(t)}, default=str) + "\n")

    # ---------------------------------------------------------------- state
    def save(self, step: int, history: list[dict[str, float]]) -> Path:
        def write(directory: Path) -> None:
            self.policy.save_checkpoint(directory)
            self.tokenizer.save_pretrained(directory / "model")  # a self-contained HF folder
            state = {"sampler": self.sampler.state_dict(), "next_group_id": self.next_group_id}
            save_controller_state(directory, step, state, self.cfg)
            if self.async_rollouts is not None:
                self.async_rollouts.save(directory)

        if self.async_rollouts is None:
            return self.checkpointer.save(step, write, metrics=latest_values(history, step))
        with self.async_rollouts.paused():  # the sampler's position matches the buffer's contents
            return self.checkpointer.save(step, write, metrics=latest_values(history, step))

    def restore(self, checkpoint: Path) -> int:
        self.policy.load_checkpoint(checkpoint)
        state = load_controller_state(checkpoint)
        self.sampler.load_state_dict(state["sampler"])
        self.next_group_id = state["next_group_id"]
        self.policy_version = state["step"]
        if self.async_rollouts is not None:
            self.async_rollouts.load(checkpoint, state["step"])
        self.refit()
        self.timer.pop()
        return state["step"]

    def shutdown(self) -> None:
        if self.async_rollouts is not None:
            self.async_rollouts.stop()
        self.environment.shutdown()
        if self.teacher is not None:
            self.teacher.shutdown()
        if self.split:
            self.generator.shutdown()
        self.policy.shutdown()

    # ---------------------------------------------------------------- loop
    def fit(self, *, stop_after: int | None = None) -> GRPOResult:
        cfg = self.cfg
        resume_from = resolve_resume(cfg.checkpoint.resume, self.checkpointer)
        step = self.restore(resume_from) if resume_from else 0
        if not resume_from and self.refits:
            # same weights on both sides yet: proves the check itself holds; an engine that serves the
            # LoRA adapter (generation.vllm.lora_adapter) starts without one and gets it here
            self.refit() if cfg.generation.vllm.lora_adapter else self.check_generator()
            self.timer.pop()
        result = GRPOResult(self.run_dir, step, last_checkpoint=resume_from)
        for log_file in ("metrics.jsonl", "samples.jsonl"):  # a resumed run logs no step twice
            truncate_step_log(self.run_dir / log_file, step if resume_from else None)
        logger = MetricsLogger(
            cfg.logging, self.run_dir, total_steps=self.total_steps, start_step=step, config=cfg
        )
        placement = cfg.generation.placement
        if self.split:
            placement += f", refit via {self.generator.transport}"
        logger.info(
            f"{self.algorithm}: {len(self.train_problems)} train / {len(self.val_problems)} validation problems; "
            f"{cfg.grpo.prompts_per_step} prompts x {cfg.grpo.generations_per_prompt} generations per step; "
            f"{self.total_steps} steps; generation {cfg.generation.backend} ({placement}); "
            f"{self.run_description()}run dir {self.run_dir}"
            + (f"; resumed from {resume_from}" if resume_from else "")
        )

        def log(step: int, metrics: dict[str, float]) -> None:
            if not metrics:
                return
            logger.log(step, metrics)
            result.history.append({"step": step, **metrics})

        deadline = Deadline(cfg.checkpoint.deadline_s)
        try:
            with graceful_stop() as stop:
                if step == 0 and cfg.grpo.val_at_start:
                    log(0, self.validate())
                    self.timer.pop()
                if self.async_rollouts is not None:
                    self.async_rollouts.start()
                done_here = 0
                while step < self.total_steps and (stop_after is None or done_here < stop_after):
                    if stop.requested:
                        break
                    if deadline.should_stop():
                        result.stopped_by_deadline = True
                        logger.info(
                            f"checkpoint.deadline_s={cfg.checkpoint.deadline_s} reached at step {step}"
                        )
                        break
                    start = time.perf_counter()
                    rollouts, collect_stats = self.collect(step)
                    batch_metrics, train_metrics = {}, {}
                    if collect_stats.get("dapo/short_batch"):
                        kept = int(collect_stats["dapo/kept_groups"])
                        logger.info(
                            f"step {step + 1}: dynamic sampling kept {kept} of {cfg.grpo.prompts_per_step} groups "
                            f"after dapo.max_generation_rounds={cfg.dapo.max_generation_rounds}; "
                            + ("training on those" if kept else "no update this step")
                        )
                    if rollouts.trajectories:
                        batch, batch_metrics = self.make_batch(rollouts)
                        train_metrics = self.train_on(batch)
                    step, done_here = step + 1, done_here + 1
                    metrics = {**rollouts.env_metrics, **collect_stats, **batch_metrics, **train_metrics}
                    metrics.update(self.timer.pop())
                    metrics["timing/step"] = time.perf_counter() - start
                    log(step, metrics)
                    self.write_samples(step, rollouts)
                    if step % cfg.grpo.val_every == 0 or step == self.total_steps:
                        log(step, self.validate())
                    deadline.record_step(time.perf_counter() - start)  # with validation, if any
                    if cfg.checkpoint.enabled and step % cfg.checkpoint.save_every == 0:
                        saving = time.perf_counter()
                        result.last_checkpoint = self.save(step, result.history)
                        deadline.record_save(time.perf_counter() - saving)
                result.step = step
                # the last finished step, unless saved already (none before the first step on a signal)
                unsaved = result.last_checkpoint is None or result.last_checkpoint.name != f"step_{step:06d}"
                if cfg.checkpoint.enabled and unsaved and (step > 0 or not stop.requested):
                    result.last_checkpoint = self.save(step, result.history)
                stop.raise_if_requested()
        except KeyboardInterrupt:
            print_interrupted(self.checkpointer.latest())
            raise
        except WorkerLostError as e:
            raise e.with_checkpoint(self.checkpointer.latest()) from None
        finally:
            if self.async_rollouts is not None:
                self.async_rollouts.stop()
            logger.info(run_summary(result, self.total_steps, cfg.checkpoint))
            logger.close()
            if cfg.logging.plots:
                plot_run(self.run_dir, self.plots)
        return result


def run_grpo(cfg: GRPOConfig, *, stop_after: int | None = None) -> GRPOResult:
    trainer = GRPOTrainer(cfg)
    try:
        return trainer.fit(stop_after=stop_after)
    finally:
        trainer.shutdown()
