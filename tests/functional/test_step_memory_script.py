"""benchmarks/step_memory.py runs every kind and head end to end (its GRPO arm once failed at its
first step: the batch lacked the sampler's logprobs that `grpo_loss` reads), on a tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_kind_and_head_measures_a_step(tiny_model_dir, tmp_path):
    out = tmp_path / "results.json"
    command = [
        sys.executable, str(ROOT / "benchmarks" / "step_memory.py"), "--model", str(tiny_model_dir),
        "--kinds", "sft", "grpo", "--heads", "kept", "recompute", "none", "--tokens", "64",
        "--row-tokens", "32", "--json", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(out.read_text())  # {"kind|head|tokens": measurement}
    assert sorted(results) == sorted(
        f"{kind}|{head}|64" for kind in ("sft", "grpo") for head in ("kept", "recompute", "none")
    )
    assert all(r["step_peak_mb"] > 0 and r["step_s"] > 0 for r in results.values())
