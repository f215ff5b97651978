"""The run loop every trainer shares (`posttrain.trainers.loop.run_loop`), driven by a scripted trainer:
the order of steps, validations and saves; a SIGTERM mid-step saves that finished step and the rerun
resumes after it; the deadline; a lost worker; `stop_after`. No model, no workers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from posttrain.config.common import CheckpointConfig, LoggingConfig
from posttrain.errors import WorkerLostError
from posttrain.trainers.common import make_checkpointer
from posttrain.trainers.loop import RunPlan, run_loop

QUIET = {"tensorboard": False, "progress": False, "system_metrics": False, "plots": False}


class RunConfig(BaseModel):
    checkpoint: CheckpointConfig
    logging: LoggingConfig


class Scripted:
    """A `Trainer` whose step k (from 1) logs loss = k / 2 and whose validation logs val/loss =
    10 - (steps trained). Every call is recorded in `events`, then handed to `hook` (which may send a
    signal or raise)."""

    def __init__(
        self, run_dir: Path, plan: RunPlan, hook: Callable[[str], None] | None = None, **checkpoint
    ) -> None:
        self.cfg = RunConfig(
            checkpoint=CheckpointConfig(**{"keep_last": 10, **checkpoint}),
            logging=LoggingConfig(run_dir=str(run_dir), **QUIET),
        )
        self.run_dir, self.plan, self.hook = run_dir, plan, hook or (lambda event: None)
        self.checkpointer = make_checkpointer(run_dir / "checkpoints", self.cfg.checkpoint)
        self.events: list[str] = []
        self.trained = 0

    def record(self, event: str) -> None:
        self.events.append(event)
        self.hook(event)

    def describe(self) -> list[str]:
        return ["scripted run", "a note"]

    def restore(self, checkpoint: Path | None) -> int:
        self.events.append(f"restore {checkpoint.name if checkpoint else None}")
        if checkpoint is not None:
            self.trained = json.loads((checkpoint / "state.json").read_text())["step"]
        return self.trained

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self.events.append("enter")
        yield
        self.events.append("exit")

    def train_step(self, step: int, info: Callable[[str], None]) -> dict[str, float]:
        assert step == self.trained
        self.record(f"train {step + 1}")
        self.trained += 1
        return {"loss": self.trained / 2}

    def validate(self) -> dict[str, float]:
        self.record(f"validate {self.trained}")
        return {"val/loss": 10.0 - self.trained}

    def save(self, step: int, metrics: dict[str, float]) -> Path:
        self.events.append(f"save {step} {metrics}")
        write = lambda d: (d / "state.json").write_text(json.dumps({"step": step}))  # noqa: E731
        return self.checkpointer.save(step, write, metrics=metrics)

    def shutdown(self) -> None:
        self.events.append("shutdown")


def logged_steps(run_dir: Path, key: str = "loss") -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if key in row]


def test_steps_validations_and_saves_come_in_the_documented_order(tmp_path, capsys):
    trainer = Scripted(tmp_path, RunPlan(5, val_every=2, val_at_start=True), save_every=2)
    result = run_loop(trainer)
    assert trainer.events == [
        "restore None",
        "validate 0",
        "enter",
        "train 1",
        "train 2",
        "validate 2",
        "save 2 {'val/loss': 8.0, 'loss': 1.0}",
        "train 3",
        "train 4",
        "validate 4",
        "save 4 {'val/loss': 6.0, 'loss': 2.0}",
        "train 5",
        "validate 5",  # the last step is always validated
        "save 5 {'val/loss': 5.0, 'loss': 2.5}",  # and saved (5 is not on the save cadence)
        "exit",
        "shutdown",
    ]
    assert (result.step, result.stopped_by_deadline) == (5, False)
    assert result.last_checkpoint == tmp_path / "checkpoints" / "step_000005"
    assert [row["step"] for row in result.history] == [0, 1, 2, 2, 3, 4, 4, 5, 5]
    out = capsys.readouterr().out
    assert "scripted run\na note\n" in out
    assert "run finished: 5/5 steps" in out and "best val/loss (min): 5 at step 5" in out


def test_sigterm_mid_step_saves_that_step_and_the_rerun_resumes_after_it(tmp_path, capfd):
    def preempt(event: str) -> None:
        if event == "train 3":
            os.kill(os.getpid(), signal.SIGTERM)

    plan = RunPlan(6, val_every=100, val_at_start=False)
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or Ray's when an earlier test started Ray here
    first = Scripted(tmp_path, plan, preempt, save_every=1000)
    with pytest.raises(KeyboardInterrupt):
        run_loop(first)
    assert first.events[-5:] == ["train 2", "train 3", "save 3 {'loss': 1.5}", "exit", "shutdown"]
    saved = tmp_path / "checkpoints" / "step_000003"
    assert first.checkpointer.latest() == saved
    out = capfd.readouterr()
    assert "SIGTERM: stopping after the current step" in out.err
    assert f"interrupted; latest complete checkpoint: {saved}. Run the same command to resume." in out.out
    assert signal.getsignal(signal.SIGTERM) == before  # the loop's handler was removed

    again = Scripted(tmp_path, plan, save_every=1000)
    result = run_loop(again)
    assert again.events[:3] == ["restore step_000003", "enter", "train 4"]
    assert result.step == 6 and f"resumed from {saved}" in capfd.readouterr().out
    assert logged_steps(tmp_path) == [1, 2, 3, 4, 5, 6]  # nothing lost, nothing logged twice


def test_sigterm_before_the_first_step_saves_nothing(tmp_path):
    def preempt(event: str) -> None:
        if event == "validate 0":
            os.kill(os.getpid(), signal.SIGTERM)

    trainer = Scripted(tmp_path, RunPlan(3, val_every=1, val_at_start=True), preempt)
    with pytest.raises(KeyboardInterrupt):
        run_loop(trainer)
    assert trainer.events == ["restore None", "validate 0", "enter", "exit", "shutdown"]
    assert trainer.checkpointer.latest() is None


def test_the_deadline_saves_and_stops_before_a_step_that_would_not_fit(tmp_path, capsys):
    trainer = Scripted(tmp_path, RunPlan(4, val_every=1, val_at_start=False), deadline_s=1e-9)
    result = run_loop(trainer)
    assert result.stopped_by_deadline and result.step == 0
    assert result.last_checkpoint == tmp_path / "checkpoints" / "step_000000"
    assert "checkpoint.deadline_s=1e-09 reached at step 0" in capsys.readouterr().out


def test_a_lost_worker_names_the_latest_checkpoint_and_the_run_still_ends_cleanly(tmp_path, capsys):
    def lose(event: str) -> None:
        if event == "train 3":
            raise WorkerLostError("policy rank 0", "killed")

    trainer = Scripted(tmp_path, RunPlan(5, val_every=10, val_at_start=False), lose, save_every=2)
    with pytest.raises(WorkerLostError, match="latest complete checkpoint: .*step_000002"):
        run_loop(trainer)
    assert trainer.events[-2:] == ["train 3", "shutdown"]  # no save of an unfinished step
    assert "run stopped: 2/5 steps" in capsys.readouterr().out


def test_stop_after_ends_the_call_with_a_save_and_the_next_call_goes_on(tmp_path):
    plan = RunPlan(5, val_every=10, val_at_start=False)
    first = run_loop(Scripted(tmp_path, plan), stop_after=2)
    assert first.step == 2 and first.last_checkpoint.name == "step_000002"
    second = run_loop(Scripted(tmp_path, plan))
    assert second.step == 5 and [row["step"] for row in second.history] == [3, 4, 5, 5]
