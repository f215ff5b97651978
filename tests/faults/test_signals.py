"""SIGTERM (a scheduler's preemption) and SIGINT (Ctrl-C) stop a run cleanly: the first signal lets the
step in progress finish, saves that last finished step (unless it is saved already) and exits with
status 130 saying where the run resumes from; a second signal stops at once (a half-written checkpoint
is discarded). The same command resumes, and metrics.jsonl never holds a step twice."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
from conftest import sft_overrides, write_sft_jsonl
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
from functional.preference_helpers import preference_overrides, write_preference_jsonl


def logged_steps(run_dir) -> list[int]:
    """The step of every training row of metrics.jsonl (rows with a loss or a reward), in file order."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["step"] for r in rows if "loss" in r or "reward/mean" in r]


def stop_during_save_of_step_2(args: list[str], *signals: signal.Signals) -> tuple[int, str]:
    """Run `args` until it opens step 2's trainer_state.json inside the checkpoint being written, send
    `signals` (pending while the process is stopped, so they arrive together), continue it, finish."""
    run = start(
        args,
        runner=[sys.executable, str(FAULTS / "stop_on_open.py")],
        STOP_ON_OPEN=".tmp-step_000002|trainer_state.json",
    )
    try:
        wait_for(lambda: is_stopped(run.pid), run, what="the save of step 2")
        for signum in signals:
            os.kill(run.pid, signum)
        os.kill(run.pid, signal.SIGCONT)
        return finish(run)
    finally:
        kill_tree_leftovers(run)


def test_signal_during_a_save_lets_it_finish_and_the_rerun_resumes_after_it(tiny_model_dir, tmp_path):
    """SIGTERM here; SIGINT as the first signal: the dpo case of the test between checkpoints below."""
    signum = signal.SIGTERM
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=24)
    run_dir = tmp_path / "run"
    args = sft_args(tiny_model_dir, data, run_dir)
    returncode, output = stop_during_save_of_step_2(args, signum)
    latest = run_dir / "checkpoints" / "step_000002"
    assert returncode == 130, output[-3000:]
    assert f"{signum.name}: stopping after the current step" in output
    assert f"interrupted; latest complete checkpoint: {latest}. Run the same command to resume." in output
    assert "Traceback" not in output
    assert complete_steps(run_dir) == [1, 2]

    again = cli(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {latest}" in again.stdout + again.stderr
    assert complete_steps(run_dir) == [2, 3]
    assert [step for step, _ in losses(run_dir)] == [1, 2, 3]  # nothing lost, nothing logged twice


def test_a_second_signal_stops_at_once_and_discards_the_partial_save(tiny_model_dir, tmp_path):
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=24)
    run_dir = tmp_path / "run"
    args = sft_args(tiny_model_dir, data, run_dir)
    returncode, output = stop_during_save_of_step_2(args, signal.SIGTERM, signal.SIGINT)
    latest = run_dir / "checkpoints" / "step_000001"
    assert returncode == 130, output[-3000:]
    assert f"interrupted; latest complete checkpoint: {latest}. Run the same command to resume." in output
    assert "Traceback" not in output
    assert complete_steps(run_dir) == [1]
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))  # the partial save was removed
    first = dict(losses(run_dir))
    assert sorted(first) == [1, 2]  # step 2 finished and was logged before its save was cut

    again = cli(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {latest}" in again.stdout + again.stderr
    redone = losses(run_dir)
    assert [step for step, _ in redone] == [1, 2, 3]  # step 2's first row was dropped on resume
    assert redone[1][1] == first[2]  # and redone from checkpoint 1 to the same loss


def _sft(model, data_dir, run_dir) -> list[str]:
    data = write_sft_jsonl(data_dir / "train.jsonl", n=24)
    extra = {"sft.max_steps": 40, "sft.num_epochs": 20, "sft.val_every": 100, "sft.val_at_start": False}
    return ["sft", *sft_overrides(model, data, run_dir, **extra, **{"logging.plots": False})]


def _dpo(model, data_dir, run_dir) -> list[str]:
    data = write_preference_jsonl(data_dir / "pairs.jsonl", n=16)
    extra = {"dpo.max_steps": 40, "dpo.num_epochs": 20, "dpo.val_every": 100, "dpo.val_at_start": False}
    return ["dpo", *preference_overrides(model, data, run_dir, "dpo", **extra, **{"logging.plots": False})]


def _grpo(model, data_dir, run_dir) -> list[str]:
    settings = {
        "policy.model_name": model,
        "policy.max_seq_len": 96,
        "data.example_turns": "[]",  # the quickstart's worked example does not fit in 96 tokens
        "data.train.reasoning_gym.size": 16,
        "data.validation": "null",
        "grpo.max_steps": 40,
        "grpo.prompts_per_step": 2,
        "grpo.generations_per_prompt": 2,
        "grpo.val_at_start": False,
        "generation.max_new_tokens": 4,
        "cluster.backend": "local",
        "logging.run_dir": run_dir,
        "logging.tensorboard": False,
        "logging.plots": False,
    }
    return ["grpo", *[f"{k}={v}" for k, v in settings.items()]]


@pytest.mark.parametrize(
    ("make_args", "signum"),
    [(_sft, signal.SIGTERM), (_dpo, signal.SIGINT), (_grpo, signal.SIGTERM)],
    ids=["sft", "dpo_sigint", "grpo"],
)
def test_a_signal_between_checkpoints_saves_the_last_finished_step(
    tiny_model_dir, tmp_path, make_args, signum
):
    """checkpoint.save_every=1000: before this change a preempted run kept nothing."""
    run_dir = tmp_path / "run"
    args = [*make_args(tiny_model_dir, tmp_path, run_dir), "checkpoint.save_every=1000"]
    run = start(args)
    try:
        wait_for(lambda: len(logged_steps(run_dir)) >= 2, run, what="two logged steps")
        os.kill(run.pid, signum)
        returncode, output = finish(run)
    finally:
        kill_tree_leftovers(run)
    assert returncode == 130, output[-3000:]
    assert f"{signum.name}: stopping after the current step" in output
    steps = logged_steps(run_dir)
    last = steps[-1]
    assert 2 <= last < 40 and steps == list(range(1, last + 1))
    assert complete_steps(run_dir) == [last]  # the last finished step, saved on the way out
    assert f"latest complete checkpoint: {run_dir / 'checkpoints' / f'step_{last:06d}'}" in output

    total = last + 1  # one more step, from the saved one
    again = cli([*args, f"{args[0]}.max_steps={total}"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {run_dir / 'checkpoints' / f'step_{last:06d}'}" in again.stdout + again.stderr
    assert f"{args[0]}.max_steps 40 -> {total}" in again.stdout  # an allowed change, applied and logged
    assert logged_steps(run_dir) == list(range(1, total + 1))
