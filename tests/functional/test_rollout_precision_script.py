"""benchmarks/rollout_precision.py runs end to end on a tiny model, and its mismatch measurement is
exact where it must be: an fp32 copy of the model differs from it by exactly 0 on every sampled token."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_variant_is_measured_and_an_fp32_copy_matches_exactly(tiny_model_dir, tmp_path):
    out = tmp_path / "results.json"
    command = [
        sys.executable, str(ROOT / "benchmarks" / "rollout_precision.py"), "--model", str(tiny_model_dir),
        "--rows", "2", "--new-tokens", "4", "--repeats", "1", "--threads", "1", "--json", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1. one projection" in result.stdout and "2. sampling" in result.stdout
    results = json.loads(out.read_text())
    assert set(results) == {
        "fp32 (a copy)", "bf16", "int8 all linears", "int8 all but lm_head",
        "int8 attention + MLP gate/up", "int8 attention only",
    }  # fmt: skip
    copy = results["fp32 (a copy)"]
    assert copy["mean_abs_dlogp"] == 0.0 and copy["ratio_in_bounds"] == 1.0
    assert all(r["speed_vs_fp32"] > 0 and r["mean_abs_dlogp"] >= 0 for r in results.values())
