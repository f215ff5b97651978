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
Everything but the batch and the loss is the RL runtime's (`posttrain.trainers.rl.runtime`;
`DistillTrainer` is GRPO's sibling, not its subclass): the rollouts (any environment, several turns,
no turn barrier), refits and their parity gate, validation, checkpoints and the loop.
"""

from __future__ import annotations

import functools

import torch

from posttrain.algorithms.distillation import distillation_loss
from posttrain.algorithms.metrics import scored_reward_metrics
from posttrain.config.rl import DistillConfig
from posttrain.distributed.student import DistillBatch
from posttrain.distributed.teacher_group import StudentGroup
from posttrain.models.distill_logprobs import StudentTopK
from posttrain.rollout.rollout import Rollouts, build_rl_batch
from posttrain.trainers.loop import RunResult, run_loop
from posttrain.trainers.rl.protocol import PolicyWorkers, RLAlgorithm
from posttrain.trainers.rl.runtime import RLRuntime

PLOTS = [
    "distill/divergence",
    "distill/top1_agreement",
    "distill/sampled_reverse_kl",
    "val/accuracy",
    "val/response_length",
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


class DistillTrainer(RLAlgorithm):
    """On-policy distillation as an `RLAlgorithm`: a teacher's top-k in the batch instead of
    advantages, and a divergence as the loss. `DistillTrainer(cfg)` builds the runtime that runs it
    (`self.runtime`: the student's workers, which may hold the teacher, or the teacher's own)."""

    name = "distill"
    run_kind = "distill"
    plots = PLOTS

    def __init__(self, cfg: DistillConfig) -> None:
        self.cfg, self.loop = cfg, cfg.distill
        d = cfg.distill
        self.loss_fn_knobs = dict(
            divergence=d.loss, top_k_mode=d.top_k_mode, mixed_kl_weight=d.mixed_kl_weight, jsd_beta=d.jsd_beta
        )
        self.runtime = RLRuntime(cfg, self)
        self.tokenizer, self.teacher = self.runtime.tokenizer, self.runtime.teacher

    # ---------------------------------------------------------------- what the runtime builds
    def policy_workers(self, model_path: str) -> PolicyWorkers:
        """The student's workers (they train on the top-k divergence); no π_ref."""
        d = self.cfg.distill
        return PolicyWorkers(StudentGroup, d.max_steps * d.updates_per_batch, reference=False)

    def describe(self) -> str:
        d, teacher = self.cfg.distill, self.cfg.teacher
        return (
            f"loss {d.loss} over the teacher's top-{d.topk_logits_k} ({d.top_k_mode}); "
            f"teacher {teacher.model_name} ({teacher.placement}); "
        )

    # ---------------------------------------------------------------- phases
    def collect(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """The student's episodes for one step (no dynamic sampling: every sample teaches)."""
        return self.runtime.draw(step), {}

    def make_batch(self, rollouts: Rollouts) -> tuple[DistillBatch, dict[str, float]]:
        """The rollout batch with the teacher's top-k at every generated token."""
        d = self.cfg.distill
        tokens = DistillBatch.of(build_rl_batch(rollouts.trajectories, None, self.tokenizer.pad_token_id))
        with self.runtime.timer("teacher"):
            batch = tokens.with_teacher(self.teacher.topk(tokens, d.topk_logits_k, d.teacher_temperature))
        metrics = {
            "reward/mean": scored_reward_metrics(rollouts.rewards, rollouts.scored)["reward/mean"],
            "response_length": float(rollouts.response_lengths.mean()),
            "truncation_rate": float(rollouts.truncated.float().mean()),
            "distill/tokens": float(batch.loss_mask.sum()),
        }
        return batch, metrics

    def train_on(self, batch: DistillBatch) -> dict[str, float]:
        """`updates_per_batch` optimizer steps over contiguous minibatches, each normalised by its own
        global count of generated tokens; metrics (the gradient norm included) are means over them."""
        metrics: dict[str, float] = {}
        minibatches = batch.chunks(self.cfg.distill.updates_per_batch)
        with self.runtime.timer("training"):
            for mb in minibatches:
                normalizer = max(1.0, float(mb.loss_mask[:, 1:].sum()))
                loss_fn = functools.partial(distill_loss_fn, **self.loss_fn_knobs)
                out = self.runtime.policy.train(mb, loss_fn, normalizer)
                for k, v in {**out.loss_metrics, "grad_norm": out.grad_norm}.items():
                    metrics[k] = metrics.get(k, 0.0) + v / len(minibatches)
                metrics["lr"] = out.lr
        metrics.update(self.runtime.policy_updated())
        return metrics


def run_distill(cfg: DistillConfig, *, stop_after: int | None = None) -> RunResult:
    """Train; `stop_after` ends this invocation after that many steps (a later call resumes)."""
    return run_loop(DistillTrainer(cfg).runtime, stop_after=stop_after)
