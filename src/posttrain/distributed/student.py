"""The distillation student: an `ActorPolicy` (train, generate, refit) whose training step hands the
loss function the student's side of the top-k divergence (`StudentTopK`) instead of token
log-probabilities, and which can hold the teacher in its own worker (colocated placement).

`Policy.train` calls `loss_fn(self.loss_inputs(micro), micro, normalizer)`; `StudentActor.loss_inputs`
returns the `StudentTopK` of a `DistillBatch` (the teacher's top-k ids are in the batch), so the
distillation loss runs through the policy's own training step, microbatching, gradient all-reduce
and clipping unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.data.batching import TokenBatch
from posttrain.distributed.actor import ActorPolicy
from posttrain.models.distill_logprobs import StudentTopK, TeacherTopK, student_topk
from posttrain.models.teacher import Teacher


@dataclass
class DistillBatch(TokenBatch):
    """A rollout batch (`TokenBatch` with the generator's logprobs [B, T]) and the teacher's scores of
    its generated tokens, at the tokens' positions:

    teacher_topk_logprobs [B, T, k] fp32 and teacher_topk_indices [B, T, k] int32: the teacher's top-k
    for token t at [b, t]; teacher_tail_logprob [B, T]: its log-mass outside them; teacher_logprobs
    [B, T]: its log-probability of token t. Zero where `loss_mask` is 0.
    """

    generation_logprobs: torch.Tensor | None = None
    teacher_topk_logprobs: torch.Tensor | None = None
    teacher_topk_indices: torch.Tensor | None = None
    teacher_tail_logprob: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None

    def select(self, start: int, stop: int) -> DistillBatch:
        """Rows [start, stop), trimmed to their longest sequence ([B, T, k] tensors too)."""
        out = super().select(start, stop)
        length = out.input_ids.shape[1]
        updates = {
            f.name: getattr(out, f.name)[:, :length]
            for f in dataclasses.fields(out)
            if isinstance(getattr(out, f.name), torch.Tensor) and getattr(out, f.name).dim() == 3
        }
        return dataclasses.replace(out, **updates)

    def with_teacher(self, scores: TeacherTopK) -> DistillBatch:
        """This batch with the teacher's row-major scores [N, ...] placed at the scored positions."""
        selected = self.loss_mask.bool().clone()
        selected[:, 0] = False
        b, t = selected.shape
        k = scores.logprobs.shape[-1]
        logprobs = torch.zeros(b, t, k, dtype=torch.float32)
        indices = torch.zeros(b, t, k, dtype=torch.int32)
        tail, sampled = torch.zeros(b, t), torch.zeros(b, t)
        logprobs[selected], indices[selected] = scores.logprobs, scores.indices
        tail[selected], sampled[selected] = scores.tail_logprob, scores.sampled_logprob
        return dataclasses.replace(
            self,
            teacher_topk_logprobs=logprobs,
            teacher_topk_indices=indices,
            teacher_tail_logprob=tail,
            teacher_logprobs=sampled,
        )

    @classmethod
    def of(cls, batch: Any) -> DistillBatch:
        """The token tensors and generation logprobs of a rollout batch (`RLBatch`)."""
        return cls(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.generation_logprobs)


class StudentActor(ActorPolicy):
    """An `ActorPolicy` whose loss inputs are `StudentTopK` for a `DistillBatch`; with `teacher` set
    (colocated placement), it also holds the teacher model on its own device."""

    def __init__(self, cfg: Any, *, teacher: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.teacher = None
        if teacher is not None:
            self.teacher = Teacher(**teacher, gpus=1 if self.device.type == "cuda" else 0)

    def loss_inputs(self, micro: TokenBatch) -> StudentTopK | torch.Tensor:
        """The student's side of the top-k loss; a batch without teacher scores (FSDP2's dummy row)
        gets the policy's token log-probabilities."""
        if not isinstance(micro, DistillBatch) or micro.teacher_topk_indices is None:
            return super().loss_inputs(micro)
        return student_topk(
            self.model,
            micro.input_ids,
            micro.attention_mask,
            micro.loss_mask,
            micro.teacher_topk_indices,
            chunk_size=self.cfg.logprob_chunk_size,
            temperature=self.cfg.logprob_temperature,
            packed=self.cfg.packed_sequences,
        )

    def teacher_topk_logprobs(self, batch: TokenBatch, k: int, temperature: float = 1.0) -> TeacherTopK:
        """Colocated placement: the teacher held in this worker scores `batch` (`Teacher.topk_logprobs`)."""
        if self.teacher is None:
            raise RuntimeError("this student was built without a colocated teacher (teacher.placement=split)")
        return self.teacher.topk_logprobs(batch, k, temperature)
