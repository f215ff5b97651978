"""A short version of each environment recipe in examples/configs/: the recipe file itself, through
`posttrain grpo`, with a tiny random model and a handful of episodes (one training step, validation
before and after). The claim: the recipe's environment, task generation, episode limits and
metrics run end to end; the learning curves are measured in the docs, not here."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from posttrain.cli import main

pytestmark = pytest.mark.timeout(600)

RECIPES = {
    "grpo_sliding_puzzle.yaml": "env/solved_rate",
    "grpo_sliding_puzzle_3x3.yaml": "env/first_move_optimal_rate",
    "grpo_calculator.yaml": "env/tool_call_rate",
    "grpo_code.yaml": "env/pass_rate",
    "grpo_code_docstring.yaml": "env/pass_rate",
    "grpo_reasoning_gym.yaml": "env/tries_per_episode",
    "grpo_reasoning_gym_direction.yaml": "env/first_try_accuracy",
    "grpo_wordle.yaml": "env/solved_rate",
    "grpo_text2sql.yaml": "env/sql_rate",
    "grpo_text2sql_novel.yaml": "env/sql_rate",
    "grpo_text2sql_novel_short.yaml": "env/sql_rate",
    "grpo_wordle_sft.yaml": "env/solved_rate",
    "grpo_wordle_candidates.yaml": "env/solved_rate",
    "grpo_wordle_scan.yaml": "env/solved_rate",
    "grpo_wordle_absent.yaml": "env/solved_rate",
}


def one_grpo_step(recipe: str, model_dir: Path, run_dir: Path, *overrides: str) -> list[dict]:
    """`posttrain grpo --config examples/configs/<recipe>` for one step of 2 prompts x 2 samples of at
    most 6 tokens on the tiny model (local backend), validated before and after; its metrics rows."""
    args = ["grpo", "--config", f"examples/configs/{recipe}", f"policy.model_name={model_dir}"]
    args += [
        "grpo.max_steps=1",
        "grpo.prompts_per_step=2",
        "grpo.generations_per_prompt=2",
        "grpo.val_every=1",
    ]
    args += ["generation.max_new_tokens=6", "cluster.backend=local", "logging.tensorboard=false"]
    assert main([*args, *overrides, f"logging.run_dir={run_dir}"]) == 0
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_runs_a_step(recipe: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    if recipe.startswith("grpo_code"):
        from conftest import require_sandbox

        require_sandbox()
    sizes = ["data.train.environment_tasks.size=8", "data.validation.environment_tasks.size=2"]
    rows = one_grpo_step(recipe, tiny_model_dir, tmp_path / "run", *sizes)
    assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 1]
    # the reply length (generated tokens) is in the held-out curve, as in training's
    assert all(r["val/response_length"] > 0 for r in rows if "val/accuracy" in r)
    if recipe.startswith("grpo_code"):  # one turn of at most 6 new tokens
        assert all(0 < r["val/response_length"] <= 6 for r in rows if "val/accuracy" in r)
    [step] = [r for r in rows if "reward/mean" in r]
    assert step["step"] == 1 and RECIPES[recipe] in step
    assert (
        0.0 <= step["reward/mean"] <= 1.0 and step["episode/turns_mean"] >= 1 and step["response_length"] > 0
    )


def test_multi_env_recipe_runs_a_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    """examples/configs/grpo_multi_env.yaml: math, the calculator tool and the sliding puzzle in one
    step: the recipe's weights 2, 1, 1 of 4 prompts give two sums, one product and one puzzle; every
    environment's metrics and its held-out accuracy are logged beside the overall ones."""
    run_dir = tmp_path / "run"
    sizes = []
    for source, kind in (
        ("sums", "reasoning_gym"),
        ("products", "environment_tasks"),
        ("puzzles", "environment_tasks"),
    ):
        sizes += [
            f"data.sources.{source}.train.{kind}.size=8",
            f"data.sources.{source}.validation.{kind}.size=2",
        ]
    rows = one_grpo_step("grpo_multi_env.yaml", tiny_model_dir, run_dir, *sizes, "grpo.prompts_per_step=4")
    names = ("math", "calculator", "puzzle")
    for row in (r for r in rows if "val/accuracy" in r):
        assert all(0.0 <= row[f"val/{name}/accuracy"] <= 1.0 for name in names)
    [step] = [r for r in rows if "reward/mean" in r]
    assert [step[f"{name}/share"] for name in names] == [pytest.approx(s) for s in (1 / 2, 1 / 4, 1 / 4)]
    assert "calculator/env/tool_call_rate" in step and "puzzle/env/illegal_action_rate" in step
    assert step["math/episode/turns_max"] == 1.0 and step["calculator/episode/turns_mean"] >= 1.0


def test_gdpo_recipe_runs_a_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    """examples/configs/grpo_gdpo.yaml: the math_format environment's two named rewards reach the
    gdpo advantage (each component's mean logged, the reward their sum, at most 1 + 0.2)."""
    sizes = ["data.train.reasoning_gym.size=8", "data.validation.reasoning_gym.size=2"]
    rows = one_grpo_step("grpo_gdpo.yaml", tiny_model_dir, tmp_path / "run", *sizes)
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


WARM_STARTS = {
    "code": ("examples/code_transcripts.py", None, "sft_code_docstring.yaml", "grpo_code_docstring_sft.yaml"),
    "wordle": ("examples/wordle_transcripts.py", "{}", "sft_wordle.yaml", "grpo_wordle_sft.yaml"),
    "text2sql": (
        "examples/text2sql_transcripts.py",
        '{"sql_prefix": true}',
        "sft_text2sql_short.yaml",
        "grpo_text2sql_novel_short.yaml",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WARM_STARTS))
def test_warm_start_recipes_chain(name: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """A warm-started recipe's steps in order, each for one step: the transcripts script (training and
    held-out files), SFT on them (its sft_*.yaml), then GRPO from the SFT checkpoint (its grpo_*.yaml),
    validated before and after."""
    import runpy

    path, env, sft_recipe, grpo_recipe = WARM_STARTS[name]
    script = runpy.run_path(path, run_name="transcripts")
    train, held = tmp_path / "sft.jsonl", tmp_path / "sft_heldout.jsonl"
    env_args = ["--env", env] if env is not None else []
    script["main"]([str(train), "--count", "8", *env_args])
    script["main"]([str(held), "--count", "4", "--seed", "99999", "--split", "heldout", *env_args])
    common = ["cluster.backend=local", "logging.tensorboard=false"]
    sft_dir = tmp_path / "sft"
    sft = ["sft", "--config", f"examples/configs/{sft_recipe}", f"policy.model_name={tiny_model_dir}"]
    sft += [f"data.train.path={train}", f"data.validation.path={held}", "sft.max_steps=1", "sft.val_every=1"]
    sft += ["sft.global_batch_size=4", "checkpoint.save_every=1", *common, f"logging.run_dir={sft_dir}"]
    assert main(sft) == 0
    [checkpoint] = (sft_dir / "checkpoints").glob("step_*")
    sizes = ["data.train.environment_tasks.size=8", "data.validation.environment_tasks.size=2"]
    rows = one_grpo_step(grpo_recipe, checkpoint / "model", tmp_path / "grpo", *sizes)
    assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 1]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1]


@pytest.mark.slow  # 17-23 s on the 2-core machine
def test_sliding_puzzle_3x3_recipes_chain(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The 3x3 sliding puzzle's recipes in order, each for one step: oracle transcripts (the script),
    SFT on them (sft_sliding_puzzle.yaml), GRPO from the SFT checkpoint (grpo_sliding_puzzle_3x3.yaml),
    then the held-out evaluation (eval_sliding_puzzle_3x3.yaml), with the blind baseline and the
    first-move rate beside the solved rate in validation and in the evaluation summary."""
    import runpy

    script = runpy.run_path("examples/sliding_puzzle_transcripts.py", run_name="transcripts")
    env = (
        '{"min_size": 2, "max_size": 3, "max_shuffle_moves": 15, "redraw_board": true, "action_prefix": true}'
    )
    train, held = tmp_path / "sft.jsonl", tmp_path / "sft_heldout.jsonl"
    script["main"]([str(train), "--count", "16", "--env", env])
    script["main"]([str(held), "--count", "4", "--seed", "99999", "--split", "heldout", "--env", env])
    common = ["cluster.backend=local", "logging.tensorboard=false"]
    sft_dir, grpo_dir = tmp_path / "sft", tmp_path / "grpo"
    sft = [
        "sft",
        "--config",
        "examples/configs/sft_sliding_puzzle.yaml",
        f"policy.model_name={tiny_model_dir}",
    ]
    sft += [f"data.train.path={train}", f"data.validation.path={held}", "sft.max_steps=1", "sft.val_every=1"]
    assert (
        main(
            [
                *sft,
                "sft.global_batch_size=4",
                "checkpoint.save_every=1",
                *common,
                f"logging.run_dir={sft_dir}",
            ]
        )
        == 0
    )
    [checkpoint] = (sft_dir / "checkpoints").glob("step_*")
    grpo = [
        "grpo",
        "--config",
        "examples/configs/grpo_sliding_puzzle_3x3.yaml",
        f"policy.model_name={checkpoint / 'model'}",
    ]
    grpo += [
        "data.train.environment_tasks.size=8",
        "data.validation.environment_tasks.size=2",
        "grpo.max_steps=1",
    ]
    grpo += [
        "grpo.prompts_per_step=2",
        "grpo.generations_per_prompt=2",
        "grpo.val_every=1",
        "generation.max_new_tokens=6",
    ]
    assert main([*grpo, *common, f"logging.run_dir={grpo_dir}"]) == 0
    rows = [json.loads(line) for line in (grpo_dir / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if "val/accuracy" in r]
    assert [r["step"] for r in val] == [0, 1]
    for row in val:
        assert 0.0 <= row["val/env/first_move_optimal_rate"] <= 1.0
        assert 0.0 < row["val/env/blind_solved_rate"] <= 1.0
    out = tmp_path / "eval"
    evaluation = ["eval", "--config", "examples/configs/eval_sliding_puzzle_3x3.yaml", f"model={grpo_dir}"]
    assert (
        main(
            [
                *evaluation,
                "data.dataset.environment_tasks.size=4",
                "generation.max_new_tokens=6",
                f"output_dir={out}",
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_problems"] == 4
    assert {"env/first_move_optimal_rate", "env/blind_solved_rate"} <= set(summary)


def sft_one_step(recipe: str, model_dir: Path, train: Path, held: Path, run_dir: Path) -> None:
    """`posttrain sft` with an example recipe for one step of 4 rows on the given train and validation
    files, on the local backend, saving a checkpoint."""
    sft = ["sft", "--config", f"examples/configs/{recipe}", f"policy.model_name={model_dir}"]
    sft += [f"data.train.path={train}", f"data.validation.path={held}", "sft.max_steps=1", "sft.val_every=1"]
    sft += ["sft.global_batch_size=4", "checkpoint.save_every=1", "cluster.backend=local"]
    assert main([*sft, "logging.tensorboard=false", f"logging.run_dir={run_dir}"]) == 0


def checked_transcripts(recipe: str, tmp_path: Path) -> tuple[Path, Path]:
    """8 training and 2 held-out checked transcripts, written by the script with the environment of
    the recipe's header (its `ENV='...'` line)."""
    import runpy

    script = runpy.run_path("examples/sliding_puzzle_transcripts.py", run_name="transcripts")
    env = re.search(r"^#   ENV='(.*)'$", Path(f"examples/configs/{recipe}").read_text(), re.M).group(1)
    train, held = tmp_path / "sft.jsonl", tmp_path / "sft_heldout.jsonl"
    script["main"]([str(train), "--count", "8", "--checked", "--env", env])
    script["main"](
        [str(held), "--count", "2", "--seed", "99999", "--split", "heldout", "--checked", "--env", env]
    )
    return train, held


def eval_two_boards(recipe: str, model: Path, out: Path) -> dict[str, Any]:
    """`posttrain eval` with an example recipe on 2 held-out boards, 8 tokens a turn; its summary."""
    evaluation = ["eval", "--config", f"examples/configs/{recipe}", f"model={model}"]
    evaluation += [
        "data.dataset.environment_tasks.size=2",
        "generation.max_new_tokens=8",
        f"output_dir={out}",
    ]
    assert main(evaluation) == 0
    return json.loads((out / "summary.json").read_text())


def grpo_puzzle_one_step(recipe: str, sft_dir: Path, run_dir: Path) -> None:
    """`posttrain grpo` with a 3x3 sliding-puzzle recipe for one step of 2 boards x 2 episodes from the
    SFT run's checkpoint, validated before and after on 2 held-out boards (with the blind baseline)."""
    [checkpoint] = (sft_dir / "checkpoints").glob("step_*")
    grpo = ["grpo", "--config", f"examples/configs/{recipe}", f"policy.model_name={checkpoint / 'model'}"]
    grpo += ["policy.dtype=float32", "grpo.max_steps=1", "data.train.environment_tasks.size=4"]
    grpo += ["data.validation.environment_tasks.size=2", "grpo.prompts_per_step=2"]
    grpo += ["grpo.generations_per_prompt=2", "grpo.val_every=1", "generation.max_new_tokens=8"]
    grpo += ["cluster.backend=local", "logging.tensorboard=false", f"logging.run_dir={run_dir}"]
    assert main(grpo) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 1]
    assert all(0.0 < r["val/env/blind_solved_rate"] <= 1.0 for r in rows if "val/accuracy" in r)


@pytest.mark.slow  # ~15 s on the 2-core machine
def test_sliding_puzzle_relabel_recipe(tiny_model_dir: Path, tmp_path: Path) -> None:
    """sft_sliding_puzzle_relabel.yaml for one step on relabelled transcripts (the script with the
    recipe's environment), then the held-out evaluation with the goal drawn as a board and the plain
    labels (eval_sliding_puzzle_3x3.yaml, environment.kwargs.goal_board=true)."""
    import runpy

    script = runpy.run_path("examples/sliding_puzzle_transcripts.py", run_name="transcripts")
    recipe = Path("examples/configs/sft_sliding_puzzle_relabel.yaml").read_text()
    env = re.search(r"^#   ENV='(.*)'$", recipe, re.M).group(1)
    heldout = re.search(r"^#   HELDOUT='(.*)'$", recipe, re.M).group(1)
    assert json.loads(env) == {**json.loads(heldout), "relabel_tiles": True}
    train, held = tmp_path / "sft.jsonl", tmp_path / "sft_heldout.jsonl"
    script["main"]([str(train), "--count", "8", "--env", env])
    script["main"]([str(held), "--count", "4", "--seed", "99999", "--split", "heldout", "--env", heldout])
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    assert all(len(r["task"]["labels"]) in (3, 8) for r in rows)
    assert all("Goal: make the board look like this" in r["messages"][0]["content"] for r in rows)
    sft_dir, out = tmp_path / "sft", tmp_path / "eval"
    sft_one_step("sft_sliding_puzzle_relabel.yaml", tiny_model_dir, train, held, sft_dir)
    evaluation = ["eval", "--config", "examples/configs/eval_sliding_puzzle_3x3.yaml", f"model={sft_dir}"]
    evaluation += ["environment.kwargs.goal_board=true", "data.dataset.environment_tasks.size=4"]
    assert main([*evaluation, "generation.max_new_tokens=6", f"output_dir={out}"]) == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    first = samples[0].get("prompt") or samples[0]["messages"][0]["content"]
    assert "Goal: make the board look like this:\n    1 2 3\n  +-------+\n1 | 1 2 3 |\n2 | 4 5 6 |" in first


def test_sliding_puzzle_checked_recipe(tiny_model_dir: Path, tmp_path: Path) -> None:
    """sft_sliding_puzzle_checked.yaml for one step on checked transcripts (the script with the
    environment of the recipe's header), GRPO from it (grpo_sliding_puzzle_3x3_checked.yaml: boards
    3 or 5 moves from solved), then eval_sliding_puzzle_3x3_checked.yaml: no "<action>" prefix, the
    blind baseline and the first-move rate in validation and in the summary."""
    train, held = checked_transcripts("sft_sliding_puzzle_checked.yaml", tmp_path)
    first_reply = json.loads(train.read_text().splitlines()[0])["messages"][1]["content"]
    assert first_reply.startswith("Empty square: row ") and first_reply.endswith("</action>")
    sft_dir, grpo_dir, out = tmp_path / "sft", tmp_path / "grpo", tmp_path / "eval"
    sft_one_step("sft_sliding_puzzle_checked.yaml", tiny_model_dir, train, held, sft_dir)
    grpo_puzzle_one_step("grpo_sliding_puzzle_3x3_checked.yaml", sft_dir, grpo_dir)
    summary = eval_two_boards("eval_sliding_puzzle_3x3_checked.yaml", sft_dir, out)
    assert summary["num_problems"] == 2
    assert {"env/first_move_optimal_rate", "env/blind_solved_rate"} <= set(summary)


@pytest.mark.slow  # ~15 s on the 2-core machine
def test_sliding_puzzle_cells_recipe(tiny_model_dir: Path, tmp_path: Path) -> None:
    """sft_sliding_puzzle_cells.yaml for one step on checked transcripts of boards written cell by cell
    (the script with the environment of the recipe's header), GRPO from it
    (grpo_sliding_puzzle_3x3_cells.yaml: its episodes' boards written the same way), then
    eval_sliding_puzzle_3x3_cells.yaml: the held-out boards written the same way, and the check report
    on its samples."""
    import runpy

    report = runpy.run_path("examples/sliding_puzzle_check_report.py", run_name="report")["report"]
    recipe = Path("examples/configs/sft_sliding_puzzle_cells.yaml").read_text()
    assert json.loads(re.search(r"^#   ENV='(.*)'$", recipe, re.M).group(1))["board_format"] == "cells"
    train, held = checked_transcripts("sft_sliding_puzzle_cells.yaml", tmp_path)
    first = json.loads(train.read_text().splitlines()[0])["messages"]
    assert "Board:\nrow 1, column 1: " in first[0]["content"] and "+---" not in first[0]["content"]
    assert re.search(r"^(up|down|left|right): row \d, column \d: tile \d, ", first[1]["content"], re.M)
    sft_dir, grpo_dir, out = tmp_path / "sft", tmp_path / "grpo", tmp_path / "eval"
    sft_one_step("sft_sliding_puzzle_cells.yaml", tiny_model_dir, train, held, sft_dir)
    grpo_puzzle_one_step("grpo_sliding_puzzle_3x3_cells.yaml", sft_dir, grpo_dir)
    episodes = [json.loads(line) for line in (grpo_dir / "samples.jsonl").read_text().splitlines()]
    assert episodes and all("Board:\nrow 1, column 1: " in e["prompt"] for e in episodes)
    assert eval_two_boards("eval_sliding_puzzle_3x3_cells.yaml", sft_dir, out)["num_problems"] == 2
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert all("Board:\nrow 1, column 1: " in s["prompt"] for s in samples)
    shares = report(samples)  # a one-step tiny model writes no check: every line wrong
    assert shares["turns"] >= 2 and shares["all_lines"] == 0.0


def test_sliding_puzzle_turns_recipe(tiny_model_dir: Path, tmp_path: Path) -> None:
    """sft_sliding_puzzle_turns.yaml for one step on one row per turn (the script with the environment
    of the recipe's header: history false), GRPO from it (grpo_sliding_puzzle_3x3_turns.yaml: every
    turn its own token sequence), then eval_sliding_puzzle_3x3_turns.yaml: every turn's prompt is the
    first message written for its board."""
    train, held = checked_transcripts("sft_sliding_puzzle_turns.yaml", tmp_path)
    rows = [json.loads(line)["messages"] for line in train.read_text().splitlines()]
    assert len(rows) > 8 and all([m["role"] for m in r] == ["user", "assistant"] for r in rows)
    assert all(r[0]["content"].startswith("Let's play the sliding puzzle") for r in rows)
    sft_dir, grpo_dir, out = tmp_path / "sft", tmp_path / "grpo", tmp_path / "eval"
    sft_one_step("sft_sliding_puzzle_turns.yaml", tiny_model_dir, train, held, sft_dir)
    grpo_puzzle_one_step("grpo_sliding_puzzle_3x3_turns.yaml", sft_dir, grpo_dir)
    metrics = [json.loads(line) for line in (grpo_dir / "metrics.jsonl").read_text().splitlines()]
    [step] = [r for r in metrics if "pg_loss" in r]
    assert step["episode/turns_mean"] > 1 and math.isfinite(step["pg_loss"])  # several sequences an episode
    assert eval_two_boards("eval_sliding_puzzle_3x3_turns.yaml", sft_dir, out)["num_problems"] == 2
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    observations = [m["content"] for s in samples for m in s["messages"] or [] if m["role"] == "user"]
    assert observations and all(
        o.startswith("Let's play the sliding puzzle on a 3x3 board.") for o in observations
    )


def test_calculator_without_an_example_recipes_chain(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The calculator recipes without a worked example, each for one step: tool-call transcripts
    (the script), SFT on them (sft_calculator.yaml), GRPO from the SFT checkpoint
    (grpo_calculator_no_example.yaml: the tool in the system prompt, no example turns, boxed answers
    only), then a held-out family (sums) with eval_calculator_families.yaml."""
    import runpy

    script = runpy.run_path("examples/calculator_transcripts.py", run_name="transcripts")
    env = '{"tools_in_system_prompt": true, "answer_format": "boxed"}'
    train, held = tmp_path / "sft.jsonl", tmp_path / "sft_val.jsonl"
    script["main"]([str(train), "--count", "8", "--env", env])
    script["main"]([str(held), "--count", "4", "--seed", "99999", "--split", "heldout", "--env", env])
    common = ["cluster.backend=local", "logging.tensorboard=false"]
    sft_dir, grpo_dir = tmp_path / "sft", tmp_path / "grpo"
    sft = ["sft", "--config", "examples/configs/sft_calculator.yaml", f"policy.model_name={tiny_model_dir}"]
    sft += [f"data.train.path={train}", f"data.validation.path={held}", "sft.max_steps=1", "sft.val_every=1"]
    sft += ["sft.global_batch_size=4", "checkpoint.save_every=1", *common, f"logging.run_dir={sft_dir}"]
    assert main(sft) == 0
    [checkpoint] = (sft_dir / "checkpoints").glob("step_*")
    grpo = ["grpo", "--config", "examples/configs/grpo_calculator_no_example.yaml"]
    grpo += [f"policy.model_name={checkpoint / 'model'}", "data.train.environment_tasks.size=8"]
    grpo += ["data.validation.environment_tasks.size=2", "grpo.max_steps=1", "grpo.prompts_per_step=2"]
    grpo += ["grpo.generations_per_prompt=2", "grpo.val_every=1", "generation.max_new_tokens=6"]
    assert main([*grpo, *common, f"logging.run_dir={grpo_dir}"]) == 0
    rows = [json.loads(line) for line in (grpo_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 1]
    assert all("env/tool_call_rate" in r for r in rows if "reward/mean" in r)
    out = tmp_path / "eval"
    evaluation = ["eval", "--config", "examples/configs/eval_calculator_families.yaml", f"model={grpo_dir}"]
    evaluation += ["environment.kwargs.operation=+", "environment.kwargs.digits=[4,4]"]
    evaluation += [
        "data.dataset.environment_tasks.size=2",
        "generation.max_new_tokens=6",
        f"output_dir={out}",
    ]
    assert main(evaluation) == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all("+" in json.dumps(s) for s in samples)
