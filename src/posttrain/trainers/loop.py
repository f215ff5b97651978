"""The run loop every trainer shares (SFT, DPO, RM, GRPO, PPO, distillation).

A trainer implements `Trainer`: one training step, validation, save, restore, shutdown, a description
and a `RunPlan`. `run_loop` owns everything around the steps and returns one `RunResult`. What holds:

- Resume: the checkpoint `checkpoint.resume` names (none: a fresh run) is handed to `restore`, which
  returns the step to go on from; the JSONL step logs (`RunPlan.step_logs`) are cut back to that step.
- Steps count from 1. After step `s` is trained and logged, it is validated when `s % val_every == 0`
  or `s == total_steps` (and step 0 is validated first on a fresh run with `val_at_start`), then saved
  when `checkpoint.enabled` and `s % checkpoint.save_every == 0`.
- The loop leaves only at a step boundary: after `total_steps`; after `stop_after` steps of this call;
  when `checkpoint.deadline_s` leaves no time for one more step and a save (`stopped_by_deadline`);
  or on the first SIGINT/SIGTERM (`graceful_stop`). It then saves the last finished step unless that
  is saved already (nothing is saved before the first step on a signal): a preempted run loses at
  most the step in flight. A signal then ends the call with KeyboardInterrupt after printing where
  the run resumes from; a lost worker (`WorkerLostError`) is re-raised naming the latest checkpoint.
- Whatever happens, the run summary is printed, the loggers closed, the plots drawn
  (`logging.plots`) and `trainer.shutdown()` called (unless `keep_workers`: another call may follow).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from posttrain.checkpoint import Checkpointer, Deadline, resolve_resume
from posttrain.config.common import CheckpointConfig, LoggingConfig
from posttrain.errors import WorkerLostError
from posttrain.logging import MetricsLogger
from posttrain.logging.plots import plot_run
from posttrain.logging.progress import stage
from posttrain.trainers.common import (
    GracefulStop,
    graceful_stop,
    latest_values,
    print_interrupted,
    run_summary,
    truncate_step_log,
)


@dataclass
class RunResult:
    """What a training run leaves: its directory, the last finished step, every logged row (each with
    its "step"), the last checkpoint written (or resumed from) and whether the deadline stopped it."""

    run_dir: Path
    step: int
    history: list[dict[str, float]] = field(default_factory=list)
    last_checkpoint: Path | None = None
    stopped_by_deadline: bool = False


@dataclass(frozen=True)
class RunPlan:
    """What the loop knows of a run before its first step: how many steps, when to validate, which
    metrics to plot at the end, and the JSONL files whose rows carry a "step" (cut back on resume)."""

    total_steps: int
    val_every: int
    val_at_start: bool
    plots: tuple[str, ...] = ()
    step_logs: tuple[str, ...] = ("metrics.jsonl",)


class RunConfig(Protocol):
    """The two sections of a trainer's config the loop reads."""

    checkpoint: CheckpointConfig
    logging: LoggingConfig


class Trainer(Protocol):
    """A run the loop drives. `train_step(step, info)` trains step `step + 1` (after `step` finished
    steps; `info` prints a line to the run's log) and returns its metrics; `validate()` returns held-out
    metrics ({} when there is nothing to validate); `save(step, metrics)` writes a checkpoint of
    `step` (`metrics`: the latest value of each, to rank it) and returns its folder;
    `restore(checkpoint)` loads one (None: a fresh run) and returns its step; `running()` holds
    what must run alongside the steps (entered after the first validation, left after the final
    save); `describe()` returns the run's opening lines; `shutdown()` releases the workers."""

    cfg: RunConfig
    run_dir: Path
    checkpointer: Checkpointer
    plan: RunPlan

    def describe(self) -> list[str]: ...

    def restore(self, checkpoint: Path | None) -> int: ...

    def running(self) -> AbstractContextManager[Any]: ...

    def train_step(self, step: int, info: Callable[[str], None]) -> dict[str, float]: ...

    def validate(self) -> dict[str, float]: ...

    def save(self, step: int, metrics: dict[str, float]) -> Path: ...

    def shutdown(self) -> None: ...


def run_loop(trainer: Trainer, *, stop_after: int | None = None, keep_workers: bool = False) -> RunResult:
    """Run `trainer` to the end of its plan (see the module docstring); `stop_after` ends this call
    after that many steps (a later call resumes); `keep_workers` leaves the trainer's workers up."""
    cfg, plan = trainer.cfg, trainer.plan
    logger: MetricsLogger | None = None
    result: RunResult | None = None
    try:
        resume_from = resolve_resume(cfg.checkpoint.resume, trainer.checkpointer)
        step = trainer.restore(resume_from)
        result = RunResult(trainer.run_dir, step, last_checkpoint=resume_from)
        for name in plan.step_logs:  # a resumed run logs no step twice
            truncate_step_log(trainer.run_dir / name, step if resume_from else None)
        logger = MetricsLogger(
            cfg.logging, trainer.run_dir, total_steps=plan.total_steps, start_step=step, config=cfg
        )
        first, *notes = trainer.describe()
        for line in [first + (f"; resumed from {resume_from}" if resume_from else ""), *notes]:
            logger.info(line)
        with graceful_stop() as stop:
            _Steps(trainer, result, logger, stop).run(stop_after)
            stop.raise_if_requested()  # after the last finished step was saved
        return result
    except KeyboardInterrupt:
        print_interrupted(trainer.checkpointer.latest())
        raise
    except WorkerLostError as e:
        raise e.with_checkpoint(trainer.checkpointer.latest()) from None
    finally:
        _finish(trainer, logger, result, keep_workers)


def _finish(
    trainer: Trainer, logger: MetricsLogger | None, result: RunResult | None, keep_workers: bool
) -> None:
    """The run summary, closed loggers and plots (once the logger exists); the workers shut down
    unless `keep_workers`."""
    try:
        if logger is not None:
            if result is not None:
                logger.info(run_summary(result, trainer.plan.total_steps, trainer.cfg.checkpoint))
            logger.close()
            if trainer.cfg.logging.plots:
                plot_run(trainer.run_dir, list(trainer.plan.plots))
    finally:
        if not keep_workers:
            trainer.shutdown()


class _Steps:
    """The step loop of one `run_loop` call: it logs into `result` and saves through the trainer."""

    def __init__(
        self, trainer: Trainer, result: RunResult, logger: MetricsLogger, stop: GracefulStop
    ) -> None:
        self.trainer, self.result, self.logger, self.stop = trainer, result, logger, stop
        self.checkpoint = trainer.cfg.checkpoint
        self.deadline = Deadline(self.checkpoint.deadline_s)

    def run(self, stop_after: int | None) -> None:
        """Validate at start, steps until the loop leaves, then save the last finished step."""
        plan, step = self.trainer.plan, self.result.step
        if step == 0 and plan.val_at_start:
            self.validate(0)
        with self.trainer.running():
            done_here = 0
            while step < plan.total_steps and (stop_after is None or done_here < stop_after):
                if self.should_leave(step):
                    break
                step, done_here = self.train(step), done_here + 1
            last = self.result.last_checkpoint
            unsaved = last is None or last.name != f"step_{step:06d}"
            if self.checkpoint.enabled and unsaved and (step > 0 or not self.stop.requested):
                self.save(step)

    def should_leave(self, step: int) -> bool:
        """Whether a stop signal came or the deadline leaves no time for another step and a save."""
        if self.stop.requested:
            return True
        if self.deadline.should_stop():
            self.result.stopped_by_deadline = True
            self.logger.info(f"checkpoint.deadline_s={self.checkpoint.deadline_s} reached at step {step}")
            return True
        return False

    def train(self, step: int) -> int:
        """Train, log, validate and (on the cadence) save step `step + 1`; returns `step + 1`."""
        start = time.perf_counter()
        metrics = self.trainer.train_step(step, self.logger.info)
        step += 1
        self.log(step, metrics)
        self.result.step = step
        if step % self.trainer.plan.val_every == 0 or step == self.trainer.plan.total_steps:
            self.validate(step)
        self.deadline.record_step(time.perf_counter() - start)  # with validation, if any
        if self.checkpoint.enabled and step % self.checkpoint.save_every == 0:
            self.save(step)
        return step

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if metrics:
            self.logger.log(step, metrics)
            self.result.history.append({"step": step, **metrics})

    def validate(self, step: int) -> None:
        with stage("validate"):
            metrics = self.trainer.validate()
        self.log(step, metrics)

    def save(self, step: int) -> None:
        saving = time.perf_counter()
        metrics = latest_values(self.result.history, step)
        self.result.last_checkpoint = self.trainer.save(step, metrics)
        self.deadline.record_save(time.perf_counter() - saving)
