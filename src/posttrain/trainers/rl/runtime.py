"""The RL runtime: what GRPO, PPO, on-policy distillation and REINFORCE-MA share.

`RLRuntime` holds the workers and data of one run: the tokenizer and tasks, the policy's worker
group (and π_ref, a colocated teacher or critic inside it, as the algorithm asks), the generator
(the policy itself when colocated, generation workers when split), the environment workers, a
split teacher, the sampler and the checkpointer. It generates rollouts, refits the generator after
every update and checks that it runs the policy's weights, validates, saves and restores: it is
the run loop's `Trainer` (`posttrain.trainers.loop`), one step being collect, make the batch, train
on it. The algorithm (`posttrain.trainers.rl.protocol.RLAlgorithm`) makes the batch and trains on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from posttrain.config.rollout import (
    EnvironmentConfig,
    environment_sections,
    episode_token_budget,
    turn_token_limit,
)
from posttrain.data.batching import EpochSampler, MixtureSampler
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
from posttrain.environments.tools import prompt_ids_of
from posttrain.generation.sampling import SamplingParams
from posttrain.generation.worker import refit_cast_dtype
from posttrain.logging import Timer
from posttrain.modeling.tokenizer import training_tokenizer
from posttrain.rollout.agent import run_agent_rollouts
from posttrain.rollout.episode import start_episodes
from posttrain.rollout.multienv import (
    EnvironmentSet,
    batch_sampler,
    environment_batch_metrics,
    environment_validation_metrics,
    held_out_metrics,
    mixed_rollouts,
    source_tasks,
)
from posttrain.rollout.rollout import RLBatch, Rollouts, run_rollouts, transcript
from posttrain.rollout.tasks import rl_tasks
from posttrain.trainers.common import (
    load_controller_state,
    make_checkpointer,
    prepare_run_dir,
    sampling_params,
    save_controller_state,
    seed_everything,
)
from posttrain.trainers.loop import RunPlan, RunResult, run_loop
from posttrain.trainers.rl.asynchronous import AsyncRollouts
from posttrain.trainers.rl.protocol import RLAlgorithm


class RLRuntime:
    """The workers and data of one RL run, a `Trainer` of the run loop (`fit()` runs it); `algorithm`
    makes and trains the batches."""

    def __init__(self, cfg: Any, algorithm: RLAlgorithm) -> None:
        self.cfg, self.algorithm, self.loop = cfg, algorithm, algorithm.loop
        from posttrain.models.hub import resolve_model

        self.model_path = resolve_model(cfg.policy.model_name)  # a missing model fails before the run dir
        self.run_dir = prepare_run_dir(cfg.logging.run_dir, algorithm.run_kind, cfg)
        seed_everything(self.loop.seed)
        self.tokenizer, tokenizer_path = training_tokenizer(
            cfg.policy.tokenizer_name or self.model_path, cfg.policy.chat_template, self.run_dir,
            "policy.chat_template",
        )  # fmt: skip
        turn = max(turn_token_limit(cfg.generation, e) for e in environment_sections(cfg).values())
        max_prompt = cfg.policy.max_seq_len - turn
        if max_prompt <= 0:
            raise ValueError(
                f"policy.max_seq_len ({cfg.policy.max_seq_len}) must exceed a turn's max_new_tokens "
                f"({turn}) to leave room for the prompt"
            )
        if cfg.environments is None:
            tasks = rl_tasks(cfg.data, cfg.environment, tokenizer=self.tokenizer, max_prompt_len=max_prompt)
            self.sampler = EpochSampler(len(tasks.train), self.loop.prompts_per_step, seed=self.loop.seed)
        else:
            tasks = source_tasks(
                cfg.data, cfg.environments, tokenizer=self.tokenizer, max_prompt_len=max_prompt
            )
            self.sampler = batch_sampler(tasks, cfg.data, self.loop.prompts_per_step, seed=self.loop.seed)
        self.train_problems, self.val_problems, self.held_out_dropped = tasks[:3]
        self.plan = RunPlan(
            self.loop.max_steps, self.loop.val_every, self.loop.val_at_start, tuple(algorithm.plots),
            step_logs=("metrics.jsonl", "samples.jsonl"),
        )  # fmt: skip
        self.next_group_id = 0
        self.checkpointer = make_checkpointer(self.run_dir / "checkpoints", cfg.checkpoint)
        # the policy trains softmax(logits / T), the distribution rollouts are sampled from
        self.policy_cfg = cfg.policy.model_copy(
            update={"logprob_temperature": cfg.generation.temperature or 1.0}
        )
        self.split = cfg.generation.placement == "split"
        transport = (
            cfg.generation.resolved_refit_transport(cfg.cluster, cfg.policy.split_weights)
            if self.split
            else None
        )
        self.policy, self.teacher = self.build_policy(tokenizer_path, transport)
        # weights move to a separate engine after every update: split workers or a colocated vLLM
        # a generator with weights of its own: split workers, a vLLM engine, the HF sampler's copy in
        # generation.hf.dtype (colocated HF otherwise samples with the trained model itself)
        self.refits = (
            self.split
            or cfg.generation.backend == "vllm"
            or cfg.generation.sampling_dtype(cfg.policy.dtype) != cfg.policy.dtype
        )
        self.engine_dtype = refit_cast_dtype(cfg.generation, cfg.policy)  # the refit check casts to it
        self.split_generator: GenerationGroup | None = None
        if self.split:
            self.split_generator = GenerationGroup(
                cfg.generation, self.policy_cfg, cfg.cluster, model_path=self.model_path,
                tokenizer_path=tokenizer_path, transport=transport,
            )  # fmt: skip
        self.generator: ActorGroup | GenerationGroup = self.split_generator or self.policy
        self.environment: EnvironmentGroup | EnvironmentSet = (
            self.environment_group(cfg.environment)
            if cfg.environments is None
            else EnvironmentSet({name: self.environment_group(e) for name, e in cfg.environments.items()})
        )
        self.timer = Timer()
        # episodes without a turn barrier run where the sampler is: a vLLM engine, or an HF model that is
        # whole on each worker (an FSDP2-sharded colocated policy decodes collectively: turn by turn);
        # over several environments, each environment's own turn_barrier applies too
        sharded_hf = cfg.policy.fsdp and not self.split and cfg.generation.backend != "vllm"
        self.turn_barrier = (cfg.environments is None and cfg.environment.turn_barrier) or sharded_hf
        probe_tasks = self.train_problems[: cfg.generation.refit_check.prompts]
        starts = start_episodes(self.environment, probe_tasks, list(range(len(probe_tasks))))
        self.probe_prompts = [prompt_ids_of(self.tokenizer, s) for s in starts]
        self.policy_version = 0  # policy updates so far; every trajectory records the one it was sampled with
        self.async_rollouts = (
            AsyncRollouts(self, self.loop, self.split_generator) if algorithm.async_mode else None
        )

    def build_policy(
        self, tokenizer_path: str, transport: str | None
    ) -> tuple[ActorGroup, TeacherGroup | None]:
        """The policy's worker group as the algorithm asks (`policy_workers`) and, when the config has
        a `teacher` section, the teacher's group (split teacher, or one held by the policy's workers:
        `StudentGroup`); else None."""
        cfg = self.cfg
        workers = self.algorithm.policy_workers(self.model_path)
        teacher_cfg = getattr(cfg, "teacher", None)  # distill's; GRPO's with on_policy_distill
        teacher_path, teacher_cut, held_teacher = self.teacher_setup(teacher_cfg)
        policy = (StudentGroup if held_teacher else workers.group)(
            self.policy_cfg,
            cfg.cluster,
            model_path=self.model_path,
            total_steps=workers.optimizer_steps,
            tokenizer_path=tokenizer_path,
            reference=workers.reference,
            generation=None if self.split else cfg.generation,
            # generation workers map the policy's weights, which then live in shared memory
            shared_weights=transport == "shared_memory",
            lora_adapter_refit=cfg.generation.vllm.lora_adapter,
            **workers.kwargs,
            **({"teacher": held_teacher} if held_teacher else {}),
        )
        if teacher_cfg is None:
            return policy, None
        teacher = TeacherGroup(
            teacher_cfg, cfg.cluster, model_path=teacher_path, vocab_size=teacher_cut, student=policy
        )
        return policy, teacher

    def teacher_setup(self, teacher: Any) -> tuple[str | None, int | None, dict[str, Any] | None]:
        """(teacher folder, vocabulary cut, the teacher's worker arguments when the policy workers
        hold it (colocated) else None); (None, None, None) without a teacher."""
        if teacher is None:
            return None, None, None
        path, cut = prepare_teacher(
            teacher.model_name,
            teacher.tokenizer_name,
            student_tokenizer=self.tokenizer,
            student_path=self.model_path,
            student_name=self.cfg.policy.model_name,
        )
        held = teacher_worker_kwargs(teacher, model_path=path, vocab_size=cut)
        return path, cut, held if teacher.placement == "colocated" else None

    def environment_group(self, environment: EnvironmentConfig) -> EnvironmentGroup:
        """The worker group of one of the run's environments (`environment`, or one of `environments`)."""
        return EnvironmentGroup(
            environment.name,
            environment.kwargs,
            num_workers=environment.num_workers,
            backend=self.cfg.cluster.backend,
            max_concurrent_steps=environment.max_concurrent_steps,
        )

    # ---------------------------------------------------------------- rollouts
    def rollouts(
        self,
        problems: list[Task],
        generations: int,
        params: SamplingParams,
        timer: Timer | None = None,
        progress: str = "generation",
    ) -> Rollouts:
        """G rollouts per problem; `progress` names the phase's bar on a terminal. Over several
        environments, each environment's problems with that environment (`mixed_rollouts`; its
        sampling seed moved by its place among them), in input order."""
        cfg = self.cfg
        if cfg.environments is None:
            out = self.environment_rollouts(
                cfg.environment, self.environment, problems, generations, params, timer, progress
            )
        else:
            run = functools.partial(
                self.named_rollouts, generations=generations, params=params, timer=timer, progress=progress
            )
            out = mixed_rollouts(
                problems, run, names=list(cfg.environments), first_group_id=self.next_group_id
            )
        self.next_group_id += len(problems)
        for t in out.trajectories:
            t.policy_version = self.policy_version
        if cfg.generation.vllm.sleep and not self.split:
            self.policy.sleep_generator()  # free the engine's memory for training
        return out

    def named_rollouts(
        self,
        name: str,
        tasks: list[Task],
        *,
        generations: int,
        params: SamplingParams,
        timer: Timer | None,
        progress: str,
    ) -> Rollouts:
        """The rollouts of environment `name`'s tasks of a batch over several environments, sampled
        with the batch's seed + 7919·k for the k-th of `environments` (from 0)."""
        names = list(self.cfg.environments)
        seed = None if params.seed is None else params.seed + 7_919 * names.index(name)
        groups = self.environment.groups  # type: ignore[union-attr]  # an EnvironmentSet here
        own = dataclasses.replace(params, seed=seed)
        env = self.cfg.environments[name]
        return self.environment_rollouts(
            env, groups[name], tasks, generations, own, timer, f"{progress} ({name})"
        )

    def environment_rollouts(
        self,
        env: EnvironmentConfig,
        environment: EnvironmentGroup,
        problems: list[Task],
        generations: int,
        params: SamplingParams,
        timer: Timer | None,
        progress: str,
    ) -> Rollouts:
        """G rollouts per problem with one environment (`env` its config, `environment` its workers),
        groups numbered from `next_group_id`, each turn at most `env`'s max_new_tokens
        (`turn_token_limit`). With `env.agent` the user's agent plays them through the endpoint
        (`run_agent_rollouts`)."""
        cfg = self.cfg
        params = dataclasses.replace(params, max_new_tokens=turn_token_limit(cfg.generation, env))
        out = (run_rollouts if env.agent is None else functools.partial(run_agent_rollouts, agent=env.agent))(
            problems,
            generations_per_prompt=generations,
            generator=self.generator,
            environment=environment,
            tokenizer=self.tokenizer,
            params=params,
            batch_size=cfg.generation.batch_size,
            max_turns=env.max_turns,
            max_seq_len=cfg.policy.max_seq_len,
            max_observation_tokens=env.max_observation_tokens,
            max_episode_tokens=episode_token_budget(cfg.generation, env),
            first_group_id=self.next_group_id,
            timer=timer or self.timer,
            turn_barrier=env.turn_barrier or self.turn_barrier,
            progress=progress,
        )
        check_verifier_errors([t.info for t in out.trajectories], env.max_error_fraction, env.name)
        return out

    def draw(
        self, step: int, round_: int = 1, *, timer: Timer | None = None, partial_rollouts: bool = False
    ) -> Rollouts:
        """One round of rollouts for `step` (round 1, 2, ...): the sampler's next prompts, G =
        loop.generations_per_prompt each, sampled with the seed (loop.seed, step, round).
        `partial_rollouts`: the workers may load newer weights between decode steps (async)."""
        problems = [self.train_problems[i] for i in self.sampler.next_batch()]
        seed = self.loop.seed * 1_000_003 + step * 101 + round_
        params = sampling_params(self.cfg.generation, seed)
        if partial_rollouts:
            params = dataclasses.replace(params, partial_rollouts=True)
        return self.rollouts(problems, self.loop.generations_per_prompt, params, timer)

    def collect(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """The rollouts of one step: the replay buffer's next groups (async), else the algorithm's."""
        if self.async_rollouts is not None:
            return self.async_rollouts.next_rollouts(step)
        return self.algorithm.collect(step)

    # ---------------------------------------------------------------- the policy's side
    def policy_logprobs(self, batch: RLBatch, *, reference: bool, old: bool) -> tuple[Any, Any]:
        """(π_ref's, π_old's) logprobs [B, T] of the batch, each computed only when asked and absent
        from the batch (else the batch's own, or None)."""
        ref, old_lp = batch.reference_logprobs, batch.old_logprobs
        if reference and ref is None:
            with self.timer("reference_logprobs"):
                ref = self.policy.reference_logprobs(batch)
        if old and old_lp is None:
            with self.timer("old_logprobs"):
                old_lp = self.policy.logprobs(batch)
        return ref, old_lp

    def policy_updated(self) -> dict[str, float]:
        """After an update: one more policy version, and the generator gets the new weights (`refit`)."""
        self.policy_version += 1
        return self.refit()

    def refit(self) -> dict[str, float]:
        """Give the generator the policy's weights, then check that it runs them (the parity gate)."""
        if self.async_rollouts is not None:  # the generator loads it between its batches
            return self.async_rollouts.publish(self.policy_version)
        if not self.refits:
            return {}
        with self.timer("refit"):
            if self.split_generator is not None:
                self.split_generator.refit(self.policy)
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
                sampling_params(self.cfg.generation, self.loop.seed),
                self.tokenizer.pad_token_id,
                engine_dtype=self.engine_dtype,
            )

    # ---------------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        if not self.val_problems:
            return {}
        if self.async_rollouts is not None:
            with self.async_rollouts.synced():  # generation paused; the generator has the newest weights
                self.check_generator()
                return self.validate_now()
        return self.validate_now()

    def validate_now(self) -> dict[str, float]:
        n = self.loop.val_samples_per_prompt
        start = time.perf_counter()
        params = sampling_params(self.cfg.generation, self.loop.seed, self.loop.val_temperature)
        # its own timer: validation's generation must not count in the next training step's timings
        r = self.rollouts(self.val_problems, n, params, timer=Timer(), progress="validation")
        metrics = {
            **{f"val/{k}": v for k, v in held_out_metrics(r, n).items()},
            "timing/validation": time.perf_counter() - start,
            # the environment's own metrics of the held-out episodes (val/env/solved_rate, ...)
            **{f"val/{k}": v for k, v in r.env_metrics.items() if k.startswith("env/")},
        }
        if self.cfg.environments is not None:  # val/<name>/accuracy, ... per environment
            metrics.update(environment_validation_metrics(r, n, list(self.cfg.environments)))
        return metrics

    def write_samples(self, step: int, rollouts: Rollouts, count: int = 4) -> None:
        """A few trajectories per step in samples.jsonl, to read what the model writes."""
        with open(self.run_dir / "samples.jsonl", "a") as f:
            for t in rollouts.trajectories[:count]:
                named = {"task_name": t.task_name} if t.task_name is not None else {}
                f.write(json.dumps({"step": step, **named, **transcript(t)}, default=str) + "\n")

    # ---------------------------------------------------------------- state
    def save(self, step: int, metrics: dict[str, float]) -> Path:
        def write(directory: Path) -> None:
            self.policy.save_checkpoint(directory)
            self.algorithm.save_state(directory)
            self.tokenizer.save_pretrained(directory / "model")  # a self-contained HF folder
            state = {"sampler": self.sampler.state_dict(), "next_group_id": self.next_group_id}
            save_controller_state(directory, step, state, self.cfg)
            if self.async_rollouts is not None:
                self.async_rollouts.save(directory)

        if self.async_rollouts is None:
            return self.checkpointer.save(step, write, metrics=metrics)
        with self.async_rollouts.paused():  # the sampler's position matches the buffer's contents
            return self.checkpointer.save(step, write, metrics=metrics)

    def restore(self, checkpoint: Path | None) -> int:
        """Load `checkpoint` and refit the generator; a fresh run (None) checks the generator instead."""
        if checkpoint is None:
            if self.refits:
                # same weights on both sides yet: proves the check itself holds; an engine that serves
                # the LoRA adapter (generation.vllm.lora_adapter) starts without one and gets it here
                self.refit() if self.cfg.generation.vllm.lora_adapter else self.check_generator()
                self.timer.pop()
            return 0
        self.policy.load_checkpoint(checkpoint)
        state = load_controller_state(checkpoint)
        self.algorithm.load_state(checkpoint, state["step"])
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
        self.algorithm.close()
        self.environment.shutdown()
        if self.teacher is not None:
            self.teacher.shutdown()
        if self.split_generator is not None:
            self.split_generator.shutdown()
        self.policy.shutdown()

    # ---------------------------------------------------------------- the run loop's side
    def describe(self) -> list[str]:
        cfg, loop = self.cfg, self.loop
        placement = cfg.generation.placement
        if self.split_generator is not None:
            placement += f", refit via {self.split_generator.transport}"
        held_out = (
            f"held out: {self.held_out_dropped} training problems are validation problems and were "
            "dropped (data.exclude_validation_from_train)"
        )
        return [
            f"{self.algorithm.name}: {len(self.train_problems)} train / {len(self.val_problems)} validation problems; "
            f"{loop.prompts_per_step} prompts x {loop.generations_per_prompt} generations per step; "
            f"{loop.max_steps} steps; generation {cfg.generation.backend} ({placement}); "
            f"{self.algorithm.describe()}run dir {self.run_dir}",
            *([held_out] if self.held_out_dropped else []),
            *([self.sampler.describe()] if isinstance(self.sampler, MixtureSampler) else []),
        ]

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The asynchronous rollouts (if any) generate while the steps run."""
        self.timer.pop()  # the first validation's timings are not step 1's
        if self.async_rollouts is None:
            yield
            return
        self.async_rollouts.start()
        try:
            yield
        finally:
            self.async_rollouts.stop()

    def train_step(self, step: int, info: Callable[[str], None]) -> dict[str, float]:
        """Step `step + 1`: collect its rollouts, then (unless dynamic sampling kept none) the
        algorithm's batch and update; a few samples go to samples.jsonl."""
        start = time.perf_counter()
        rollouts, collect_stats = self.collect(step)
        batch_metrics, train_metrics = {}, {}
        if collect_stats.get("dapo/short_batch"):
            kept = int(collect_stats["dapo/kept_groups"])
            rounds = int(collect_stats["dapo/generation_rounds"])  # = dapo.max_generation_rounds
            info(
                f"step {step + 1}: dynamic sampling kept {kept} of {self.loop.prompts_per_step} groups "
                f"after dapo.max_generation_rounds={rounds}; "
                + ("training on those" if kept else "no update this step")
            )
        if rollouts.trajectories:
            batch, batch_metrics = self.algorithm.make_batch(rollouts)
            train_metrics = self.algorithm.train_on(batch)
        metrics = {**rollouts.env_metrics, **collect_stats, **batch_metrics, **train_metrics}
        if self.cfg.environments is not None:  # <name>/share, <name>/reward/mean per environment
            metrics.update(environment_batch_metrics(rollouts, list(self.cfg.environments)))
        metrics.update(self.timer.pop())
        metrics["timing/step"] = time.perf_counter() - start
        self.write_samples(step + 1, rollouts)
        return metrics

    def fit(self, *, stop_after: int | None = None) -> RunResult:
        """`run_loop` on this runtime (from checkpoint.resume: the latest checkpoint by default); its
        workers stay up for another call and for the caller to read the policy (`shutdown()`
        releases them)."""
        return run_loop(self, stop_after=stop_after, keep_workers=True)
