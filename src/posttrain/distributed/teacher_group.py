"""Worker groups of on-policy distillation: the student (an `ActorGroup` of `StudentActor`s) and the
teacher, either its own workers (split: Ray actors with their own CPUs / GPU, or one in-process
worker with cluster.backend=local) or held inside the student's workers (colocated, like the
reference model). Either way the teacher sends back only its top-k per scored position.

`prepare_teacher` resolves the configured teacher like any model source (`posttrain.checkpoint.export.
resolve_model_source`: an alias, a Hugging Face folder, a hub id, or a posttrain checkpoint / run
directory) and checks that its tokenizer is the student's (`check_same_tokenizer`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from posttrain.checkpoint.export import resolve_model_source, weights_dtype
from posttrain.config.common import ClusterConfig
from posttrain.config.rl import TeacherConfig
from posttrain.data.batching import TokenBatch
from posttrain.distributed.actor_group import ActorGroup
from posttrain.distributed.student import StudentActor
from posttrain.distributed.workers import Workers, make_workers
from posttrain.errors import MissingFileError, UserError
from posttrain.models.distill_logprobs import TeacherTopK
from posttrain.models.teacher import Teacher


class StudentGroup(ActorGroup):
    """Data-parallel `StudentActor` ranks: train on the top-k divergence, score, generate."""

    worker_cls = StudentActor


def teacher_worker_kwargs(cfg: TeacherConfig, *, model_path: str, vocab_size: int | None) -> dict[str, Any]:
    """`Teacher` constructor arguments from the config (without device and threads)."""
    return dict(
        model_path=model_path,
        dtype=weights_dtype(cfg.dtype, model_path),
        batch_size=cfg.batch_size,
        chunk_size=cfg.chunk_size,
        packed=cfg.packed_sequences,
        vocab_size=vocab_size,
    )


class TokenizerMismatchError(UserError):
    """The teacher's tokenizer is not the student's: their token ids do not mean the same strings."""


def resolve_teacher(name: str | None, tokenizer_name: str | None = None) -> tuple[str, str]:
    """(model folder or hub id, tokenizer) of the configured teacher: an alias, an HF folder, a hub id,
    or a posttrain checkpoint (a step_* folder, or a run directory: its latest checkpoint)."""
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


class TeacherGroup:
    """The teacher's workers. `topk` spreads a batch's rows over them and returns the row-major top-k
    of every scored position of the whole batch."""

    def __init__(
        self,
        cfg: TeacherConfig,
        cluster: ClusterConfig,
        *,
        model_path: str,
        vocab_size: int | None = None,
        student: StudentGroup | None = None,
    ) -> None:
        """Split placement: `cfg.num_workers` workers of their own. Colocated: the teacher lives in the
        student's workers (built with `teacher=teacher_worker_kwargs(...)`); pass that `student`."""
        self.placement = cfg.placement
        self.owns_workers = cfg.placement == "split"
        if self.owns_workers:
            gpus = 1 if cluster.gpus_per_node > 0 else 0
            threads = cfg.cpus_per_worker if cluster.backend == "ray" else None
            kwargs = [
                dict(
                    **teacher_worker_kwargs(cfg, model_path=model_path, vocab_size=vocab_size),
                    gpus=gpus,
                    num_threads=threads,
                )
                for _ in range(cfg.num_workers)
            ]
            teacher_cluster = cluster.model_copy(update={"cpus_per_worker": cfg.cpus_per_worker})
            self.workers: Workers = make_workers(Teacher, kwargs, teacher_cluster, name="teacher")
            self.method = Teacher.topk_logprobs
        else:
            if student is None:
                raise ValueError("teacher.placement=colocated needs the student group that holds the teacher")
            self.workers = student.workers
            self.method = StudentActor.teacher_topk_logprobs

    def __len__(self) -> int:
        return len(self.workers)

    def topk(self, batch: TokenBatch, k: int, temperature: float = 1.0) -> TeacherTopK:
        """The teacher's top-k (log-probabilities, int32 ids, tail and sampled-token log-probabilities)
        at every position where `batch.loss_mask` is set, in row-major order over the whole batch: the
        rows go out in contiguous chunks, one per worker, and come back in that order."""
        chunks = batch.chunks(len(self.workers)) if len(batch) else []
        if not chunks:
            return TeacherTopK.empty(k)
        parts = self.workers.run(self.method, [(chunk, k, temperature) for chunk in chunks])
        return TeacherTopK.cat(parts)

    def shutdown(self) -> None:
        if self.owns_workers:
            self.workers.shutdown()
