"""The distillation teacher: a frozen causal LM in one worker that scores the student's sequences
and returns, per scored position, only its top-k log-probabilities and ids (plus the log-mass
outside them and the log-probability of the token there), never the full vocabulary.

Which teacher (an alias, a Hugging Face folder, a hub id or a posttrain checkpoint / run directory)
and the check that its tokenizer is the student's are the controller's (`posttrain.distributed.
teacher_group.prepare_teacher`); a worker gets the resolved folder.
"""

from __future__ import annotations

import torch

from posttrain.data.batching import TokenBatch
from posttrain.modeling.loading import DTYPES, load_causal_lm, pick_device, set_torch_threads
from posttrain.models.distill_logprobs import (
    PositionInputs,
    TeacherTopK,
    scored_position_inputs,
    teacher_topk,
)


class Teacher:
    """One teacher worker: the frozen model on its device, scoring batches microbatch by microbatch."""

    def __init__(
        self,
        *,
        model_path: str,
        dtype: str = "float32",
        gpus: int = 0,
        num_threads: int | None = None,
        batch_size: int = 8,
        chunk_size: int = 2048,
        packed: bool = True,
        vocab_size: int | None = None,
    ) -> None:
        set_torch_threads(num_threads)
        self.device = pick_device(gpus)
        self.model = load_causal_lm(model_path, DTYPES[dtype]).to(self.device).eval()
        self.model.requires_grad_(False)
        self.model.config.use_cache = False
        self.batch_size, self.chunk_size, self.packed = batch_size, chunk_size, packed
        self.vocab_size = vocab_size

    def positions(self, micro: TokenBatch, temperature: float) -> PositionInputs:
        """The teacher's head inputs at the scored positions; logits cut to the student's `vocab_size`
        (ids past it are padding rows of a larger embedding, which the student has not got)."""
        inputs = scored_position_inputs(
            self.model,
            micro.input_ids.to(self.device),
            micro.attention_mask.to(self.device),
            micro.loss_mask.to(self.device),
            temperature=temperature,
            packed=self.packed,
        )
        if self.vocab_size is None:
            return inputs
        head, vocab = inputs.head, self.vocab_size
        return inputs._replace(head=lambda rows: head(rows)[:, :vocab])

    @torch.no_grad()
    def topk_logprobs(self, batch: TokenBatch, k: int, temperature: float = 1.0) -> TeacherTopK:
        """The teacher's top-k of log softmax(logits / temperature) at every position where
        `batch.loss_mask` is set, in row-major order (CPU; [N, k] fp32 and int32, [N] tail and
        sampled-token log-probabilities)."""
        parts = []
        for micro in batch.microbatches(self.batch_size):
            selected = micro.loss_mask.bool().clone()
            selected[:, 0] = False
            inputs = self.positions(micro, temperature)
            parts.append(teacher_topk(inputs, micro.input_ids[selected].to(self.device), k, self.chunk_size))
        return TeacherTopK.cat(parts) if parts else TeacherTopK.empty(k)
