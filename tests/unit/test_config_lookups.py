"""Config validation looks environment names, their turn limits and tool-call parsers up through
`posttrain.config.rollout.Lookups`, which the package root installs (issue #31: no import from config up to
environments or the endpoint); the errors are the ones the environments and parsers give."""

from __future__ import annotations

import subprocess
import sys

import pytest

from posttrain.config.rollout import (
    AgentConfig,
    EnvironmentConfig,
    Lookups,
    install_lookups,
    installed_lookups,
)


def test_the_package_root_installs_the_lookups():
    lookups = installed_lookups()
    assert lookups is not None
    assert {"hermes", "qwen", "llama3_json"} <= set(lookups.tool_parsers())
    assert lookups.turn_limit("sliding_puzzle", {"max_moves": 7}) == ("max_moves", 7)
    assert lookups.turn_limit("math", {}) is None and lookups.turn_limit("no_such_env", {}) is None
    with pytest.raises(ValueError, match="unknown environment 'no_such_env'; registered:"):
        lookups.check_environment("no_such_env", {})


def test_an_unknown_tool_parser_is_a_config_error_and_a_registered_one_is_not():
    with pytest.raises(
        ValueError, match=r"tool_parser 'nope' is not one of \['hermes', 'llama3_json', 'qwen'"
    ):
        AgentConfig(function="agents:run", tool_parser="nope")
    from posttrain.endpoint.parsers import TOOL_CALL_PARSERS, register_tool_call_parser

    register_tool_call_parser("test_lookups_parser", TOOL_CALL_PARSERS["hermes"])
    try:
        assert AgentConfig(function="agents:run", tool_parser="test_lookups_parser").tool_parser
    finally:
        del TOOL_CALL_PARSERS["test_lookups_parser"]


def test_validation_calls_the_installed_lookups():
    calls = []
    fake = Lookups(
        check_environment=lambda name, kwargs: calls.append((name, kwargs)),
        turn_limit=lambda name, kwargs: ("rounds", 3),
        tool_parsers=lambda: ["only"],
    )
    real = installed_lookups()
    assert real is not None
    install_lookups(fake)
    try:
        assert EnvironmentConfig(name="anything", kwargs={"a": 1}, max_turns=3).name == "anything"
        assert calls == [("anything", {"a": 1})]
        with pytest.raises(ValueError, match="environment.kwargs.rounds=3 is above environment.max_turns=2"):
            EnvironmentConfig(name="anything", max_turns=2)
        with pytest.raises(ValueError, match=r"is not one of \['only'\]"):
            AgentConfig(function="agents:run")
    finally:
        install_lookups(real)


def test_importing_config_loads_neither_environments_nor_the_endpoint():
    code = (
        "import sys\n"
        "import posttrain.config, posttrain.config.commands\n"
        "from posttrain.config.rollout import EnvironmentConfig\n"
        "EnvironmentConfig()\n"
        "assert not [m for m in sys.modules if m.startswith(('posttrain.environments', 'posttrain.endpoint'))]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
