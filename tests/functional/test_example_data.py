"""Each file of examples/data/ (docs/data.md) trains one step through the CLI on a tiny model, with
no validation set (`data.train.path` alone), and loads every row through the real loaders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.config.common import DatasetConfig
from posttrain.config.supervised import PreferenceDatasetConfig

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
COMMON = ["cluster.backend=local", "logging.tensorboard=false", "logging.plots=false"]
RUNS = {
    "sft_messages.jsonl": ("sft", ["sft.max_steps=1", "sft.global_batch_size=4", "policy.max_seq_len=96"]),
    "sft_prompt_response.jsonl": (
        "sft",
        ["sft.max_steps=1", "sft.global_batch_size=4", "policy.max_seq_len=96"],
    ),
    "preference_pairs.jsonl": (
        "dpo",
        ["dpo.max_steps=1", "dpo.global_batch_size=4", "policy.max_seq_len=96"],
    ),
    "grpo_tasks.jsonl": (
        "grpo",
        [
            "grpo.max_steps=1",
            "grpo.prompts_per_step=2",
            "grpo.generations_per_prompt=2",
            "generation.max_new_tokens=8",
            "policy.max_seq_len=96",
        ],
    ),
}


def test_every_example_file_is_covered():
    assert sorted(p.name for p in DATA.glob("*.jsonl")) == sorted(RUNS)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_example_file_trains_one_step_without_validation(name, tiny_model_dir, tmp_path, capsys):
    command, extra = RUNS[name]
    run = tmp_path / "run"
    args = [
        command,
        f"policy.model_name={tiny_model_dir}",
        f"data.train.path={DATA / name}",
        f"logging.run_dir={run}",
    ]
    assert main([*args, *COMMON, *extra]) == 0, capsys.readouterr().err
    assert "validation: null" in (run / "config.yaml").read_text()
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(row["step"] for row in logged) == 1
    assert not [k for row in logged for k in row if k.startswith("val/")]


def test_every_row_loads_through_the_real_loaders(tokenizer):
    from posttrain.data.preference import build_preference_dataset
    from posttrain.data.sft import build_sft_dataset
    from posttrain.data.tasks import build_tasks

    def lines(name: str) -> int:
        return len((DATA / name).read_text().splitlines())

    for name in ("sft_messages.jsonl", "sft_prompt_response.jsonl"):
        data = build_sft_dataset(DatasetConfig(path=str(DATA / name)), tokenizer, max_seq_len=256)
        assert len(data) == lines(name) and data.num_truncated == data.num_dropped == 0
    pairs = build_preference_dataset(
        PreferenceDatasetConfig(path=str(DATA / "preference_pairs.jsonl")), tokenizer, max_seq_len=256
    )
    assert len(pairs) == lines("preference_pairs.jsonl")
    tasks = build_tasks(DatasetConfig(path=str(DATA / "grpo_tasks.jsonl")))
    assert len(tasks) == lines("grpo_tasks.jsonl")
    assert tasks[0]["answer"] == "5" and tasks[0]["messages"][-1]["content"].startswith("What is 2 + 3?")
