"""Each trainer's --help lists its main keys with their defaults, taken from the config models, and
points at the configuration reference (issue #30, console)."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.cli import REFERENCE, _shown, build_parser, key_default
from posttrain.config.commands import ALGORITHM_CONFIGS, COMMANDS
from posttrain.config.loader import load_config
from posttrain.trainers.common import flat_items

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["sft", "grpo", "dpo", "rm", "ppo", "distill", "eval"]


def help_text(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_every_trainer_command_lists_main_keys():
    assert sorted(COMMANDS) == sorted(NAMES) == sorted(ALGORITHM_CONFIGS)
    assert all(
        8 <= len(c.main_keys) <= 16 and len(set(c.main_keys)) == len(c.main_keys) for c in COMMANDS.values()
    )


@pytest.mark.parametrize("command", NAMES)
def test_help_lists_each_key_with_the_default_a_run_gets(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    text = help_text(command, capsys)
    # the defaults of a run with no --config and no overrides, read independently of the help code
    defaults = flat_items(load_config(ALGORITHM_CONFIGS[command], None, []).model_dump(mode="json"))
    for key in COMMANDS[command].main_keys:
        assert key in defaults, f"{command}: {key} is not a key of the config (renamed?)"
        assert f"  {key}={_shown(defaults[key])}" in text, key
    assert f"every key, its type, default and description: {REFERENCE}" in text
    assert (ROOT / REFERENCE).is_file()


def test_a_renamed_key_fails_loudly():
    config = ALGORITHM_CONFIGS["grpo"]
    assert key_default(config, "grpo.generations_per_prompt") == (4, "G, the group size")
    with pytest.raises(KeyError, match="grpo.generation_per_prompt"):
        key_default(config, "grpo.generation_per_prompt")
    with pytest.raises(KeyError, match="policy.model_name.x"):
        key_default(config, "policy.model_name.x")  # below a leaf


def test_key_lines_fit_a_narrow_terminal(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    lines = help_text("grpo", capsys).splitlines()
    start = lines.index("main settings (key=default; set any on the command line as key=value):")
    rows = lines[start + 1 : start + 1 + len(COMMANDS["grpo"].main_keys)]
    assert all(row.startswith("  ") and len(row) <= 60 for row in rows)
    assert rows[0].startswith("  policy.model_name=smollm2-135m-instruct")
