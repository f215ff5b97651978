"""The summary every trainer prints when its run ends: steps done, the best checkpoint.metric and its
step, the last checkpoint, the run directory and the wall time (issue #30, console)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from posttrain.config.common import CheckpointConfig
from posttrain.trainers.common import best_metric, format_duration, run_summary

HISTORY = [
    {"step": 0, "val/accuracy": 0.25, "val/loss": 2.0},
    {"step": 1, "loss": 1.5},
    {"step": 2, "val/accuracy": 0.5, "val/loss": 1.25},
    {"step": 3, "val/accuracy": float("nan"), "val/loss": 1.5},
    {"step": 4, "val/accuracy": 0.5, "val/loss": 1.75},
]


def test_best_metric_by_mode_earliest_on_a_tie_and_never_nan():
    assert best_metric(HISTORY, "val/accuracy", "max") == (0.5, 2)  # steps 2 and 4 tie: the earlier
    assert best_metric(HISTORY, "val/accuracy", "min") == (0.25, 0)
    assert best_metric(HISTORY, "val/loss", "min") == (1.25, 2)
    assert best_metric(HISTORY, "val/reward", "max") is None
    assert best_metric([{"step": 1, "val/loss": float("nan")}], "val/loss", "min") is None


def test_durations():
    assert [format_duration(s) for s in (9.54, 59.9, 125, 3723)] == ["9.5s", "59.9s", "2m 05s", "1h 02m 03s"]


def test_summary_lines():
    result = SimpleNamespace(
        run_dir=Path("runs/grpo"),
        step=4,
        history=HISTORY,
        last_checkpoint=Path("runs/grpo/checkpoints/step_000004"),
    )
    rl = CheckpointConfig(metric="val/accuracy", mode="max")
    assert run_summary(result, 4, rl, wall_s=125).splitlines() == [
        "run finished: 4/4 steps, wall time 2m 05s",
        "  best val/accuracy (max): 0.5 at step 2",
        "  last checkpoint: runs/grpo/checkpoints/step_000004",
        "  run dir: runs/grpo",
    ]
    stopped = SimpleNamespace(run_dir=Path("runs/sft"), step=1, history=HISTORY[:2], last_checkpoint=None)
    assert run_summary(stopped, 10, CheckpointConfig(), wall_s=3).splitlines() == [
        "run stopped: 1/10 steps, wall time 3.0s",
        "  best val/loss (min): 2 at step 0",
        "  last checkpoint: none",
        "  run dir: runs/sft",
    ]
