"""benchmarks/skip_zero_advantage.py runs both arms end to end on a tiny model and prints its table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_both_arms_run_and_print_the_ratios(tiny_model_dir):
    overrides = [
        f"policy.model_name={tiny_model_dir}", "policy.max_seq_len=96", "data.example_turns=[]",
        "data.train.reasoning_gym.size=16", "grpo.prompts_per_step=2", "grpo.generations_per_prompt=4",
        "generation.max_new_tokens=8", "cluster.backend=local",
    ]  # fmt: skip
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "skip_zero_advantage.py"),
        "--steps",
        "2",
        "--set",
        *overrides,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("every row (baseline)") for line in lines)
    skip_row = next(line for line in lines if line.startswith("skip zero-advantage"))
    assert 0.0 <= float(skip_row.split()[-2]) <= 1.0  # the share of rows left out
    assert any(line.startswith("training phase: ") and "x faster" in line for line in lines)
