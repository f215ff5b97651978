"""Calculator tool environment: the safe evaluator and its limits, answer extraction, tasks from a
seed, and whole episodes through reset/step (with and without the tool)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from posttrain.environments import ENVIRONMENTS, make_environment
from posttrain.environments.calculator import (
    CalculatorEnvironment,
    calculator,
    extract_answer,
    format_number,
)
from posttrain.environments.tools import tools_system_prompt

SMOLLM2 = Path("/root/.cache/posttrain/models/smollm2-135m-instruct")


def tool_call(expression: str) -> str:
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": {json.dumps(expression)}}}}}\n</tool_call>'


# --- the evaluator -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("347 * 58", "20126"),
        ("347×58", "20126"),
        ("(300 + 47) * (60 - 2)", "20126"),
        ("2^10", "1024"),
        ("2 ** -1", "0.5"),
        ("10 / 4", "2.5"),
        ("20 / 4", "5"),
        ("0.1 + 0.2", "0.3"),
        ("7 // 2 % 3", "0"),
        ("-(3)", "-3"),
        ("1e3 + 1", "1001"),
        ("10**100 * 10**100", "1" + "0" * 200),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, value: str) -> None:
    assert calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("2 ** 1000", "exponents are limited to 100"),
        ("9 ** 9 ** 9", "exponents are limited to 100"),
        ("9999 ** 99", "more than 300 digits"),
        ("10**100 * 10**100 * 10**100 * 10**100", "more than 300 digits"),
        ("1e308 * 10", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1 < 2", "only + - * / // % ** and parentheses"),
        ("1 << 3", "only + - * / // % ** and parentheses"),
        ("x + 1", "'x' is not defined"),
        ("abs(-3)", "Function 'abs' not defined"),
        ("__import__('os').system('true')", "not defined"),
        ("().__class__", "not available"),
        ("3 +", "cannot read '3 +' as an arithmetic expression"),
        ("1" * 201, "longer than 200 characters"),
    ],
)
def test_calculator_refuses_what_is_not_small_arithmetic(expression: str, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        calculator(expression)


def test_format_number() -> None:
    assert format_number(20126) == "20126"
    assert format_number(5.0) == "5"
    assert format_number(2.5) == "2.5"
    assert format_number(1e20) == "1e+20"


def test_extract_answer() -> None:
    assert extract_answer("so \\boxed{20126}.") == "20126"
    assert extract_answer("\\boxed{20,126} then \\boxed{ 20,126 }") == "20,126"  # one answer twice
    assert extract_answer("\\boxed{1} then \\boxed{20,126}") is None  # different answers: a hedge
    assert extract_answer("347 * 58 = 20,126.") == "20,126"
    assert extract_answer("347 * 58 = 20126", "boxed") is None
    assert extract_answer("I don't know", "boxed_or_last_number") is None
    assert extract_answer("\\boxed{x} and 5") == "x"  # a box wins over numbers


# --- tasks and episodes ------------------------------------------------------------------------------


def test_generate_tasks_and_reset() -> None:
    env = CalculatorEnvironment()
    tasks = env.generate_tasks(500, seed=3)
    assert tasks == env.generate_tasks(500, seed=3) and tasks != env.generate_tasks(500, seed=4)
    assert all(100 <= t["a"] <= 999 and 10 <= t["b"] <= 99 and set(t) == {"a", "b"} for t in tasks)
    [start] = env.reset([{"a": 347, "b": 58}], [0])
    assert start.messages == [
        {
            "role": "user",
            "content": "What is 347 * 58?\nYou can use the calculator tool. Give your final answer as a number in \\boxed{}.",
        }
    ]
    assert start.metadata == {"a": 347, "b": 58, "answer": 20126, "tool_calls": 0, "tool_errors": 0}
    assert [s["function"]["name"] for s in start.tools] == ["calculator"]
    assert start.tools[0]["function"]["parameters"]["required"] == ["expression"]
    assert start.stop_strings == ("</tool_call>",)
    [with_system] = CalculatorEnvironment(system_prompt="Be exact.").reset([{"a": 347, "b": 58}], [0])
    assert with_system.messages[0] == {"role": "system", "content": "Be exact."}


def play(env: CalculatorEnvironment, task: dict, *replies: str) -> tuple[list, list]:
    """Play `replies` as the assistant's turns; return every step result and the final log."""
    [start] = env.reset([task], [0])
    log, meta, results = list(start.messages), start.metadata, []
    for reply in replies:
        log.append({"role": "assistant", "content": reply})
        result = env.step([log], [meta])
        results.append(result)
        meta = result.metadata[0]
        if result.done[0]:
            break
        log.append(result.observations[0])
    return results, log


def test_an_episode_with_the_tool() -> None:
    env = make_environment("tool_calculator")
    results, log = play(env, {"a": 347, "b": 58}, tool_call("347 * 58"), "347 * 58 = \\boxed{20126}")
    assert log[-2] == {"role": "tool", "name": "calculator", "content": "20126"}
    assert [r.rewards[0] for r in results] == [0.0, 1.0]
    assert results[-1].done == [True]
    assert results[-1].info[0]["called_tool"] is True and results[-1].info[0]["correct"] is True
    assert env.batch_metrics(results[-1])["env/tool_call_rate"] == 1.0


def test_a_bad_expression_then_a_retry() -> None:
    env = CalculatorEnvironment()
    results, log = play(env, {"a": 347, "b": 58}, tool_call("347 x 58"), tool_call("347*58"), "It is 20,126.")
    assert log[2]["content"].startswith("Error: ValueError: cannot read") and log[4]["content"] == "20126"
    assert [r.rewards[0] for r in results] == [0.0, 0.0, 1.0]
    assert results[-1].metadata[0]["tool_calls"] == 2 and results[-1].metadata[0]["tool_errors"] == 1
    assert env.batch_metrics(results[0])["env/tool_errors"] == 1.0


def test_answers_without_the_tool_and_formats() -> None:
    env, strict = CalculatorEnvironment(), CalculatorEnvironment(answer_format="boxed")
    task = {"a": 347, "b": 58}
    cases = {
        "\\boxed{20126}": 1.0,
        "\\boxed{20,126}": 1.0,
        "20126": 1.0,
        "\\boxed{20000}": 0.0,
        "about 20000": 0.0,
    }
    for reply, reward in cases.items():
        [result] = play(env, task, reply)[0]
        assert result.rewards == [reward], reply
        assert result.info[0]["called_tool"] is False
    assert play(strict, task, "20126")[0][0].rewards == [0.0]
    assert play(strict, task, "\\boxed{20126}")[0][0].rewards == [1.0]


def test_metrics_over_ended_episodes() -> None:
    env = CalculatorEnvironment()
    starts = env.reset([{"a": 100, "b": 10}] * 3, [0, 1, 2])
    metas = [s.metadata for s in starts]
    metas[0] = {**metas[0], "tool_calls": 1}  # this one used the tool on an earlier turn
    logs = [
        [*s.messages, {"role": "assistant", "content": c}]
        for s, c in zip(starts, ["1000", "999", tool_call("1/0")], strict=True)
    ]
    result = env.step(logs, metas)
    assert result.done == [True, True, False]
    assert env.batch_metrics(result) == {
        "env/tool_errors": 1.0,
        "env/tool_call_rate": 0.5,
        "env/reward_mean": 0.5,
        "env/tool_budget_exhausted_rate": 0.0,
        "env/accuracy": 0.5,
    }


def test_tools_in_system_prompt_for_smollm2() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    [start] = CalculatorEnvironment(tools_in_system_prompt=True).reset([{"a": 347, "b": 58}], [0])
    assert start.tools is None
    assert start.messages[0] == {
        "role": "system",
        "content": tools_system_prompt([CalculatorEnvironment().tools.schemas()[0]]),
    }
    rendered = tokenizer.apply_chat_template(start.messages, tokenize=False, add_generation_prompt=True)
    assert '"name": "calculator"' in rendered and "What is 347 * 58?" in rendered


def test_registered_and_validated() -> None:
    assert ENVIRONMENTS["tool_calculator"] is CalculatorEnvironment
    with pytest.raises(ValueError, match="answer_format"):
        CalculatorEnvironment(answer_format="last")
