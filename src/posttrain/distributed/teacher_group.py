"""Worker groups of on-policy distillation: the student (an `ActorGroup` of `StudentActor`s) and the
teacher, either its own workers (split: Ray actors with their own CPUs / GPU, or one in-process
worker with cluster.backend=local) or held inside the student's workers (colocated, like the
reference model). Either way the teacher sends back only its top-k per scored position."""

from __future__ import annotations

from typing import Any

from posttrain.config.schema import ClusterConfig, TeacherConfig
from posttrain.data.batching import TokenBatch
from posttrain.distributed.actor_group import ActorGroup
from posttrain.distributed.student import StudentActor
from posttrain.distributed.workers import Workers, make_workers
from posttrain.models.distill_logprobs import TeacherTopK
from posttrain.models.teacher import Teacher


class StudentGroup(ActorGroup):
    """Data-parallel `StudentActor` ranks: train on the top-k divergence, score, generate."""

    worker_cls = StudentActor


def teacher_worker_kwargs(cfg: TeacherConfig, *, model_path: str, vocab_size: int | None) -> dict[str, Any]:
    """`Teacher` constructor arguments from the config (without device and threads)."""
    return dict(
        model_path=model_path,
        dtype=cfg.dtype,
        batch_size=cfg.batch_size,
        chunk_size=cfg.chunk_size,
        packed=cfg.packed_sequences,
        vocab_size=vocab_size,
    )


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
