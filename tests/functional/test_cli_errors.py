"""The real command line on errors of the user's own making: one `error: ...` line, exit status 2, no
traceback (unless --debug or POSTTRAIN_DEBUG=1 asks for it).

`posttrain.cli.main` runs in this process (the command line minus `sys.exit`: a fresh interpreter
per call cost a few seconds of imports each); `test_debug_shows_the_traceback` runs the real
`python -m posttrain.cli` process, whose exit status and traceback only a process shows."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from conftest import sft_overrides, write_sft_jsonl

from posttrain.cli import main


def _cli(*args: str, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    """`posttrain ARGS` in this process: its exit status and what it printed. `pythonpath`: a folder
    importable during the call (a user's reward module; dropped from sys.modules after)."""
    out, err = io.StringIO(), io.StringIO()
    if pythonpath:  # a module of the same name imported by an earlier test in this process is not this one
        for module in Path(pythonpath).glob("*.py"):
            sys.modules.pop(module.stem, None)
    before = set(sys.modules)
    with contextlib.ExitStack() as stack:
        if pythonpath:
            stack.enter_context(mock.patch.object(sys, "path", [pythonpath, *sys.path]))
        stack.enter_context(mock.patch.dict(os.environ, {"POSTTRAIN_DEBUG": ""}))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 1
    if pythonpath:
        for name in set(sys.modules) - before:
            if getattr(sys.modules[name], "__file__", "") and sys.modules[name].__file__.startswith(
                pythonpath
            ):
                del sys.modules[name]
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def _cli_process(*args: str, **env: str) -> subprocess.CompletedProcess:
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
        (
            '{"messages": [{"role": "user", "content": "a long first message"} {"role": "assistant"}]}',
            # column 67 (1-based): 14 + 17 + 11 + 22 characters, then '}', ' ' and '{'; 30 characters each side
            'row 9: invalid JSON (Expecting \',\' delimiter at column 67: ...ent": "a long first message"} '
            '<here>{"role": "assistant"}]})',
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "2"}]}),
            "row 9: message 1 has role 'bot'; expected one of ['assistant', 'system', 'tool', 'user']",
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
    for result in (_cli_process("--debug", "sft", *args), _cli_process("sft", *args, POSTTRAIN_DEBUG="1")):
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


# ---------------------------------------------------------------------------------------- issue #30
def _tasks(path, n: int = 8, drop_answer_at: int | None = None):
    """n GRPO rows {"prompt", "answer"}; the row at index `drop_answer_at` has no answer."""
    with open(path, "w") as f:
        for i in range(n):
            row = {"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}
            if i == drop_answer_at:
                del row["answer"]
            f.write(json.dumps(row) + "\n")
    return path


def _grpo_args(model_dir, data, run_dir, **extra) -> list[str]:
    """A 2-step GRPO run on the tiny model: 2 prompts x 4 generations of 4 tokens, no validation."""
    settings = {
        "policy.model_name": model_dir,
        "policy.max_seq_len": 96,
        "data.train.path": data,
        "data.validation": "null",
        "grpo.max_steps": 2,
        "grpo.prompts_per_step": 2,
        "grpo.generations_per_prompt": 4,
        "grpo.val_at_start": False,
        "generation.max_new_tokens": 4,
        "cluster.backend": "local",
        "logging.run_dir": run_dir,
        "logging.tensorboard": False,
        "logging.plots": False,
        **extra,
    }
    return ["grpo", *[f"{k}={v}" for k, v in settings.items()]]


REWARDS = """
def quarter(completion, metadata):
    return 0.25


def broken(completion, metadata):
    raise KeyError("solution")
"""


def test_reward_fn_from_the_command_line_is_called(tiny_model_dir, tmp_path):
    """`environment.kwargs.reward_fn=module:function` imports the function (it was passed on as a
    string: every call failed, reward 0, exit 0)."""
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    run_dir = tmp_path / "run"
    args = _grpo_args(tiny_model_dir, _tasks(tmp_path / "tasks.jsonl"), run_dir)
    env = ["environment.name=reward_fn", "environment.kwargs.reward_fn=my_rewards:quarter"]
    result = _cli(*args, *env, pythonpath=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["reward/mean"] == 0.25 and r["env/verifier_errors"] == 0 for r in steps)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "no_such_module:quarter",
            "environment.kwargs.reward_fn='no_such_module:quarter': cannot import module 'no_such_module' "
            "(ModuleNotFoundError: No module named 'no_such_module'); put its folder on PYTHONPATH",
        ),
        (
            "my_rewards:no_such_function",
            "environment.kwargs.reward_fn='my_rewards:no_such_function': module 'my_rewards' has no "
            "attribute 'no_such_function'",
        ),
    ],
    ids=["module", "function"],
)
def test_reward_fn_that_does_not_import_is_a_config_error(tiny_model_dir, tmp_path, spec, message):
    """Caught by config validation: the run, --print-config and doctor say so before anything starts."""
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    run_dir = tmp_path / "run"
    env = ["environment.name=reward_fn", f"environment.kwargs.reward_fn={spec}"]
    args = _grpo_args(tiny_model_dir, _tasks(tmp_path / "tasks.jsonl"), run_dir)
    for command in (
        [*args, *env],
        ["grpo", "--print-config", *env],
        ["doctor", "--algorithm", "grpo", *env],
    ):
        result = _cli(*command, pythonpath=str(tmp_path))
        assert result.returncode == 2, (command, result.stderr[-3000:])
        assert _error_lines(result) == [f"error: invalid config: `environment`: {message}."]
    assert not run_dir.exists()


def test_a_step_of_verifier_errors_stops_the_run(tiny_model_dir, tmp_path):
    """environment.max_error_fraction (0.5 by default): 8 of 8 samples failed to score."""
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    run_dir = tmp_path / "run"
    args = _grpo_args(tiny_model_dir, _tasks(tmp_path / "tasks.jsonl"), run_dir)
    env = ["environment.name=reward_fn", "environment.kwargs.reward_fn=my_rewards:broken"]
    result = _cli(*args, *env, pythonpath=str(tmp_path))
    assert result.returncode == 2, result.stderr[-3000:]
    assert _error_lines(result) == [
        "error: environment reward_fn: 8 of 8 samples could not be scored (verifier errors), more than "
        "environment.max_error_fraction=0.5; the first: exception: KeyError: 'solution'. Fix the "
        "environment or its reward function (environment.max_error_fraction=null turns this check off)"
    ]
    assert not (run_dir / "checkpoints").exists()  # stopped in step 1, before any update or save

    off = _cli(*args, *env, "environment.max_error_fraction=null", pythonpath=str(tmp_path))
    assert off.returncode == 0, off.stderr[-3000:]


@pytest.mark.parametrize("name", ["no_such_env", "no_such_module:Environment"])
def test_unknown_environment_is_caught_by_print_config_and_doctor(name):
    for command in (["grpo", "--print-config"], ["doctor", "--algorithm", "grpo"]):
        result = _cli(*command, f"environment.name={name}")
        assert result.returncode == 2, result.stderr[-3000:]
        [line] = _error_lines(result)
        assert line.startswith("error: invalid config: `environment`: ")
        assert (
            f"unknown environment {name!r}; registered:" in line
            if ":" not in name
            else "cannot import module 'no_such_module'" in line
        )


def test_grpo_row_without_the_environments_field_names_file_row_and_field(tiny_model_dir, tmp_path):
    """math declares required_fields = ("answer",): checked for every row as the data loads (it was
    found only when the row was sampled, as a traceback naming a batch index)."""
    data = _tasks(tmp_path / "tasks.jsonl", n=8, drop_answer_at=5)
    result = _cli(*_grpo_args(tiny_model_dir, data, tmp_path / "run"))
    assert result.returncode == 2, result.stderr[-3000:]
    assert _error_lines(result) == [
        f"error: {data} row 6: missing field 'answer', which the math environment needs (the row has "
        "keys: prompt); set data.<split>.answer_key to the column that holds it"
    ]


def test_model_path_that_does_not_exist_is_one_line_and_creates_nothing(tmp_path, tiny_model_dir):
    missing = tmp_path / "no_such_model"
    message = (
        f"error: model not found: {missing} is not a folder, a hub id (org/name) or an alias; give a "
        "Hugging Face model folder, a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct, or an alias "
        "from `posttrain models list`"
    )
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=8)
    sft = _cli("sft", *sft_overrides(missing, data, tmp_path / "run"))
    evaluation = _cli("eval", f"model={missing}", f"output_dir={tmp_path / 'eval'}")
    for result in (sft, evaluation):
        assert result.returncode == 2, result.stderr[-3000:]
        assert _error_lines(result) == [message]
    assert not (tmp_path / "run").exists() and not (tmp_path / "eval").exists()


def test_models_pull_unknown_alias_is_one_line():
    result = _cli("models", "pull", "UNKNOWN")
    assert result.returncode == 2
    [line] = _error_lines(result)
    assert line.startswith("error: unknown model alias 'UNKNOWN'; known aliases: smollm2-135m-instruct")


def test_unwritable_run_directory_is_one_line(tiny_model_dir, tmp_path):
    """A run directory under a regular file (cannot be created, even by root)."""
    (tmp_path / "a_file").write_text("")
    run_dir = tmp_path / "a_file" / "run"
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=8)
    result = _cli("sft", *sft_overrides(tiny_model_dir, data, run_dir))
    assert result.returncode == 2, result.stderr[-3000:]
    assert _error_lines(result) == [
        f"error: cannot write the run directory {run_dir} (Not a directory); set logging.run_dir to a "
        "writable folder"
    ]


def test_doctor_blames_the_override_not_the_file(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("grpo:\n  max_steps: 3\n")
    for command in (
        ["doctor", "--config", str(recipe)],
        ["doctor", "--config", str(recipe), "--algorithm", "grpo"],
    ):
        result = _cli(*command, "grpo.max_steps=0")
        assert result.returncode == 2, result.stderr[-3000:]
        assert _error_lines(result) == [
            f"error: command-line override(s) grpo.max_steps=0 (not {recipe}, which is valid alone): "
            "invalid config: `grpo.max_steps`: Input should be greater than 0 (got 0)."
        ]


def test_sft_row_without_messages_names_messages(tiny_model_dir, tmp_path):
    data = _bad_rows(tmp_path / "train.jsonl", json.dumps({"text": "hi"}))
    result = _cli("sft", *sft_overrides(tiny_model_dir, data, tmp_path / "run"))
    assert result.returncode == 2, result.stderr[-3000:]
    assert _error_lines(result) == [
        f"error: {data} row 9: missing key 'messages' (a list of chat messages), or 'prompt' and "
        "'response' (the row has keys: text)"
    ]


def test_max_steps_beyond_the_epochs_says_so_at_start(tiny_model_dir, tmp_path):
    """24 rows / 8 per step = 3 steps an epoch; sft.max_steps=5 with one epoch trains 3 and says so."""
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=24)
    settings = {"sft.max_steps": 5, "sft.num_epochs": 1, "sft.val_at_start": False, "logging.plots": False}
    result = _cli("sft", *sft_overrides(tiny_model_dir, data, tmp_path / "run", **settings))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "note: sft.max_steps=5 is more than the 3 steps of sft.num_epochs=1 (an epoch: 24 examples, "
        "3 steps); training 3 steps. Raise sft.num_epochs to train longer"
    ) in result.stdout
