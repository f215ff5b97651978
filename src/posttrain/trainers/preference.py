"""The loop DPO and reward-model training share: pairs in, one optimizer step per batch of pairs.

A subclass names its algorithm and provides three phases: `build_policy` (the worker group),
`train_step` (one optimizer step on a `PreferenceBatch`) and `validate` (held-out metrics).
Everything else mirrors SFT: resumable data order and RNG, atomic checkpoints with keep-last-K and
keep-best-K (by `checkpoint.metric`, default `val/loss`, which both log), a wall-clock
`checkpoint.deadline_s` that saves and stops cleanly, JSONL/TensorBoard/console logging, SIGTERM as
a clean interrupt, and PNG plots at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.checkpoint import Deadline, resolve_resume
from posttrain.config.loader import ConfigError
from posttrain.config.schema import PreferenceTrainerConfig
from posttrain.data.batching import EpochSampler
from posttrain.data.preference import (
    PreferenceBatch,
    PreferenceDataset,
    build_preference_dataset,
    collate_pairs,
)
from posttrain.distributed.policy_group import PolicyGroup
from posttrain.errors import WorkerLostError
from posttrain.logging import MetricsLogger
from posttrain.logging.plots import plot_curves
from posttrain.logging.progress import stage
from posttrain.modeling.tokenizer import training_tokenizer
from posttrain.trainers.common import (
    GracefulStop,
    epochs_notice,
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


@dataclass
class PreferenceResult:
    run_dir: Path
    step: int
    history: list[dict[str, float]] = field(default_factory=list)
    last_checkpoint: Path | None = None
    stopped_by_deadline: bool = False


class PreferenceTrainer:
    """Holds the data and workers of one DPO or RM run; `fit()` is the loop."""

    algorithm = "preference"
    plots: tuple[str, ...] = ("loss",)

    def __init__(self, cfg: Any, loop: PreferenceTrainerConfig) -> None:
        self.cfg, self.loop = cfg, loop
        from posttrain.models.hub import resolve_model

        self.model_path = resolve_model(cfg.policy.model_name)  # a missing model fails before the run dir
        self.run_dir = prepare_run_dir(cfg.logging.run_dir, self.algorithm, cfg)
        seed_everything(loop.seed)
        self.tokenizer, self.tokenizer_path = training_tokenizer(
            cfg.policy.tokenizer_name or self.model_path,
            cfg.policy.chat_template,
            self.run_dir,
            "policy.chat_template",
        )
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.train_data = self._dataset(cfg.data.train)
        self.val_data = self._dataset(cfg.data.validation) if cfg.data.validation else None
        self.sampler = EpochSampler(len(self.train_data), loop.global_batch_size, seed=loop.seed)
        self.total_steps = self.sampler.batches_per_epoch * loop.num_epochs
        if loop.max_steps:
            self.total_steps = min(self.total_steps, loop.max_steps)
        self._check_batch_layout()
        self.checkpointer = make_checkpointer(self.run_dir / "checkpoints", cfg.checkpoint)
        self.policy = self.build_policy()

    def _dataset(self, data_cfg: Any) -> PreferenceDataset:
        return build_preference_dataset(
            data_cfg, self.tokenizer, max_seq_len=self.cfg.policy.max_seq_len, overlong=self.cfg.data.overlong
        )

    def _check_batch_layout(self) -> None:
        workers, section = self.cfg.cluster.policy_workers(), self.algorithm
        if self.loop.global_batch_size % workers:
            raise ConfigError(
                f"{section}.global_batch_size={self.loop.global_batch_size} (pairs) must be a multiple of the "
                f"{workers} policy workers, so that every worker gets whole pairs"
            )
        if self.cfg.policy.train_micro_batch_size % 2:
            raise ConfigError(
                f"policy.train_micro_batch_size={self.cfg.policy.train_micro_batch_size} counts sequences and "
                f"must be even for {section.upper()} (a chosen and a rejected sequence per pair)"
            )

    # ---------------------------------------------------------------- phases (subclasses)
    def build_policy(self) -> PolicyGroup:
        raise NotImplementedError

    def train_step(self, batch: PreferenceBatch) -> dict[str, float]:
        raise NotImplementedError

    def validate(self) -> dict[str, float]:
        raise NotImplementedError

    def staged_validate(self) -> dict[str, float]:
        """`validate` as the run's "validate" stage on the console."""
        with stage("validate"):
            return self.validate()

    # ---------------------------------------------------------------- helpers
    def batch_of(self, indices: list[int], data: PreferenceDataset) -> PreferenceBatch:
        return collate_pairs([data.pairs[i] for i in indices], pad_id=self.pad_id)

    def validation_batches(self) -> Iterator[tuple[int, PreferenceBatch]]:
        """(index of the batch, batch) over the held-out pairs, `global_batch_size` pairs at a time."""
        assert self.val_data is not None
        size = self.loop.global_batch_size
        starts = list(range(0, len(self.val_data), size))[: self.loop.val_batches]
        for k, start in enumerate(starts):
            yield k, self.batch_of(list(range(start, min(start + size, len(self.val_data)))), self.val_data)

    # ---------------------------------------------------------------- state
    def save(self, step: int, metrics: dict[str, float]) -> Path:
        """Checkpoint the policy, tokenizer and controller; `metrics` (latest values) rank it for keep_best."""

        def write(directory: Path) -> None:
            self.policy.save_checkpoint(directory)
            self.tokenizer.save_pretrained(directory / "model")  # the model folder loads on its own
            save_controller_state(directory, step, {"sampler": self.sampler.state_dict()}, self.cfg)

        return self.checkpointer.save(step, write, metrics=metrics)

    def restore(self, checkpoint: Path) -> int:
        self.policy.load_checkpoint(checkpoint)
        state = load_controller_state(checkpoint)
        self.sampler.load_state_dict(state["sampler"])
        return state["step"]

    def describe(self) -> str:
        t, v = self.train_data, self.val_data
        return (
            f"{self.algorithm.upper()}: {len(t)} train pairs ({t.num_truncated} truncated, {t.num_dropped} dropped "
            f"at max_seq_len={self.cfg.policy.max_seq_len}), {len(v) if v else 0} validation; "
            f"{self.total_steps} steps of {self.loop.global_batch_size} pairs on "
            f"{self.cfg.cluster.policy_workers()} worker(s); run dir {self.run_dir}"
        )

    # ---------------------------------------------------------------- loop
    def fit(self, *, stop_after: int | None = None) -> PreferenceResult:
        resume_from = resolve_resume(self.cfg.checkpoint.resume, self.checkpointer)
        step = self.restore(resume_from) if resume_from else 0
        result = PreferenceResult(self.run_dir, step, last_checkpoint=resume_from)
        truncate_step_log(self.run_dir / "metrics.jsonl", step if resume_from else None)
        logger = MetricsLogger(
            self.cfg.logging, self.run_dir, total_steps=self.total_steps, start_step=step, config=self.cfg
        )
        logger.info(self.describe() + (f"; resumed from {resume_from}" if resume_from else ""))
        loop = self.loop
        notice = epochs_notice(
            self.algorithm,
            loop.max_steps,
            loop.num_epochs,
            self.sampler.batches_per_epoch,
            len(self.train_data),
        )
        if notice:
            logger.info(notice)

        def log(step: int, metrics: dict[str, float]) -> None:
            if metrics:
                logger.log(step, metrics)
                result.history.append({"step": step, **metrics})

        try:
            with graceful_stop() as stop:
                self._loop(step, stop_after, result, log, logger, stop)
                stop.raise_if_requested()  # after the last finished step was saved
        except KeyboardInterrupt:
            print_interrupted(self.checkpointer.latest())
            raise
        except WorkerLostError as e:
            raise e.with_checkpoint(self.checkpointer.latest()) from None
        finally:
            logger.info(run_summary(result, self.total_steps, self.cfg.checkpoint))
            logger.close()
            plot_curves(self.run_dir, list(self.plots))
        return result

    def _loop(
        self,
        step: int,
        stop_after: int | None,
        result: PreferenceResult,
        log: Any,
        logger: MetricsLogger,
        stop: GracefulStop,
    ) -> None:
        """Steps until total_steps, `stop_after` steps of this call, the deadline or a stop signal; then a
        final save of the last finished step (unless saved already; none before the first step)."""
        enabled, save_every = self.cfg.checkpoint.enabled, self.cfg.checkpoint.save_every
        deadline = Deadline(self.cfg.checkpoint.deadline_s)

        def save(step: int) -> None:
            saving = time.perf_counter()
            result.last_checkpoint = self.save(step, latest_values(result.history, step))
            deadline.record_save(time.perf_counter() - saving)

        if step == 0 and self.loop.val_at_start and self.val_data is not None:
            log(0, self.staged_validate())
        done_here = 0
        while step < self.total_steps and (stop_after is None or done_here < stop_after):
            if stop.requested:
                break
            if deadline.should_stop():
                result.stopped_by_deadline = True
                logger.info(f"checkpoint.deadline_s={self.cfg.checkpoint.deadline_s} reached at step {step}")
                break
            start = time.perf_counter()
            batch = self.batch_of(self.sampler.next_batch(), self.train_data)
            with stage("train"):
                metrics = self.train_step(batch)
            step, done_here = step + 1, done_here + 1
            elapsed = time.perf_counter() - start
            metrics.update({"timing/step": elapsed, "pairs_per_s": batch.num_pairs / elapsed})
            metrics["epoch"] = self.sampler.epoch
            log(step, metrics)
            result.step = step
            if self.val_data is not None and (step % self.loop.val_every == 0 or step == self.total_steps):
                log(step, self.staged_validate())
            deadline.record_step(time.perf_counter() - start)  # with validation, if any
            if enabled and step % save_every == 0:
                save(step)
        result.step = step
        unsaved = result.last_checkpoint is None or result.last_checkpoint.name != f"step_{step:06d}"
        if enabled and unsaved and (step > 0 or not stop.requested):
            save(step)


def run_trainer(trainer: PreferenceTrainer, stop_after: int | None) -> PreferenceResult:
    try:
        return trainer.fit(stop_after=stop_after)
    finally:
        trainer.policy.shutdown()
