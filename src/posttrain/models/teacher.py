"""The distillation teacher: a frozen causal LM in one worker that scores the student's sequences
and returns, per scored position, only its top-k log-probabilities and ids (plus the log-mass
outside them and the log-probability of the token there), never the full vocabulary.

A teacher is any Hugging Face folder, hub id or posttrain checkpoint / run directory
(`posttrain.checkpoint.export.resolve_model_source`) whose tokenizer is the student's
(`check_same_tokenizer`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from posttrain.data.batching import TokenBatch
from posttrain.errors import MissingFileError, UserError
from posttrain.modeling.loading import DTYPES, load_causal_lm, pick_device
from posttrain.models.distill_logprobs import (
    PositionInputs,
    TeacherTopK,
    scored_position_inputs,
    teacher_topk,
)


class TokenizerMismatchError(UserError):
    """The teacher's tokenizer is not the student's: their token ids do not mean the same strings."""


def resolve_teacher(name: str | None, tokenizer_name: str | None = None) -> tuple[str, str]:
    """(model folder or hub id, tokenizer) of the configured teacher: an alias, an HF folder, a hub id,
    or a posttrain checkpoint (a step_* folder, or a run directory: its latest checkpoint)."""
    from posttrain.checkpoint.export import resolve_model_source

    if not name:
        raise UserError(
            "teacher.model_name is not set: pass the teacher on the command line, e.g. "
            "`posttrain distill teacher.model_name=runs/grpo` (a posttrain run directory or checkpoint, an "
            "HF folder or a hub id with the student's tokenizer)"
        )
    looks_local = name.startswith(("/", ".", "~")) or name.startswith("runs" + os.sep)
    if looks_local and not Path(name).expanduser().exists():
        raise MissingFileError(f"teacher.model_name={name}: no such file or directory")
    source = resolve_model_source(name, tokenizer_name)
    return source.model, source.tokenizer


def check_same_tokenizer(student: Any, teacher: Any, *, student_name: str, teacher_name: str) -> None:
    """Raise TokenizerMismatchError unless both tokenizers map the same strings to the same ids (with the
    same special tokens): the teacher's top-k ids index the student's vocabulary."""
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    problems = []
    if len(s_vocab) != len(t_vocab):
        problems.append(f"{len(s_vocab)} tokens for the student, {len(t_vocab)} for the teacher")
    differing = [tok for tok, i in s_vocab.items() if t_vocab.get(tok) != i]
    if differing:
        tok = min(differing, key=lambda t: s_vocab[t])
        problems.append(
            f"{len(differing)} tokens have other ids, e.g. {tok!r} is id {s_vocab[tok]} for the student and "
            f"{t_vocab.get(tok, 'absent')} for the teacher"
        )
    for attr in ("eos_token_id", "bos_token_id"):
        if getattr(student, attr, None) != getattr(teacher, attr, None):
            problems.append(
                f"{attr}: {getattr(student, attr, None)} for the student, {getattr(teacher, attr, None)} "
                "for the teacher"
            )
    if problems:
        raise TokenizerMismatchError(
            f"the teacher ({teacher_name}) does not share the student's tokenizer ({student_name}): "
            + "; ".join(problems)
            + ". Top-k distillation compares the two models' distributions token id by token id; choose a "
            "teacher of the student's family (or set teacher.tokenizer_name if only its folder lacks the "
            "right tokenizer)"
        )


def model_vocab_size(path: str) -> int | None:
    """The number of rows of a model's output layer, from its config (None if it does not say)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    return getattr(config, "vocab_size", None)


def prepare_teacher(
    model_name: str | None,
    tokenizer_name: str | None,
    *,
    student_tokenizer: Any,
    student_path: str,
    student_name: str,
) -> tuple[str, int | None]:
    """(the teacher's model folder, the vocabulary size to cut its logits to or None) after checking
    that its tokenizer is the student's. The teacher's extra output rows (a larger padded embedding)
    are ids the student cannot produce, so its logits are cut to the student's vocabulary."""
    from posttrain.modeling.tokenizer import load_tokenizer

    teacher_path, teacher_tokenizer = resolve_teacher(model_name, tokenizer_name)
    check_same_tokenizer(
        student_tokenizer,
        load_tokenizer(teacher_tokenizer),
        student_name=student_name,
        teacher_name=str(model_name),
    )
    student_vocab, teacher_vocab = model_vocab_size(student_path), model_vocab_size(teacher_path)
    cut = student_vocab if student_vocab and teacher_vocab and teacher_vocab > student_vocab else None
    return teacher_path, cut


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
        if num_threads:
            torch.set_num_threads(num_threads)
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
