"""A malformed row in any data format stops the command before training, with one line naming the
file (or dataset folder), the row and the field: SFT rows in JSONL, parquet, a `datasets`
save_to_disk folder and a folder of data files; preference pairs in JSONL and parquet; RL tasks.

The command line's `main` runs in this process (the data is read before any worker starts, so a
separate interpreter would only add its start-up time); `test_cli_errors.py` covers the same
errors through `python -m posttrain.cli`.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from conftest import sft_overrides
from functional.preference_helpers import preference_overrides

from posttrain.cli import main

GOOD = {"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]}


def run(args: list[str], capsys) -> str:
    """The command's single `error:` line (exit status 2, no traceback)."""
    status = main(args)
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    return line


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def sft(tiny_model_dir, data, tmp_path) -> list[str]:
    return ["sft", *sft_overrides(tiny_model_dir, data, tmp_path / "run")]


def test_sft_jsonl_content_not_a_string(tiny_model_dir, tmp_path, capsys):
    bad = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]}
    data = write_jsonl(tmp_path / "train.jsonl", [GOOD, GOOD, bad])
    assert run(sft(tiny_model_dir, data, tmp_path), capsys) == (
        f"error: {data} row 3: message 1 has content None; expected a string"
    )


def test_sft_parquet_null_field(tiny_model_dir, tmp_path, capsys):
    rows = [{"prompt": "q1", "response": "a1"}, {"prompt": "q2", "response": None}]
    data = tmp_path / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(data))
    assert run(sft(tiny_model_dir, data, tmp_path), capsys) == f"error: {data} row 2: 'response' is null"


def test_sft_saved_datasets_folder_bad_role(tiny_model_dir, tmp_path, capsys):
    bad = {"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "4"}]}
    folder = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list([GOOD, GOOD, GOOD, bad])}).save_to_disk(
        str(folder)
    )
    assert run(sft(tiny_model_dir, folder, tmp_path), capsys) == (
        f"error: {folder}[train] row 4: message 1 has role 'bot'; expected one of ['assistant', 'system', 'tool', 'user']"
    )


def test_sft_folder_of_data_files_missing_field(tiny_model_dir, tmp_path, capsys):
    folder = tmp_path / "files"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"prompt": "q1", "response": "a1"}, {"prompt": "q2"}])
    assert (
        run(sft(tiny_model_dir, folder, tmp_path), capsys)
        == f"error: {folder}[train] row 2: 'response' is null"
    )


def test_preference_jsonl_missing_rejected(tiny_model_dir, tmp_path, capsys):
    rows = [{"prompt": "p", "chosen": "a", "rejected": "b"}] * 2 + [{"prompt": "p", "chosen": "a"}]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    args = ["dpo", *preference_overrides(tiny_model_dir, data, tmp_path / "run", "dpo")]
    assert run(args, capsys) == (
        f"error: {data} row 3: missing key 'rejected' (the row has keys: prompt, chosen)"
    )


def test_preference_parquet_message_content(tiny_model_dir, tmp_path, capsys):
    reply = [{"role": "assistant", "content": "a"}]
    rows = [
        {"prompt": "p", "chosen": reply, "rejected": reply},
        {"prompt": "p", "chosen": reply, "rejected": [{"role": "assistant", "content": None}]},
    ]
    data = tmp_path / "pairs.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(data))
    args = ["dpo", *preference_overrides(tiny_model_dir, data, tmp_path / "run", "dpo")]
    assert run(args, capsys) == (
        f"error: {data} row 2: `rejected` message 0 has content None; expected a string"
    )


def test_rl_tasks_missing_problem(tiny_model_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "tasks.jsonl", [{"prompt": "1 + 1", "answer": "2"}, {"answer": "3"}])
    settings = {
        "policy.model_name": tiny_model_dir,
        "data.train.path": data,
        "data.validation.path": data,
        "cluster.backend": "local",
        "logging.run_dir": tmp_path / "run",
    }
    message = run(["grpo", *[f"{k}={v}" for k, v in settings.items()]], capsys)
    assert message.startswith(
        f"error: {data} row 2: missing key 'prompt' (or a 'messages' list); the row has keys: answer"
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_the_first_bad_row_is_named_even_far_down(tiny_model_dir, tmp_path, capsys, suffix):
    rows = [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(500)]
    rows[417] = {"prompt": "q", "response": None}
    data = tmp_path / f"train{suffix}"
    if suffix == ".jsonl":
        write_jsonl(data, rows)
    else:
        datasets.Dataset.from_list(rows).to_parquet(str(data))
    assert run(sft(tiny_model_dir, data, tmp_path), capsys) == f"error: {data} row 418: 'response' is null"
