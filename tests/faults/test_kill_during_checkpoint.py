"""`kill -9` while a checkpoint is half-written: the same command resumes from the last complete one."""

from __future__ import annotations

import os
import signal
import sys

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


def test_kill_9_during_a_checkpoint_write_resumes_from_the_last_complete_one(tiny_model_dir, tmp_path):
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=24)
    run_dir = tmp_path / "run"
    args = sft_args(tiny_model_dir, data, run_dir)
    # stopped when step 2's save writes the controller state: model and optimizer are written, the
    # controller state and the COMPLETE mark are not
    run = start(
        args,
        runner=[sys.executable, str(FAULTS / "stop_on_open.py")],
        STOP_ON_OPEN=".tmp-step_000002|trainer_state.json",
    )
    try:
        wait_for(lambda: is_stopped(run.pid), run, what="the save of step 2")
        [partial] = (run_dir / "checkpoints").glob(".tmp-step_000002-*")
        assert (partial / "model" / "model.safetensors").is_file() and (partial / "optimizer.pt").is_file()
        assert not (partial / "COMPLETE").exists()
        os.kill(run.pid, signal.SIGKILL)
        returncode, _ = finish(run)
    finally:
        kill_tree_leftovers(run)
    assert returncode == -signal.SIGKILL
    assert complete_steps(run_dir) == [1]
    before = losses(run_dir)
    assert [step for step, _ in before] == [1, 2]

    again = cli(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {run_dir / 'checkpoints' / 'step_000001'}" in again.stdout + again.stderr
    # nothing lost: the half-written folder is gone, the last two saves are complete, and step 2 redone
    # from checkpoint 1 is the same step the killed run took (same batch, same weights)
    assert complete_steps(run_dir) == [2, 3]
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
    after = losses(run_dir)  # the killed run's row of step 2 was dropped on resume: no step twice
    assert [step for step, _ in after] == [1, 2, 3]
    assert after[0][1] == before[0][1] and after[1][1] == before[1][1]
