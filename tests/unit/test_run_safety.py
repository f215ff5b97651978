"""The pure pieces behind #30's "never lose work silently": the resume diff and its allow-list, the
metrics truncation on resume, the verifier-error guard, the epochs notice, the two-signal stop,
environment specs checked at config time, required task fields, and the bad-JSON message."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from posttrain.config import load_config
from posttrain.config.common import DatasetConfig
from posttrain.config.loader import ConfigError
from posttrain.config.rl import GRPOConfig
from posttrain.data.sources import DataError, json_error
from posttrain.data.tasks import build_tasks
from posttrain.environments.interface import (
    EnvironmentSpecError,
    VerifierErrorsError,
    check_environment,
    check_verifier_errors,
)
from posttrain.trainers.common import (
    GracefulStop,
    config_changes,
    epochs_notice,
    resumable,
    truncate_step_log,
)


def test_config_changes_lists_every_changed_leaf_with_both_values():
    old = {"policy": {"optimizer": {"lr": 1e-3, "betas": [0.9, 0.999]}}, "data": {"validation": None}}
    new = {
        "policy": {"optimizer": {"lr": 1e-4, "betas": [0.9, 0.999]}},
        "data": {"validation": {"path": "v"}},
    }
    assert config_changes(old, new) == [
        ("data.validation.path", None, "v"),  # a key on one side only is compared with None
        ("policy.optimizer.lr", 1e-3, 1e-4),
    ]
    assert config_changes(old, old) == []


@pytest.mark.parametrize(
    ("key", "allowed"),
    [
        ("grpo.max_steps", True),
        ("sft.num_epochs", True),
        ("checkpoint.save_every", True),
        ("logging.log_every", True),
        ("data.validation.path", True),
        ("environment.max_error_fraction", True),
        ("environments.calculator.max_error_fraction", True),  # a run over several environments
        ("environments.calculator.kwargs.max_tool_calls", False),
        ("data.sources.puzzles.weight", False),
        ("policy.optimizer.lr", False),
        ("data.train.path", False),
        ("grpo.seed", False),
        ("environment.name", False),
    ],
)
def test_resumable_keys(key, allowed):
    assert resumable(key) is allowed


def test_truncate_step_log_keeps_rows_up_to_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "val/loss": 1.0}, {"step": 1}, {"step": 2}, {"step": 3}, {"note": "no step"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "lo')  # a torn last write
    truncate_step_log(path, 2)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"step": 0, "val/loss": 1.0},
        {"step": 1},
        {"step": 2},
        {"note": "no step"},
    ]
    truncate_step_log(path, None)  # a fresh start: the earlier attempt's rows go
    assert not path.exists()
    truncate_step_log(path, 3)  # no file: nothing to do


@pytest.mark.parametrize(
    ("errors", "fraction", "stops"),
    [(4, 0.5, False), (5, 0.5, True), (8, 1.0, False), (8, None, False), (1, 0.0, True), (0, 0.0, False)],
)
def test_verifier_error_guard_stops_above_the_fraction(errors, fraction, stops):
    """8 samples; the guard stops when errors > fraction x 8 (4 of 8 at 0.5 is not "most")."""
    infos = [{"verifier_error": f"exception: E{i}"} for i in range(errors)] + [{"verifier_error": None}] * (
        8 - errors
    )
    infos.reverse()  # the first error is E{errors-1}: the message shows the first in batch order
    if not stops:
        check_verifier_errors(infos, fraction, "my_env")
        return
    with pytest.raises(VerifierErrorsError) as caught:
        check_verifier_errors(infos, fraction, "my_env")
    assert str(caught.value).startswith(
        f"environment my_env: {errors} of 8 samples could not be scored (verifier errors), more than "
        f"environment.max_error_fraction={fraction}; the first: exception: E{errors - 1}."
    )


def test_epochs_notice():
    assert epochs_notice("sft", 5, 1, 3, 24) == (
        "note: sft.max_steps=5 is more than the 3 steps of sft.num_epochs=1 (an epoch: 24 examples, "
        "3 steps); training 3 steps. Raise sft.num_epochs to train longer"
    )
    assert epochs_notice("dpo", 6, 2, 3, 12) is None  # 6 steps fit in 2 epochs of 3
    assert epochs_notice("sft", None, 1, 3, 24) is None


def test_first_signal_asks_to_stop_the_second_interrupts(capfd):
    stop = GracefulStop()
    assert not stop.requested
    stop.raise_if_requested()  # nothing asked yet
    stop.handle(signal.SIGTERM, None)
    assert stop.requested and stop.signal_name == "SIGTERM"
    said = capfd.readouterr().err.strip()
    page = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text()
    assert f"```text\n{said}\n```" in page  # the troubleshooting page quotes it word for word
    with pytest.raises(KeyboardInterrupt):
        stop.handle(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):
        stop.raise_if_requested()


def test_environment_kwargs_must_fit_the_constructor():
    import posttrain.environments  # noqa: F401  (registers the built-in environments)

    with pytest.raises(EnvironmentSpecError, match="environment.kwargs do not fit MathEnvironment: .*'nope'"):
        check_environment("math", {"nope": 1})
    with pytest.raises(ConfigError, match="environment.kwargs do not fit RewardFunctionEnvironment: missing"):
        load_config(GRPOConfig, None, ["environment.name=reward_fn"])
    cfg = load_config(
        GRPOConfig, None, ["environment.name=reward_fn", "environment.kwargs.reward_fn=math:sqrt"]
    )
    assert cfg.environment.kwargs == {"reward_fn": "math:sqrt"}  # the config keeps the string
    with pytest.raises(ConfigError, match=r"reward_fn='math:pi' is a float, not a function"):
        load_config(GRPOConfig, None, ["environment.name=reward_fn", "environment.kwargs.reward_fn=math:pi"])


def test_reward_function_environment_resolves_a_string(tmp_path, monkeypatch):
    (tmp_path / "run_safety_rewards.py").write_text(
        "def exact(completion, metadata):\n    return float(completion == metadata['answer'])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "run_safety_rewards", raising=False)  # dropped again after the test
    from posttrain.environments import RewardFunctionEnvironment

    env = RewardFunctionEnvironment("run_safety_rewards:exact")
    logs = [[{"role": "user", "content": "q"}, {"role": "assistant", "content": c}] for c in ("42", "41")]
    result = env.step(logs, [{"answer": "42"}, {"answer": "42"}])
    assert result.rewards == [1.0, 0.0] and [i["verifier_error"] for i in result.info] == [None, None]
    with pytest.raises(EnvironmentSpecError, match="module 'run_safety_rewards' has no attribute 'nope'"):
        RewardFunctionEnvironment("run_safety_rewards:nope")


def test_required_field_names_the_answer_column(tmp_path):
    data = tmp_path / "tasks.jsonl"
    data.write_text(
        json.dumps({"prompt": "1 + 1", "solution": "2"}) + "\n" + json.dumps({"prompt": "2 + 2"}) + "\n"
    )
    cfg = DatasetConfig(path=str(data), answer_key="solution")
    with pytest.raises(DataError) as caught:
        build_tasks(cfg, required=("math", ("answer",)))
    assert str(caught.value) == (
        f"{data} row 2: missing field 'solution', which the math environment needs as 'answer' (the row "
        "has keys: prompt); set data.<split>.answer_key to the column that holds it"
    )
    assert len(build_tasks(cfg)) == 2  # no environment fields asked: both rows load


def test_json_error_shows_the_position_and_the_text_around_it():
    line = '{"a": 1 "b": 2}'
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads(line)
    # the parser stops at index 8 (column 9): the quote of "b"
    assert (
        json_error(caught.value)
        == 'invalid JSON (Expecting \',\' delimiter at column 9: {"a": 1 <here>"b": 2})'
    )
