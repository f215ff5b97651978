"""On-policy distillation: the student learns from a teacher on the student's own samples.

One step:
  1. sample `prompts_per_step` tasks and G = `generations_per_prompt` episodes each with the STUDENT
     (any generation backend and placement; multi-turn environments and tools included);
  2. the TEACHER scores every generated token: its top-k log-probabilities and ids per position
     (`distill.topk_logits_k`, never the full vocabulary), the log-mass outside them and its
     log-probability of the token;
  3. the student minimises the divergence D(teacher ‖ student) (``distill.loss``: forward, reverse,
     mixed KL or generalised JSD over the top-k, with a tail bucket or renormalised; see
     posttrain.algorithms.distillation) at its generated tokens, normalised by the GLOBAL token count.
No rewards, advantages or reference model enter the loss; the environment's rewards are logged.
Generation uses the training weights in place (colocated) or separate workers refitted after every
update (split), as in GRPO.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from posttrain.algorithms.distillation import distillation_loss
from posttrain.algorithms.metrics import pass_at_k
from posttrain.checkpoint import Deadline, resolve_resume
from posttrain.config.schema import DatasetConfig, DistillConfig
from posttrain.data.batching import EpochSampler
from posttrain.data.tasks import Task
from posttrain.distributed.actor_group import GenerationGroup
from posttrain.distributed.refit_check import check_refit
from posttrain.distributed.teacher_group import StudentGroup, TeacherGroup, teacher_worker_kwargs
from posttrain.environments.group import EnvironmentGroup
from posttrain.errors import WorkerLostError
from posttrain.logging import MetricsLogger, Timer
from posttrain.logging.plots import plot_run
from posttrain.models.actor import refit_cast_dtype
from posttrain.models.distill_logprobs import StudentTopK
from posttrain.models.generation import SamplingParams
from posttrain.models.student import DistillBatch
from posttrain.models.teacher import prepare_teacher
from posttrain.models.tokenizer import load_tokenizer
from posttrain.rollout.rollout import (
    Rollouts,
    build_rl_batch,
    prompt_ids_of,
    run_rollouts,
    start_episodes,
    transcript,
)
from posttrain.rollout.tasks import load_tasks
from posttrain.trainers.common import (
    latest_values,
    load_controller_state,
    make_checkpointer,
    prepare_run_dir,
    print_interrupted,
    save_controller_state,
    seed_everything,
    sigterm_as_interrupt,
)

PLOTS = [
    "distill/divergence",
    "distill/top1_agreement",
    "distill/sampled_reverse_kl",
    "val/accuracy",
    "reward/mean",
    "response_length",
    "timing/teacher",
    "timing/step",
]


def distill_loss_fn(
    student: StudentTopK,
    batch: DistillBatch,
    normalizer: float,
    *,
    divergence: str = "mixed_kl",
    top_k_mode: str = "tail",
    mixed_kl_weight: float = 0.5,
    jsd_beta: float = 0.5,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The top-k divergence at the batch's generated tokens (``distillation_loss``, exact tails from
    both sides) and metrics, each this microbatch's share of a global per-token mean:

    distill/divergence: the loss's divergence; distill/top1_agreement: student argmax = teacher argmax;
    distill/teacher_topk_mass, distill/student_topk_mass: Σ of the top-k probabilities;
    distill/sampled_reverse_kl: log q(a_t) - log p(a_t) at the sampled tokens, an unbiased estimate
    of the full-vocabulary KL(student ‖ teacher) (on-policy samples), whatever k;
    distill/student_logprob: log q(a_t) (minus an entropy estimate)."""
    selected = batch.loss_mask.bool().clone()
    selected[:, 0] = False
    mask = batch.loss_mask[selected]
    teacher_lp = batch.teacher_topk_logprobs[selected]
    loss, per_token = distillation_loss(
        student.topk_logits,
        student.logsumexp,
        teacher_lp,
        mask,
        normalizer=normalizer,
        divergence=divergence,
        top_k_mode=top_k_mode,  # type: ignore[arg-type]
        student_tail_logsumexp=student.tail_logsumexp,
        teacher_tail_logprob=batch.teacher_tail_logprob[selected],
        mixed_kl_weight=mixed_kl_weight,
        jsd_beta=jsd_beta,
    )
    with torch.no_grad():
        m = mask.double()
        agree = (student.top1 == batch.teacher_topk_indices[selected][:, 0].long()).double()
        student_mass = torch.logsumexp(student.topk_logits.double(), -1) - student.logsumexp.double()
        sampled = student.sampled_logprobs.double()
        metrics = {
            "distill/divergence": float((per_token.double() * m).sum() / normalizer),
            "distill/top1_agreement": float((agree * m).sum() / normalizer),
            "distill/teacher_topk_mass": float((teacher_lp.double().exp().sum(-1) * m).sum() / normalizer),
            "distill/student_topk_mass": float((student_mass.exp() * m).sum() / normalizer),
            "distill/sampled_reverse_kl": float(
                ((sampled - batch.teacher_logprobs[selected].double()) * m).sum() / normalizer
            ),
            "distill/student_logprob": float((sampled * m).sum() / normalizer),
        }
    return loss, metrics


@dataclass
class DistillResult:
    run_dir: Path
    step: int
    history: list[dict[str, float]] = field(default_factory=list)
    last_checkpoint: Path | None = None
    stopped_by_deadline: bool = False


class DistillTrainer:
    """Holds the student, teacher, generation and environment workers of one run; `fit()` is the loop."""

    def __init__(self, cfg: DistillConfig) -> None:
        self.cfg = cfg
        self.run_dir = prepare_run_dir(cfg.logging.run_dir, "distill", cfg)
        seed_everything(cfg.distill.seed)
        from posttrain.models.hub import resolve_model

        self.model_path = resolve_model(cfg.policy.model_name)
        tokenizer_path = cfg.policy.tokenizer_name or self.model_path
        self.tokenizer = load_tokenizer(tokenizer_path)
        teacher_path, cut = prepare_teacher(
            cfg.teacher.model_name,
            cfg.teacher.tokenizer_name,
            student_tokenizer=self.tokenizer,
            student_path=self.model_path,
            student_name=cfg.policy.model_name,
        )
        max_prompt = cfg.policy.max_seq_len - cfg.generation.max_new_tokens
        if max_prompt <= 0:
            raise ValueError(
                f"policy.max_seq_len ({cfg.policy.max_seq_len}) must exceed generation.max_new_tokens "
                f"({cfg.generation.max_new_tokens}) to leave room for the prompt"
            )
        self.train_problems = self.build_tasks(cfg.data.train, max_prompt)
        self.val_problems = self.build_tasks(cfg.data.validation, max_prompt) if cfg.data.validation else []
        d = cfg.distill
        self.sampler = EpochSampler(len(self.train_problems), d.prompts_per_step, seed=d.seed)
        self.next_group_id = 0
        self.checkpointer = make_checkpointer(self.run_dir / "checkpoints", cfg.checkpoint)
        # the student trains softmax(logits / T), the distribution its samples come from
        policy_cfg = cfg.policy.model_copy(update={"logprob_temperature": cfg.generation.temperature or 1.0})
        self.split = cfg.generation.placement == "split"
        transport = (
            cfg.generation.resolved_refit_transport(cfg.cluster, cfg.policy.split_weights)
            if self.split
            else None
        )
        colocated_teacher = cfg.teacher.placement == "colocated"
        self.policy = StudentGroup(
            policy_cfg,
            cfg.cluster,
            model_path=self.model_path,
            total_steps=d.max_steps * d.updates_per_batch,
            tokenizer_path=tokenizer_path,
            generation=None if self.split else cfg.generation,
            shared_weights=transport == "shared_memory",
            lora_adapter_refit=cfg.generation.vllm.lora_adapter,
            teacher=teacher_worker_kwargs(cfg.teacher, model_path=teacher_path, vocab_size=cut)
            if colocated_teacher
            else None,
        )
        self.teacher = TeacherGroup(
            cfg.teacher, cfg.cluster, model_path=teacher_path, vocab_size=cut, student=self.policy
        )
        self.generator: StudentGroup | GenerationGroup = self.policy
        self.refits = self.split or cfg.generation.backend == "vllm"
        self.engine_dtype = refit_cast_dtype(cfg.generation, cfg.policy)
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
        )
        self.loss_fn_knobs = dict(
            divergence=d.loss, top_k_mode=d.top_k_mode, mixed_kl_weight=d.mixed_kl_weight, jsd_beta=d.jsd_beta
        )
        self.timer = Timer()
        probe_tasks = self.train_problems[: cfg.generation.refit_check.prompts]
        starts = start_episodes(self.environment, probe_tasks, list(range(len(probe_tasks))))
        self.probe_prompts = [prompt_ids_of(self.tokenizer, s) for s in starts]

    def build_tasks(self, split: DatasetConfig, max_prompt_len: int) -> list[Task]:
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
        return SamplingParams(
            temperature=self.cfg.distill.val_temperature if validation else g.temperature,
            top_p=g.top_p,
            top_k=g.top_k,
            max_new_tokens=g.max_new_tokens,
            stop_strings=tuple(g.stop_strings),
            seed=seed,
        )

    def rollouts(
        self, problems: list[Task], generations: int, params: SamplingParams, timer: Timer | None = None
    ) -> Rollouts:
        """The student's episodes (the rollout code GRPO uses: any environment, several turns)."""
        out = run_rollouts(
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
            first_group_id=self.next_group_id,
            timer=timer or self.timer,
        )
        self.next_group_id += len(problems)
        if self.cfg.generation.vllm.sleep and not self.split:
            self.policy.sleep_generator()
        return out

    def collect(self, step: int) -> Rollouts:
        d = self.cfg.distill
        problems = [self.train_problems[i] for i in self.sampler.next_batch()]
        seed = d.seed * 1_000_003 + step * 101 + 1
        return self.rollouts(
            problems, d.generations_per_prompt, self.sampling_params(validation=False, seed=seed)
        )

    def make_batch(self, rollouts: Rollouts) -> tuple[DistillBatch, dict[str, float]]:
        """The rollout batch with the teacher's top-k at every generated token."""
        d = self.cfg.distill
        rl = build_rl_batch(
            rollouts.trajectories, torch.zeros(len(rollouts.trajectories)), self.tokenizer.pad_token_id
        )
        batch = DistillBatch.of(rl)
        with self.timer("teacher"):
            batch = batch.with_teacher(self.teacher.topk(batch, d.topk_logits_k, d.teacher_temperature))
        rewards = rollouts.rewards
        metrics = {
            "reward/mean": float(rewards.mean()),
            "response_length": float(rollouts.response_lengths.mean()),
            "truncation_rate": float(rollouts.truncated.float().mean()),
            "distill/tokens": float(batch.loss_mask.sum()),
        }
        return batch, metrics

    def train_on(self, batch: DistillBatch) -> dict[str, float]:
        """`updates_per_batch` optimizer steps over contiguous minibatches, each normalised by its own
        global count of generated tokens."""
        metrics: dict[str, float] = {}
        minibatches = batch.chunks(self.cfg.distill.updates_per_batch)
        with self.timer("training"):
            for mb in minibatches:
                normalizer = max(1.0, float(mb.loss_mask[:, 1:].sum()))
                loss_fn = functools.partial(distill_loss_fn, **self.loss_fn_knobs)
                out = self.policy.train(mb, loss_fn, normalizer)
                for k, v in out.loss_metrics.items():
                    metrics[k] = metrics.get(k, 0.0) + v / len(minibatches)
                metrics["grad_norm"], metrics["lr"] = out.grad_norm, out.lr
        metrics.update(self.refit())
        return metrics

    def refit(self) -> dict[str, float]:
        """Give the generator the student's weights, then check that it runs them."""
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
                self.sampling_params(validation=False, seed=self.cfg.distill.seed),
                self.tokenizer.pad_token_id,
                engine_dtype=self.engine_dtype,
            )

    def validate(self) -> dict[str, float]:
        """The student's held-out accuracy (and pass@n), as GRPO measures it."""
        if not self.val_problems:
            return {}
        n = self.cfg.distill.val_samples_per_prompt
        start = time.perf_counter()
        params = self.sampling_params(validation=True, seed=self.cfg.distill.seed)
        r = self.rollouts(self.val_problems, n, params, timer=Timer())
        correct = [bool(t.info.get("correct", t.reward >= 1.0)) for t in r.trajectories]
        per_problem = [sum(correct[i * n : (i + 1) * n]) for i in range(len(self.val_problems))]
        metrics = {
            "val/accuracy": sum(correct) / len(correct),
            "val/reward": float(r.rewards.mean()),
            "val/response_length": float(r.response_lengths.mean()),
            "timing/validation": time.perf_counter() - start,
        }
        if n > 1:
            metrics[f"val/pass@{n}"] = sum(pass_at_k(n, c, n) for c in per_problem) / len(per_problem)
        return metrics

    def write_samples(self, step: int, rollouts: Rollouts, count: int = 4) -> None:
        with open(self.run_dir / "samples.jsonl", "a") as f:
            for t in rollouts.trajectories[:count]:
                f.write(json.dumps({"step": step, **transcript(t)}, default=str) + "\n")

    # ---------------------------------------------------------------- state
    def save(self, step: int, history: list[dict[str, float]]) -> Path:
        def write(directory: Path) -> None:
            self.policy.save_checkpoint(directory)
            self.tokenizer.save_pretrained(directory / "model")
            state = {"sampler": self.sampler.state_dict(), "next_group_id": self.next_group_id}
            save_controller_state(directory, step, state, self.cfg)

        return self.checkpointer.save(step, write, metrics=latest_values(history, step))

    def restore(self, checkpoint: Path) -> int:
        self.policy.load_checkpoint(checkpoint)
        state = load_controller_state(checkpoint)
        self.sampler.load_state_dict(state["sampler"])
        self.next_group_id = state["next_group_id"]
        self.refit()
        self.timer.pop()
        return state["step"]

    def shutdown(self) -> None:
        self.environment.shutdown()
        self.teacher.shutdown()
        if self.split:
            self.generator.shutdown()
        self.policy.shutdown()

    # ---------------------------------------------------------------- loop
    def step(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """One distillation step: student rollouts, teacher scores, update. Returns its metrics."""
        rollouts = self.collect(step)
        batch, metrics = self.make_batch(rollouts)
        metrics.update(self.train_on(batch))
        metrics.update(rollouts.env_metrics)
        return rollouts, metrics

    def fit(self, *, stop_after: int | None = None) -> DistillResult:
        cfg, d = self.cfg, self.cfg.distill
        resume_from = resolve_resume(cfg.checkpoint.resume, self.checkpointer)
        step = self.restore(resume_from) if resume_from else 0
        if not resume_from and self.refits:
            # same weights on both sides yet: proves the check itself holds; an engine that serves the
            # LoRA adapter (generation.vllm.lora_adapter) starts without one and gets it here
            self.refit() if cfg.generation.vllm.lora_adapter else self.check_generator()
            self.timer.pop()
        result = DistillResult(self.run_dir, step, last_checkpoint=resume_from)
        logger = MetricsLogger(
            cfg.logging, self.run_dir, total_steps=d.max_steps, start_step=step, config=cfg
        )
        logger.info(
            f"distill: {len(self.train_problems)} train / {len(self.val_problems)} validation problems; "
            f"{d.prompts_per_step} prompts x {d.generations_per_prompt} samples per step; {d.max_steps} steps; "
            f"loss {d.loss} over the teacher's top-{d.topk_logits_k} ({d.top_k_mode}); teacher "
            f"{cfg.teacher.model_name} ({cfg.teacher.placement}); generation {cfg.generation.backend} "
            f"({cfg.generation.placement}); run dir {self.run_dir}"
            + (f"; resumed from {resume_from}" if resume_from else "")
        )

        def log(step: int, metrics: dict[str, float]) -> None:
            if metrics:
                logger.log(step, metrics)
                result.history.append({"step": step, **metrics})

        deadline = Deadline(cfg.checkpoint.deadline_s)
        try:
            with sigterm_as_interrupt():
                if step == 0 and d.val_at_start:
                    log(0, self.validate())
                    self.timer.pop()
                done_here = 0
                while step < d.max_steps and (stop_after is None or done_here < stop_after):
                    if deadline.should_stop():
                        result.stopped_by_deadline = True
                        logger.info(
                            f"checkpoint.deadline_s={cfg.checkpoint.deadline_s} reached at step {step}"
                        )
                        break
                    start = time.perf_counter()
                    rollouts, metrics = self.step(step)
                    step, done_here = step + 1, done_here + 1
                    metrics.update(self.timer.pop())
                    metrics["timing/step"] = time.perf_counter() - start
                    log(step, metrics)
                    self.write_samples(step, rollouts)
                    if step % d.val_every == 0 or step == d.max_steps:
                        log(step, self.validate())
                    deadline.record_step(time.perf_counter() - start)
                    if cfg.checkpoint.enabled and step % cfg.checkpoint.save_every == 0:
                        saving = time.perf_counter()
                        result.last_checkpoint = self.save(step, result.history)
                        deadline.record_save(time.perf_counter() - saving)
                result.step = step
                if cfg.checkpoint.enabled and (
                    result.last_checkpoint is None or result.last_checkpoint.name != f"step_{step:06d}"
                ):
                    result.last_checkpoint = self.save(step, result.history)
        except KeyboardInterrupt:
            print_interrupted(self.checkpointer.latest())
            raise
        except WorkerLostError as e:
            raise e.with_checkpoint(self.checkpointer.latest()) from None
        finally:
            logger.close()
            if cfg.logging.plots:
                plot_run(self.run_dir, PLOTS)
        return result


def run_distill(cfg: DistillConfig, *, stop_after: int | None = None) -> DistillResult:
    trainer = DistillTrainer(cfg)
    try:
        return trainer.fit(stop_after=stop_after)
    finally:
        trainer.shutdown()
