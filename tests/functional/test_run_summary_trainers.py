"""Each trainer loop (SFT, DPO for the preference trainers, GRPO for GRPO / PPO / distillation) ends its
run with the summary (`posttrain.trainers.common.run_summary`): steps, the best checkpoint.metric and
its step, the last checkpoint, the run directory, the wall time (issue #30, console)."""

from __future__ import annotations

import re

from conftest import grpo_test_config, sft_overrides, write_sft_jsonl
from functional.preference_helpers import preference_overrides, write_preference_jsonl

from posttrain.config import load_config
from posttrain.config.supervised import DPOConfig, SFTConfig


def summary_of(stdout: str) -> list[str]:
    """The four summary lines at the end of a run's output."""
    lines = stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("run finished: "))
    return lines[start : start + 4]


def best(history: list[dict], metric: str, better) -> tuple[float, int]:
    """(value, step) of the best `metric` row by hand: `better(a, b)` says whether a beats b."""
    top = None
    for row in history:
        if metric in row and (top is None or better(row[metric], top[0])):
            top = (row[metric], row["step"])
    return top


def check(lines: list[str], result, total: int, metric: str, mode: str, top: tuple[float, int]) -> None:
    wall = r"(\d+\.\ds|\d+m \d\ds|\d+h \d\dm \d\ds)"
    assert re.fullmatch(rf"run finished: {total}/{total} steps, wall time {wall}", lines[0]), lines[0]
    assert lines[1] == f"  best {metric} ({mode}): {top[0]:.6g} at step {top[1]}"
    assert lines[2] == f"  last checkpoint: {result.run_dir}/checkpoints/step_{total:06d}"
    assert lines[3] == f"  run dir: {result.run_dir}"


def test_sft_and_dpo_print_the_summary(tiny_model_dir, tmp_path, capsys):
    from posttrain.trainers.dpo import run_dpo
    from posttrain.trainers.sft import run_sft

    sft_data = write_sft_jsonl(tmp_path / "sft.jsonl", n=16)
    overrides = sft_overrides(
        tiny_model_dir, sft_data, tmp_path / "sft", **{"sft.max_steps": 3, "sft.val_every": 2}
    )
    result = run_sft(load_config(SFTConfig, None, overrides))
    top = best(result.history, "val/loss", lambda a, b: a < b)
    check(summary_of(capsys.readouterr().out), result, 3, "val/loss", "min", top)

    pairs = write_preference_jsonl(tmp_path / "pairs.jsonl", n=16)
    overrides = preference_overrides(tiny_model_dir, pairs, tmp_path / "dpo", "dpo", **{"dpo.max_steps": 2})
    result = run_dpo(load_config(DPOConfig, None, overrides))
    top = best(result.history, "val/loss", lambda a, b: a < b)
    check(summary_of(capsys.readouterr().out), result, 2, "val/loss", "min", top)


def test_grpo_prints_the_summary(tiny_model_dir, tmp_path, capsys):
    from posttrain.trainers.grpo import run_grpo

    result = run_grpo(grpo_test_config(tiny_model_dir, tmp_path / "grpo", **{"grpo.val_every": 1}))
    top = best(result.history, "val/accuracy", lambda a, b: a > b)
    check(summary_of(capsys.readouterr().out), result, 2, "val/accuracy", "max", top)
