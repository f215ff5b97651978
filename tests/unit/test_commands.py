"""One table of commands (`posttrain.config.commands.COMMANDS`, issue #31): the CLI, the Python API,
`doctor` and the config reference all read it, and nothing adds to it at import time."""

from __future__ import annotations

import argparse
import inspect

import pytest

from posttrain import api
from posttrain.cli import build_parser
from posttrain.config import ALGORITHM_CONFIGS, COMMANDS, Command
from posttrain.doctor import load_doctor_config

NAMES = ["sft", "grpo", "eval", "dpo", "rm", "distill", "ppo"]


def test_the_table_holds_every_command_in_the_cli_help_order():
    assert list(COMMANDS) == NAMES
    assert all(isinstance(c, Command) and c.name == name for name, c in COMMANDS.items())


def test_the_table_and_its_views_are_read_only():
    with pytest.raises(TypeError):
        COMMANDS["new"] = COMMANDS["sft"]  # type: ignore[index]
    with pytest.raises(TypeError):
        ALGORITHM_CONFIGS["sft"] = COMMANDS["grpo"].config  # type: ignore[index]
    assert dict(ALGORITHM_CONFIGS) == {name: c.config for name, c in COMMANDS.items()}


@pytest.mark.parametrize("name", NAMES)
def test_each_entry_point_is_a_function_of_the_config(name):
    command = COMMANDS[name]
    run = command.run_function()
    assert run.__name__ == command.entry_point.rpartition(":")[2]
    parameters = list(inspect.signature(run).parameters.values())
    assert parameters[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(p.default is not inspect.Parameter.empty for p in parameters[1:])


def test_the_cli_builds_one_subcommand_per_row_with_its_help():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    assert {name: helps[name] for name in NAMES} == {name: c.help for name, c in COMMANDS.items()}


@pytest.mark.parametrize("name", NAMES)
def test_the_api_and_doctor_build_the_row_s_config(name):
    assert type(api.make_config(name)) is COMMANDS[name].config
    found, config = load_doctor_config(None, name, [])
    assert found == name and type(config) is COMMANDS[name].config
