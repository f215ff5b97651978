"""Tool machinery: schemas from typed functions, the registry (argument checks, errors as results),
Hermes/Qwen tool-call parsing, tools in the system prompt for templates without tool support (the
real SmolLM2 tokenizer), and the ToolEnvironment turn logic."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from posttrain.environments.interface import EnvStepResult, observation_messages
from posttrain.environments.tools import (
    ToolCall,
    ToolEnvironment,
    ToolRegistry,
    parse_tool_calls,
    template_supports_tools,
    tool_schema,
    tools_system_prompt,
    with_tools_in_system_prompt,
)

SMOLLM2 = Path("/root/.cache/posttrain/models/smollm2-135m-instruct")


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def divide(x: float, y: float) -> float:
    """Divide x by y.

    Args:
        x: numerator
        y: denominator
    """
    return x / y


def shout(text: str) -> dict[str, str]:
    """Upper-case a text.

    Args:
        text: what to shout
    """
    return {"shouted": text.upper()}


def assistant(content: str, **fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **fields}


def call_text(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# --- schemas and the registry ---------------------------------------------------------------------


def test_tool_schema_from_a_typed_function() -> None:
    assert tool_schema(add) == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "the first integer"},
                    "b": {"type": "integer", "description": "the second integer"},
                },
                "required": ["a"],
            },
            "return": {"type": "integer"},
        },
    }


def test_registry_runs_calls_and_checks_arguments() -> None:
    registry = ToolRegistry([add, divide])
    assert registry.names == ["add", "divide"] and len(registry) == 2 and "add" in registry
    assert [s["function"]["name"] for s in registry.schemas()] == ["add", "divide"]

    def run(name: str | None, **arguments: Any) -> tuple[str, bool]:
        result = registry.call(ToolCall(name, arguments))
        return result.content, result.error

    assert run("add", a=2, b=3) == ("5", False)
    assert run("add", a=2) == ("2", False)  # default argument
    assert run("divide", x=1, y=4) == ("0.25", False)  # an int is a JSON number
    assert run("multiply", a=1) == ("Error: unknown tool 'multiply'; available: add, divide", True)
    assert run("add", b=1) == ("Error: missing argument(s) a", True)
    assert run("add", a=1, c=2) == ("Error: unknown argument(s) c; add takes a, b", True)
    assert run("add", a="2") == ('Error: argument a must be of type integer, got str "2"', True)
    assert run("add", a=True) == ("Error: argument a must be of type integer, got bool true", True)
    assert run("add", a=1.5) == ("Error: argument a must be of type integer, got float 1.5", True)
    assert run("divide", x=1, y=0) == ("Error: ZeroDivisionError: division by zero", True)
    parse_failure = registry.call(ToolCall(None, error="the tool call is not valid JSON (x)"))
    assert (parse_failure.content, parse_failure.error) == (
        "Error: the tool call is not valid JSON (x)",
        True,
    )


def test_registry_results_json_truncation_and_decorator() -> None:
    registry = ToolRegistry(max_result_chars=10)
    assert registry.register(shout) is shout
    assert registry.call(ToolCall("shout", {"text": "hi"})).content == '{"shouted"' + " ...[truncated]"
    assert ToolRegistry().call(ToolCall("shout", {"text": "hi"})).error  # not registered there
    assert ToolRegistry([shout]).call(ToolCall("shout", {"text": "hi"})).content == '{"shouted": "HI"}'
    with pytest.raises(ValueError, match="already registered"):
        registry.register(shout)


def test_tool_message() -> None:
    registry = ToolRegistry([add])
    assert registry.call(ToolCall("add", {"a": 1})).message() == {
        "role": "tool",
        "name": "add",
        "content": "1",
    }
    with_id = registry.call(ToolCall("add", {"a": 1}, id="call_7")).message()
    assert with_id == {"role": "tool", "name": "add", "content": "1", "tool_call_id": "call_7"}
    assert registry.call(ToolCall(None, error="bad")).message()["name"] == "unknown"


# --- parsing ----------------------------------------------------------------------------------------


def test_parse_hermes_tool_calls_from_text() -> None:
    assert parse_tool_calls(assistant("The answer is 4.")) == []
    text = "Let me add.\n" + call_text("add", a=2, b=3) + "\nand " + call_text("divide", x=1, y=2)
    assert parse_tool_calls(assistant(text)) == [
        ToolCall("add", {"a": 2, "b": 3}),
        ToolCall("divide", {"x": 1, "y": 2}),
    ]
    # the closing tag cut off as a stop string
    assert parse_tool_calls(assistant('<tool_call>{"name": "add", "arguments": {"a": 1}}')) == [
        ToolCall("add", {"a": 1})
    ]
    # arguments as a JSON string, "parameters" for "arguments", no arguments
    assert parse_tool_calls(
        assistant('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>')
    ) == [ToolCall("add", {"a": 1})]
    assert parse_tool_calls(assistant('<tool_call>{"name": "add", "parameters": {"a": 1}}</tool_call>')) == [
        ToolCall("add", {"a": 1})
    ]
    assert parse_tool_calls(assistant('<tool_call>{"name": "add"}</tool_call>')) == [ToolCall("add", {})]
    # the JSON value the block begins with is the call; what follows it is ignored
    assert parse_tool_calls(
        assistant('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n}\n}</tool_call>')
    ) == [ToolCall("add", {"a": 1})]


def test_parse_failures_are_calls_with_errors() -> None:
    [bad_json] = parse_tool_calls(assistant("<tool_call>{name: add}</tool_call>"))
    assert bad_json.name is None and bad_json.error.startswith(
        "the tool call is not valid JSON (Expecting property"
    )
    [no_name] = parse_tool_calls(assistant('<tool_call>{"arguments": {}}</tool_call>'))
    assert no_name.error == 'a tool call must be a JSON object with a "name" string'
    [listed] = parse_tool_calls(assistant("<tool_call>[1, 2]</tool_call>"))
    assert listed.error == 'a tool call must be a JSON object with a "name" string'
    [bad_args] = parse_tool_calls(assistant('<tool_call>{"name": "add", "arguments": [1]}</tool_call>'))
    assert bad_args.name == "add" and bad_args.error == '"arguments" must be a JSON object'
    [bad_arg_json] = parse_tool_calls(assistant('<tool_call>{"name": "add", "arguments": "{a"}</tool_call>'))
    assert bad_arg_json.error.startswith("the arguments are not valid JSON")


def test_parse_the_tool_calls_field() -> None:
    message = assistant(
        "",
        tool_calls=[
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
            {"type": "function", "function": {"name": "divide", "arguments": {"x": 1, "y": 2}}},
        ],
    )
    # the field wins over text (there is none here) and keeps the ids
    assert parse_tool_calls(message) == [
        ToolCall("add", {"a": 1, "b": 2}, id="c1"),
        ToolCall("divide", {"x": 1, "y": 2}),
    ]


# --- chat templates ---------------------------------------------------------------------------------

# a minimal template that renders tools= (the shape of Qwen2.5's): tools go into the system turn
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOLLM2)


@pytest.mark.slow
def test_template_supports_tools(tokenizer: Any) -> None:
    assert template_supports_tools(tokenizer) is False  # SmolLM2's template ignores tools=
    edited = copy.deepcopy(tokenizer)
    edited.chat_template = TOOL_TEMPLATE
    assert template_supports_tools(edited) is True
    edited.chat_template = None
    assert template_supports_tools(edited) is False


@pytest.mark.slow
def test_tools_in_the_system_prompt_reach_smollm2(tokenizer: Any) -> None:
    schemas = ToolRegistry([add]).schemas()
    user = [{"role": "user", "content": "What is 2 + 3?"}]
    messages = with_tools_in_system_prompt(user, schemas)
    assert messages == [{"role": "system", "content": tools_system_prompt(schemas)}, *user]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert json.dumps(schemas[0]) in rendered and "<tool_call>" in rendered
    assert "named SmolLM" not in rendered  # our system turn replaces the default one
    assert json.dumps(schemas[0]) not in tokenizer.apply_chat_template(user, tools=schemas, tokenize=False)
    # an existing system message keeps its text first
    kept = with_tools_in_system_prompt([{"role": "system", "content": "Be brief."}, *user], schemas)
    assert kept[0]["content"] == "Be brief.\n\n" + tools_system_prompt(schemas) and kept[1:] == user
    assert user == [{"role": "user", "content": "What is 2 + 3?"}]  # inputs not modified


# --- ToolEnvironment ---------------------------------------------------------------------------------


class SumEnvironment(ToolEnvironment):
    """The model must reply with metadata["target"]; it may call add/divide."""

    def score(self, reply: str, metadata: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        if reply == "crash":
            raise RuntimeError("scorer bug")
        correct = reply.strip() == str(metadata["target"])
        return float(correct), {"correct": correct}


def episode(env: ToolEnvironment, *replies: str) -> tuple[list[dict], dict]:
    start = env.start([{"role": "user", "content": "What is 2 + 3?"}], {"target": 5})
    log = [*start.messages]
    for r in replies:
        log.append(assistant(r))
    return log, start.metadata


def test_start_offers_the_tools() -> None:
    env = SumEnvironment(ToolRegistry([add]))
    start = env.start([{"role": "user", "content": "hi"}], {"target": 5})
    assert start.tools == ToolRegistry([add]).schemas() and start.stop_strings == ("</tool_call>",)
    assert start.metadata == {"target": 5, "tool_calls": 0, "tool_errors": 0}
    in_prompt = SumEnvironment(ToolRegistry([add]), tools_in_system_prompt=True, stop_at_tool_call=False)
    start = in_prompt.start([{"role": "user", "content": "hi"}], {"target": 5})
    assert start.tools is None and start.stop_strings == ()
    assert start.messages[0] == {
        "role": "system",
        "content": tools_system_prompt(ToolRegistry([add]).schemas()),
    }


def test_a_tool_turn_then_a_final_reply() -> None:
    env = SumEnvironment(ToolRegistry([add, divide]))
    log, meta = episode(env, call_text("add", a=2, b=3))
    first = env.step([log], [meta])
    assert first.done == [False] and first.rewards == [0.0]
    assert first.observations == [{"role": "tool", "name": "add", "content": "5"}]
    assert first.metadata[0] == {"target": 5, "tool_calls": 1, "tool_errors": 0}
    assert first.info == [{"tool_calls": 1, "tool_errors": 0, "called_tool": True}]
    assert first.stop_strings == [("</tool_call>",)]
    log += [first.observations[0], assistant("5")]
    final = env.step([log], first.metadata)
    assert final.done == [True] and final.rewards == [1.0] and final.observations == [None]
    assert final.info[0] == {
        "tool_calls": 0,
        "tool_errors": 0,
        "called_tool": True,
        "tool_budget_exhausted": False,
        "correct": True,
    }


def test_errors_are_observations_and_several_calls_a_list() -> None:
    env = SumEnvironment(ToolRegistry([add, divide]), max_tool_calls=10)
    replies = [
        "<tool_call>{add 2 3}</tool_call>",  # not JSON
        call_text("divide", x=1, y=0),  # the tool raises
        call_text("add", a=1) + call_text("multiply", a=1),  # two calls, one unknown
    ]
    logs_meta = [episode(env, r) for r in replies]
    result = env.step([lm[0] for lm in logs_meta], [lm[1] for lm in logs_meta])
    assert result.done == [False] * 3 and result.rewards == [0.0] * 3
    bad_json, raised, several = result.observations
    assert bad_json["role"] == "tool" and bad_json["content"].startswith(
        "Error: the tool call is not valid JSON"
    )
    assert raised == {
        "role": "tool",
        "name": "divide",
        "content": "Error: ZeroDivisionError: division by zero",
    }
    assert several == [
        {"role": "tool", "name": "add", "content": "1"},
        {
            "role": "tool",
            "name": "multiply",
            "content": "Error: unknown tool 'multiply'; available: add, divide",
        },
    ]
    assert observation_messages(several) == several and observation_messages(raised) == [raised]
    assert observation_messages(None) == []
    assert [m["tool_calls"] for m in result.metadata] == [1, 1, 2]
    assert [m["tool_errors"] for m in result.metadata] == [1, 1, 1]
    assert env.batch_metrics(result) == {"env/tool_errors": 3.0}  # no episode ended


def test_tool_budget_scorer_failure_and_metrics() -> None:
    env = SumEnvironment(ToolRegistry([add]), max_tool_calls=1)
    over = {"target": 5, "tool_calls": 1, "tool_errors": 0}
    logs = [
        [assistant(call_text("add", a=2, b=3))],  # a second call: over the budget of 1
        [assistant("5")],  # right without a tool
        [assistant("crash")],  # the scorer raises
        [assistant(call_text("add", a=2, b=3))],  # a first call: runs
    ]
    fresh = {"target": 5, "tool_calls": 0, "tool_errors": 0}
    result = env.step(logs, [over, fresh, fresh, fresh])
    assert result.done == [True, True, True, False]
    assert result.rewards == [0.0, 1.0, 0.0, 0.0]
    assert result.info[0]["tool_budget_exhausted"] is True and result.info[0]["called_tool"] is True
    assert result.info[1]["called_tool"] is False and result.info[1]["correct"] is True
    assert result.info[2]["verifier_error"] == "exception: RuntimeError: scorer bug"
    assert result.stop_strings == [None, None, None, ("</tool_call>",)]
    assert env.batch_metrics(result) == {
        "env/tool_errors": 0.0,
        "env/tool_call_rate": 1 / 3,
        "env/reward_mean": 1 / 3,
        "env/tool_budget_exhausted_rate": 1 / 3,
        "env/accuracy": 1 / 3,
    }


def test_step_results_are_valid_for_a_batch() -> None:
    env = SumEnvironment(ToolRegistry([add]))
    result = env.step([], [])
    assert isinstance(result, EnvStepResult) and len(result) == 0
    assert env.batch_metrics(result) == {"env/tool_errors": 0.0}


def test_examples_come_before_the_task_and_describe_tools_false_offers_no_schemas() -> None:
    """`examples` (worked chat turns) follow the system prompt and precede the task's messages;
    `describe_tools=False` offers no schemas, so nothing is added to the system prompt either."""
    from posttrain.environments.calculator import CalculatorEnvironment, product_prompt

    shot = [
        {"role": "user", "content": product_prompt(12, 34)},
        {"role": "assistant", "content": call_text("calculator", expression="12 * 34")},
        {"role": "tool", "name": "calculator", "content": "408"},
        {"role": "assistant", "content": "The answer is \\boxed{408}."},
    ]
    env = CalculatorEnvironment(examples=shot, describe_tools=False, system_prompt="Be brief.")
    [start] = env.reset([{"a": 223, "b": 49}], [0])
    assert start.messages == [
        {"role": "system", "content": "Be brief."},
        *shot,
        {"role": "user", "content": product_prompt(223, 49)},
    ]
    assert start.tools is None
    shot[0]["content"] = "changed"  # the environment keeps its own copy
    assert env.reset([{"a": 1, "b": 2}], [0])[0].messages[1]["content"] == product_prompt(12, 34)
    [described] = CalculatorEnvironment(examples=shot).reset([{"a": 1, "b": 2}], [0])
    assert described.tools is not None and described.tools[0]["function"]["name"] == "calculator"
