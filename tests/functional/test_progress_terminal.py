"""On a terminal a GRPO run shows a bar for each long phase (the batch's generation, validation)
under its step bar, and clears it when the phase ends; the step bar names the stage the run is in,
each step's line stays on screen above it, and the run ends with its summary. (Without a terminal there is none:
tests/unit/test_progress.py; every other functional test runs with its output piped.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest


def grpo_args(model_dir, run_dir) -> list[str]:
    settings = {
        "policy.model_name": model_dir,
        "policy.max_seq_len": 96,
        "data.example_turns": "[]",  # the quickstart's worked example does not fit in 96 tokens
        "data.train.reasoning_gym.size": 8,
        "data.validation.reasoning_gym.size": 4,
        "grpo.max_steps": 1,
        "grpo.prompts_per_step": 2,
        "grpo.generations_per_prompt": 2,
        "grpo.val_every": 1,
        "grpo.val_at_start": False,
        "generation.max_new_tokens": 8,
        "cluster.backend": "local",
        "checkpoint.enabled": False,
        "logging.run_dir": run_dir,
        "logging.tensorboard": False,
        "logging.plots": False,
    }
    return ["grpo", *[f"{k}={v}" for k, v in settings.items()]]


def test_phase_bars_on_a_terminal(tiny_model_dir, tmp_path):
    if shutil.which("script") is None:
        pytest.skip("util-linux `script` (a pseudo-terminal) is not installed")
    env = {**os.environ, "COLUMNS": "120", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "posttrain.cli", *grpo_args(tiny_model_dir, tmp_path / "tty")]
    typescript = tmp_path / "typescript"
    subprocess.run(
        ["script", "-qec", subprocess.list2cmdline(command), str(typescript)],
        check=True,
        capture_output=True,
        timeout=300,
        env=env,
    )
    screen = typescript.read_text(errors="replace")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)  # without colours and cursor moves
    assert re.search(r"generation [━╺╸ ]+ 0/4 ", text), text[-2000:]  # the batch: 2 prompts x 2 episodes
    assert re.search(r"validation [━╺╸ ]+ \d+/4 ", text), text[-2000:]  # 4 held-out problems
    assert "\x1b[1A\x1b[2K" in screen  # transient: the phase's line is erased when it ends
    # the step history stays on screen above the step bar, which shows the stage the run is in
    assert re.search(r"step 1/1 \[\d+s\] reward/mean=", text), text[-2000:]
    assert re.search(r"step 1/1 \[\d+s\] val/accuracy=", text), text[-2000:]
    # the stage is drawn when it changes (a phase bar below may hide later redraws of a short stage)
    assert re.search(r"step +[01]/1 .*(generate|score|train|refit|validate)", text), text[-2000:]
    assert "run finished: 1/1 steps, wall time" in text and f"run dir: {tmp_path / 'tty'}" in text
