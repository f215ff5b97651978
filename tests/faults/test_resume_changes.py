"""Resuming a run directory with changed settings: a change that cannot apply mid-run (the learning
rate, the data, the model...) is refused in one line before anything is written; an allowed one
(`posttrain.trainers.common.RESUMABLE_CHANGES`: max_steps, cadences, validation...) is applied and
logged, and config.yaml always records the config the run used."""

from __future__ import annotations

import yaml
from conftest import write_sft_jsonl
from fault_helpers import cli, complete_steps, losses, sft_args


def test_resume_refuses_a_changed_learning_rate_and_applies_a_longer_run(tiny_model_dir, tmp_path):
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=24)
    run_dir = tmp_path / "run"
    first = cli(sft_args(tiny_model_dir, data, run_dir, **{"sft.max_steps": 2}))
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = run_dir / "checkpoints" / "step_000002"
    saved = (run_dir / "config.yaml").read_text()

    changed = sft_args(tiny_model_dir, data, run_dir, **{"sft.max_steps": 3, "policy.optimizer.lr": 1e-4})
    refused = cli(changed)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    [line] = [text for text in refused.stderr.splitlines() if text.startswith("error:")]
    assert line.startswith(
        f"error: cannot resume from {checkpoint} with changed settings: policy.optimizer.lr 0.001 -> 0.0001. "
        "These cannot change mid-run: set them back, or start a new run"
    )
    assert "sft.max_steps" not in line.split(". These")[0]  # an allowed change is not refused
    assert (run_dir / "config.yaml").read_text() == saved  # no config.yaml that was not used
    assert complete_steps(run_dir) == [1, 2] and [s for s, _ in losses(run_dir)] == [1, 2]

    longer = cli(sft_args(tiny_model_dir, data, run_dir, **{"sft.max_steps": 3}))
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert f"resuming from {checkpoint} with changed settings: sft.max_steps 2 -> 3" in longer.stdout
    assert f"resumed from {checkpoint}" in longer.stdout
    assert [s for s, _ in losses(run_dir)] == [1, 2, 3]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["sft"]["max_steps"] == 3
    saved_by_step_3 = yaml.safe_load((run_dir / "checkpoints" / "step_000003" / "config.yaml").read_text())
    assert saved_by_step_3["sft"]["max_steps"] == 3
