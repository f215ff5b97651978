"""SIGTERM (a scheduler's preemption) and SIGINT (Ctrl-C) stop a run cleanly: the half-written
checkpoint is discarded, the run says where it can resume from, and the same command resumes."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from conftest import write_sft_jsonl
from fault_helpers import (
    FAULTS,
    cli,
    complete_steps,
    finish,
    is_stopped,
    kill_tree_leftovers,
    losses,
    sft_args,
    start,
    wait_for,
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_a_save_stops_cleanly_and_the_rerun_resumes(tiny_model_dir, tmp_path, signum):
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=24)
    run_dir = tmp_path / "run"
    args = sft_args(tiny_model_dir, data, run_dir)
    run = start(
        args,
        runner=[sys.executable, str(FAULTS / "stop_on_open.py")],
        STOP_ON_OPEN=".tmp-step_000002|trainer_state.json",
    )
    try:
        wait_for(lambda: is_stopped(run.pid), run, what="the save of step 2")
        os.kill(run.pid, signum)  # pending until the process continues, inside the save
        os.kill(run.pid, signal.SIGCONT)
        returncode, output = finish(run)
    finally:
        kill_tree_leftovers(run)
    latest = run_dir / "checkpoints" / "step_000001"
    assert returncode == 130, output[-3000:]
    assert f"interrupted; latest complete checkpoint: {latest}. Run the same command to resume." in output
    assert "Traceback" not in output
    assert complete_steps(run_dir) == [1]
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))  # the partial save was removed

    again = cli(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {latest}" in again.stdout + again.stderr
    assert complete_steps(run_dir) == [2, 3]
    steps = losses(run_dir)  # nothing lost: step 2 redone from checkpoint 1 (the same step), then step 3
    assert [step for step, _ in steps] == [1, 2, 2, 3]
    assert steps[1][1] == steps[2][1]
