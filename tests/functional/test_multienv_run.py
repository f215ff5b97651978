"""One GRPO run over two real environments (math and the sliding puzzle) on the tiny random model,
local backend: each step's batch mixes both, each episode is played by its own environment (one
turn for a sum, several moves for a puzzle, each turn within its environment's max_new_tokens), the metrics come per environment beside the overall
ones, validation reports each environment's held-out set, and a resumed run goes on from the
mixture sampler's position."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from posttrain.cli import main

pytestmark = pytest.mark.timeout(600)

SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]}
RECIPE = {
    "policy": {"max_seq_len": 256},
    "environments": {
        "math": {},
        "puzzle": {
            "name": "sliding_puzzle",
            "kwargs": {
                "min_size": 2,
                "max_size": 2,
                "max_shuffle_moves": 3,
                "max_moves": 3,
                "action_prefix": True,
            },
            "max_turns": 3,
            "max_new_tokens": 2,  # its own turn limit; math keeps generation's 6
        },
    },
    "data": {
        "sources": {
            "sums": {
                "environment": "math",
                "train": {"reasoning_gym": {"size": 16, "kwargs": SUMS}},
                "validation": {"reasoning_gym": {"size": 2, "seed": 99999, "kwargs": SUMS}},
                "system_prompt": "Put the final answer in \\boxed{}.",
            },
            "puzzles": {
                "environment": "puzzle",
                "train": {"environment_tasks": {"size": 8, "seed": 11}},
                "validation": {"environment_tasks": {"size": 3, "seed": 99999}},
            },
        }
    },
    "grpo": {"max_steps": 1, "prompts_per_step": 2, "generations_per_prompt": 2, "val_every": 1},
    "generation": {"max_new_tokens": 6},
    "cluster": {"backend": "local"},
    "logging": {"tensorboard": False},
}


def test_a_grpo_step_over_math_and_the_sliding_puzzle(tiny_model_dir: Path, tmp_path: Path) -> None:
    recipe, run_dir = tmp_path / "multi.yaml", tmp_path / "run"
    recipe.write_text(yaml.safe_dump(RECIPE))
    args = [
        "grpo",
        "--config",
        str(recipe),
        f"policy.model_name={tiny_model_dir}",
        f"logging.run_dir={run_dir}",
    ]
    assert main(args) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    [step] = [r for r in rows if "reward/mean" in r]
    assert step["math/share"] == step["puzzle/share"] == 0.5  # weights 1, 1: one prompt of each, G = 2
    assert 0.0 <= step["math/reward/mean"] <= 1.0 and 0.0 <= step["puzzle/reward/mean"] <= 1.0
    assert step["math/episode/turns_max"] == 1.0 and step["puzzle/episode/turns_mean"] >= 1.0
    assert "math/env/boxed_rate" in step and "puzzle/env/illegal_action_rate" in step
    # each environment's turn limit: at most 2 tokens a move, where a sum's one reply runs to 6
    assert step["puzzle/episode/generated_tokens_mean"] <= 2 * step["puzzle/episode/turns_mean"]
    assert step["math/episode/generated_tokens_mean"] > 2
    val = [r for r in rows if "val/accuracy" in r]
    assert [r["step"] for r in val] == [0, 1]
    for row in val:  # 2 sums and 3 puzzles, one greedy sample each
        assert {"val/math/accuracy", "val/puzzle/accuracy", "val/puzzle/env/first_move_optimal_rate"} <= set(
            row
        )
        overall = (2 * row["val/math/accuracy"] + 3 * row["val/puzzle/accuracy"]) / 5
        assert row["val/accuracy"] == pytest.approx(overall)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert sorted(s["task_name"] for s in samples) == ["math", "math", "puzzle", "puzzle"]
    for s in samples:  # each prompt from its own environment; a sum is one reply
        is_math = s["task_name"] == "math"
        assert s["prompt"].startswith("Calculate" if is_math else "Let's play the sliding puzzle")
        assert "turns" not in s or not is_math

    state = json.loads((run_dir / "checkpoints" / "step_000001" / "trainer_state.json").read_text())
    assert [source["offset"] for source in state["sampler"]["sources"]] == [1, 1]
    assert main([*args, "grpo.max_steps=2", "grpo.val_every=5"]) == 0  # resumes at step 1
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
