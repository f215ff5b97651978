"""A short version of each environment recipe in examples/configs/: the recipe file itself, through
`posttrain grpo`, with a tiny random model and a handful of episodes (one training step, validation
before and after). The claim: the recipe's environment, task generation, episode limits and
metrics run end to end; the learning curves are measured in the docs, not here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.cli import main

pytestmark = pytest.mark.timeout(600)

RECIPES = {
    "grpo_sliding_puzzle.yaml": "env/solved_rate",
    "grpo_calculator.yaml": "env/tool_call_rate",
    "grpo_code.yaml": "env/pass_rate",
    "grpo_reasoning_gym.yaml": "env/tries_per_episode",
    "grpo_wordle.yaml": "env/solved_rate",
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_runs_a_step(recipe: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    if recipe == "grpo_code.yaml":
        from conftest import require_sandbox

        require_sandbox()
    run_dir = tmp_path / "run"
    args = [
        "grpo",
        "--config",
        f"examples/configs/{recipe}",
        f"policy.model_name={tiny_model_dir}",
        "data.train.environment_tasks.size=8",
        "data.validation.environment_tasks.size=2",
        "grpo.max_steps=1",
        "grpo.prompts_per_step=2",
        "grpo.generations_per_prompt=2",
        "grpo.val_every=1",
        "generation.max_new_tokens=6",
        "cluster.backend=local",
        "logging.tensorboard=false",
        f"logging.run_dir={run_dir}",
    ]
    assert main(args) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 1]
    [step] = [r for r in rows if "reward/mean" in r]
    assert step["step"] == 1 and RECIPES[recipe] in step
    assert 0.0 <= step["reward/mean"] <= 1.0 and step["episode/turns_mean"] >= 1


def test_gdpo_recipe_runs_a_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    """examples/configs/grpo_gdpo.yaml: the math_format environment's two named rewards reach the
    gdpo advantage (each component's mean logged, the reward their sum, at most 1 + 0.2)."""
    run_dir = tmp_path / "run"
    args = [
        "grpo",
        "--config",
        "examples/configs/grpo_gdpo.yaml",
        f"policy.model_name={tiny_model_dir}",
        "data.train.reasoning_gym.size=8",
        "data.validation.reasoning_gym.size=2",
        "grpo.max_steps=1",
        "grpo.prompts_per_step=2",
        "grpo.generations_per_prompt=2",
        "grpo.val_every=1",
        "generation.max_new_tokens=6",
        "cluster.backend=local",
        "logging.tensorboard=false",
        f"logging.run_dir={run_dir}",
    ]
    assert main(args) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    [step] = [r for r in rows if "reward/mean" in r]
    parts = step["reward/correct/mean"] + step["reward/format/mean"]
    assert step["reward/mean"] == pytest.approx(parts, abs=1e-6) and 0.0 <= parts <= 1.2
    assert "env/format_rate" in step and "pg_loss" in step


def test_message_penalties_run_a_step_on_the_calculator_recipe(tiny_model_dir: Path, tmp_path: Path) -> None:
    """advantage.invalid_tool_call_advantage / malformed_thinking_advantage through `posttrain grpo`
    on the multi-turn calculator recipe: the per-turn flags reach the trainer (their rates logged)."""
    run_dir = tmp_path / "run"
    args = [
        "grpo",
        "--config",
        "examples/configs/grpo_calculator.yaml",
        f"policy.model_name={tiny_model_dir}",
        "data.train.environment_tasks.size=4",
        "data.validation.environment_tasks.size=2",
        "grpo.max_steps=1",
        "grpo.prompts_per_step=2",
        "grpo.generations_per_prompt=2",
        "grpo.val_at_start=false",
        "generation.max_new_tokens=6",
        "advantage.invalid_tool_call_advantage=-1.0",
        "advantage.malformed_thinking_advantage=-0.5",
        "cluster.backend=local",
        "logging.tensorboard=false",
        f"logging.run_dir={run_dir}",
    ]
    assert main(args) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    [step] = [r for r in rows if "reward/mean" in r]
    assert 0.0 <= step["invalid_tool_call_rate"] <= 1.0 and 0.0 <= step["malformed_thinking_rate"] <= 1.0
