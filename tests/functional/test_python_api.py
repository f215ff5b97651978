"""The Python API (`posttrain.sft`, `posttrain.grpo`, ...): configs validated as the CLI validates
them, in-memory rows read as a file's, TRL-style reward functions, per-step callbacks, a light
`import posttrain`, and examples/python_api.py run end to end on a tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_sft_jsonl

import posttrain
from posttrain.config import ConfigError, load_config
from posttrain.config.rl import GRPOConfig
from posttrain.config.supervised import SFTConfig
from posttrain.data.sources import DataError

ROOT = Path(__file__).resolve().parents[2]


def test_import_posttrain_loads_no_heavy_module():
    code = (
        "import sys, posttrain\n"
        "heavy = ('torch', 'transformers', 'ray', 'datasets', 'vllm')\n"
        "assert not [m for m in heavy if m in sys.modules], [m for m in heavy if m in sys.modules]\n"
        "posttrain.GRPOConfig, posttrain.grpo, posttrain.sft, posttrain.load_config\n"
        "assert not [m for m in heavy if m in sys.modules], [m for m in heavy if m in sys.modules]\n"
        "assert {'sft', 'dpo', 'rm', 'grpo', 'ppo', 'distill', 'evaluate', 'GRPOConfig'} <= set(posttrain.__all__)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_dict_and_overrides_give_the_cli_config_and_the_cli_errors(tmp_path):
    overrides = ["policy.optimizer.lr=1e-4"]
    got = posttrain.make_config("sft", {"sft": {"max_steps": 3}, "policy": {"max_seq_len": 64}}, overrides)
    (tmp_path / "r.yaml").write_text("sft: {max_steps: 3}\npolicy: {max_seq_len: 64}\n")
    assert got == load_config(SFTConfig, tmp_path / "r.yaml", overrides)
    assert posttrain.make_config("sft", tmp_path / "r.yaml", overrides) == got
    with pytest.raises(ConfigError, match=r"unknown key `sft.max_stepz`. Did you mean `sft.max_steps`\?"):
        posttrain.make_config("sft", {"sft": {"max_stepz": 3}})
    # a config object keeps its own values; overrides still apply
    obj = GRPOConfig(grpo={"max_steps": 2})
    assert posttrain.make_config("grpo", obj) == obj
    assert posttrain.make_config("grpo", obj, ["grpo.max_steps=5"]).grpo.max_steps == 5
    with pytest.raises(TypeError, match="expected a GRPOConfig"):
        posttrain.make_config("grpo", SFTConfig())


def test_in_memory_rows_become_the_runs_jsonl_and_validate_on_nothing_else(tmp_path):
    import datasets

    rows = [{"prompt": "1+1?", "answer": "2"}, {"prompt": "2+2?", "answer": "4"}]
    run = {"logging": {"run_dir": str(tmp_path / "run")}}
    for given in (rows, datasets.Dataset.from_list(rows)):
        cfg = posttrain.make_config("grpo", run, data={"train": given})
        path = Path(cfg.data.train.path)
        assert path.parent == tmp_path / "run" / "data" and path.name.startswith("train-")
        assert [json.loads(line) for line in path.read_text().splitlines()] == rows
        assert cfg.data.train.reasoning_gym is None and cfg.data.validation is None
    # a config object with the default validation split: dropped too; one it set itself: kept
    obj = GRPOConfig(logging={"run_dir": str(tmp_path / "run")})
    assert posttrain.make_config("grpo", obj, data={"train": rows}).data.validation is None
    own = GRPOConfig(logging={"run_dir": str(tmp_path / "run")}, data={"validation": {"path": "v.jsonl"}})
    assert posttrain.make_config("grpo", own, data={"train": rows}).data.validation.path == "v.jsonl"
    # the quickstart's worked example (data.example_turns) belongs to its task: dropped the same way
    assert cfg.data.example_turns == [] and GRPOConfig().data.example_turns != []
    assert posttrain.make_config("grpo", obj, data={"train": rows}).data.example_turns == []
    shown = [{"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6"}]
    mine = GRPOConfig(logging={"run_dir": str(tmp_path / "run")}, data={"example_turns": shown})
    kept = posttrain.make_config("grpo", mine, data={"train": rows}).data.example_turns
    assert [t.model_dump() for t in kept] == shown
    both = posttrain.make_config("grpo", run, data={"train": rows, "validation": rows[:1]})
    assert Path(both.data.validation.path).name.startswith("validation-")
    with pytest.raises(DataError, match="train_data row 2: expected a dict, got str"):
        posttrain.make_config("grpo", run, data={"train": [rows[0], "oops"]})


def test_a_bad_in_memory_row_is_reported_like_a_files_row(tiny_model_dir, tmp_path):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    config = {"policy": {"model_name": str(tiny_model_dir)}, "logging": {"run_dir": str(tmp_path / "run")}}
    with pytest.raises(DataError, match=r"train-[0-9a-f]{12}\.jsonl row 2: missing key 'response'"):
        posttrain.sft(config, train_data=[good, {"prompt": "no response here"}])


def test_sft_with_rows_and_a_callback_per_logged_row(tiny_model_dir, tmp_path):
    data = write_sft_jsonl(tmp_path / "rows.jsonl", n=16)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    seen: list[tuple[int, dict]] = []
    config = {
        "policy": {"model_name": str(tiny_model_dir), "max_seq_len": 96},
        "sft": {"max_steps": 2, "global_batch_size": 6, "val_every": 2},
        "cluster": {"backend": "local"},
        "logging": {"run_dir": str(tmp_path / "run"), "tensorboard": False, "plots": False},
    }
    result = posttrain.sft(
        config, train_data=rows[:12], validation_data=rows[12:], callbacks=[lambda s, m: seen.append((s, m))]
    )
    assert result.step == 2 and result.last_checkpoint.name == "step_000002"
    assert [s for s, _ in seen] == [0, 1, 2, 2]  # val at start, two steps, val at the end
    assert "val/loss" in seen[0][1] and "loss" in seen[1][1] and "val/loss" in seen[3][1]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["loss"] for row in logged if "loss" in row] == [seen[1][1]["loss"], seen[2][1]["loss"]]


def test_grpo_with_a_python_reward_function(tiny_model_dir, tmp_path):
    calls: list[dict] = []

    def length_mod_3(prompts, completions, answer, **fields):
        rewards = [float(len(c) % 3) for c in completions]
        calls.append({"prompts": prompts, "completions": completions, "answer": answer, "rewards": rewards})
        return rewards

    rows = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(8)]
    seen: list[tuple[int, dict]] = []
    config = {
        "policy": {"model_name": str(tiny_model_dir), "max_seq_len": 96},
        "grpo": {"max_steps": 1, "prompts_per_step": 2, "generations_per_prompt": 4, "val_at_start": False},
        "generation": {"max_new_tokens": 6},
        "cluster": {"backend": "local"},
        "logging": {"run_dir": str(tmp_path / "run"), "tensorboard": False, "plots": False},
    }
    result = posttrain.grpo(
        config, train_data=rows, reward_funcs=[length_mod_3], callbacks=[lambda s, m: seen.append((s, m))]
    )
    assert result.step == 1
    train_call = calls[0]  # then the validation's (no validation rows: none)
    assert len(train_call["completions"]) == 8 and all(isinstance(c, str) for c in train_call["completions"])
    assert all(
        p[-1]["role"] == "user" and p[-1]["content"] in {r["prompt"] for r in rows}
        for p in train_call["prompts"]
    )
    assert [str(int(p[-1]["content"].split()[2]) + 1) for p in train_call["prompts"]] == train_call["answer"]
    step1 = seen[0][1]
    assert seen[0][0] == 1 and step1["env/reward_mean"] == sum(train_call["rewards"]) / 8
    assert step1["env/reward/length_mod_3"] == step1["env/reward_mean"]
    recorded = (tmp_path / "run" / "config.yaml").read_text()
    assert f"{__name__}:test_grpo_with_a_python_reward_function.<locals>.length_mod_3" in recorded


def test_the_python_api_example_runs(tiny_model_dir, tmp_path):
    """examples/python_api.py, as CI runs it: a tiny model, one step of SFT then of GRPO."""
    command = [sys.executable, "examples/python_api.py", "--model", str(tiny_model_dir), "--steps", "1"]
    out = subprocess.run([*command, "--run-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "callback: step 1 {'loss':" in out.stdout and "callback: step 1 {'env/reward_mean':" in out.stdout
    assert (tmp_path / "sft" / "checkpoints" / "step_000001").is_dir()
    assert (tmp_path / "grpo" / "checkpoints" / "step_000001").is_dir()
    assert "__main__:exact_answer" in (tmp_path / "grpo" / "config.yaml").read_text()
