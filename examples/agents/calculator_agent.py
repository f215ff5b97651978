"""A calculator agent written with the `openai` client only (no posttrain imports).

It answers "What is a * b?" with a `calculator` tool: it asks the model, runs every tool call the
model makes, sends the results back, and stops at the first reply without a tool call (the final
answer, which the run's environment scores). posttrain trains the model it talks to:

    posttrain grpo --config examples/configs/grpo_calculator.yaml \
        environment.agent.function=examples/agents/calculator_agent.py:run_episode

or, as a program (one process per episode; OPENAI_BASE_URL is set for it):

    environment.agent.command='[python, examples/agents/calculator_agent.py]'

Run it by hand against any OpenAI-compatible server:

    python examples/agents/calculator_agent.py --base-url http://127.0.0.1:8000/v1 --task '{"a": 347, "b": 58}'
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
from typing import Any

from openai import BadRequestError, OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression and return its value.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": 'e.g. "347 * 58"'}},
                "required": ["expression"],
            },
        },
    }
]

# one worked example: a small model copies a demonstrated call far more often than it follows a description
EXAMPLE = [
    {"role": "user", "content": "What is 12 * 34?\nUse the calculator. Give your final answer in \\boxed{}."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_example",
                "type": "function",
                "function": {"name": "calculator", "arguments": json.dumps({"expression": "12 * 34"})},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_example", "content": "408"},
    {"role": "assistant", "content": "The answer is \\boxed{408}."},
]

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def calculate(expression: str) -> str:
    """The value of + - * / over numbers and parentheses, or an error text for the model."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers, + - * / and parentheses")

    try:
        result = value(ast.parse(expression[:200], mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as e:
        return f"Error: {e}"
    return str(int(result)) if float(result).is_integer() else str(result)


def tool_result(call: Any) -> str:
    """Run one tool call of the model's reply."""
    if call.function.name != "calculator":
        return f"Error: unknown tool {call.function.name!r}"
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as e:
        return f"Error: the arguments are not valid JSON ({e})"
    if not isinstance(arguments, dict) or not isinstance(arguments.get("expression"), str):
        return 'Error: calculator takes {"expression": "<arithmetic>"}'
    return calculate(arguments["expression"])


def run_episode(base_url: str, session_id: str, task: dict[str, Any], max_turns: int = 3) -> None:
    """Play one episode: the question, then tool calls and their results until a final reply."""
    client = OpenAI(base_url=base_url, api_key="none", max_retries=0)
    question = (
        f"What is {task['a']} * {task['b']}?\nUse the calculator. Give your final answer in \\boxed{{}}."
    )
    messages: list[dict[str, Any]] = [*EXAMPLE, {"role": "user", "content": question}]
    for _ in range(max_turns):
        try:
            reply = client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS, max_tokens=64
            )
        except BadRequestError:  # the episode is over (its turn or token budget): the run has what it needs
            return
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_result(call)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--session-id", default="")
    parser.add_argument("--task", required=True, help='JSON, e.g. {"a": 347, "b": 58}')
    args = parser.parse_args()
    run_episode(args.base_url, args.session_id, json.loads(args.task))


if __name__ == "__main__":
    main()
