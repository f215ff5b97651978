"""The real command line on errors of the user's own making: one `error: ...` line, exit status 2, no
traceback (unless --debug or POSTTRAIN_DEBUG=1 asks for it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import sft_overrides, write_sft_jsonl


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "posttrain.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def _error_lines(result: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def _bad_rows(path, row: str):
    """Eight good rows, then `row` as row 9."""
    write_sft_jsonl(path, n=8)
    with open(path, "a") as f:
        f.write(row + "\n")
    return path


def test_missing_dataset_file_is_one_line(tiny_model_dir, tmp_path):
    missing = tmp_path / "no_such_dir" / "train.jsonl"
    result = _cli("sft", *sft_overrides(tiny_model_dir, missing, tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert _error_lines(result) == [f"error: dataset file not found: {missing}"]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            json.dumps({"prompt": "What is 1 + 1?"}),
            "row 9: missing key 'response' (the row has keys: prompt)",
        ),
        ('{"messages": [', "row 9: invalid JSON (Expecting value)"),
        (
            json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "2"}]}),
            "row 9: message 1 has role 'bot'; expected one of ['assistant', 'system', 'user']",
        ),
    ],
    ids=["missing_field", "invalid_json", "bad_role"],
)
def test_malformed_jsonl_row_names_file_row_and_field(tiny_model_dir, tmp_path, row, message):
    data = _bad_rows(tmp_path / "train.jsonl", row)
    result = _cli("sft", *sft_overrides(tiny_model_dir, data, tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert _error_lines(result) == [f"error: {data} {message}"]


def test_debug_shows_the_traceback(tiny_model_dir, tmp_path):
    data = _bad_rows(tmp_path / "train.jsonl", json.dumps({"prompt": "What is 1 + 1?"}))
    args = sft_overrides(tiny_model_dir, data, tmp_path / "run")
    for result in (_cli("--debug", "sft", *args), _cli("sft", *args, POSTTRAIN_DEBUG="1")):
        assert result.returncode == 1
        assert "Traceback" in result.stderr
        assert result.stderr.rstrip().endswith(
            f"DataError: {data} row 9: missing key 'response' (the row has keys: prompt)"
        )


def test_config_error_is_one_line():
    result = _cli("grpo", "--print-config", "grpo.updates_per_batch=3", "cluster.num_workers=2")
    assert result.returncode == 2 and result.stdout == ""
    [line] = _error_lines(result)
    assert line.startswith(
        "error: invalid config: grpo.updates_per_batch=3 does not split the rollout batch of 32"
    )
