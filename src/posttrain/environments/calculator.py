"""Calculator tool use: 3-digit × 2-digit products, with a `calculator(expression)` tool.

The task is one product, e.g. "What is 347 * 58?", too hard for a 135M model to do in its head.
The model may call the calculator (`<tool_call>{"name": "calculator", "arguments": {"expression":
"347 * 58"}}</tool_call>`), reads the result in a `tool` message and then gives its final reply.

The calculator evaluates arithmetic with `simpleeval` (an AST-walking evaluator; never Python's
`eval`): numbers, `+ - * / // % **`, unary minus and parentheses; `×`, `÷` and `^` are read as
`*`, `/` and `**`. No names, functions, strings or comparisons. Limits keep every call cheap: at
most `MAX_EXPRESSION_CHARS` characters, exponents up to `MAX_EXPONENT`, and no intermediate
number beyond `MAX_DIGITS` digits. A bad expression is an error text for the model.

The final reply is correct when its answer equals the product: its boxed answer when the reply
has a box, otherwise (with `answer_format="boxed_or_last_number"`, the default) the last number in
the reply; commas between digits are ignored ("20,126"). With `answer_format="boxed"` a reply
without a box is wrong. The reply is read outside its `<think>` blocks, and boxes with different
answers answer nothing (`posttrain.environments.math.final_boxed_answer`).
"""

from __future__ import annotations

import ast
import math
import operator
import random
import re
from collections.abc import Callable
from typing import Any, Literal

from posttrain.data.boxed import boxed_contents
from posttrain.environments.interface import EpisodeStart, register_environment
from posttrain.environments.math import final_boxed_answer, strip_think
from posttrain.environments.tools import ToolEnvironment, ToolRegistry

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100
MAX_DIGITS = 300

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def _check_number(value: Any) -> float | int:
    """`value` if it is a number within `MAX_DIGITS` digits; raises ValueError otherwise."""
    if isinstance(value, complex):
        raise ValueError("the result is not a real number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("only numbers can be used")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is too large")
    if isinstance(value, int) and value.bit_length() > MAX_DIGITS * math.log2(10):
        raise ValueError(f"a number has more than {MAX_DIGITS} digits")
    return value


def _checked(op: Callable[..., Any]) -> Callable[..., Any]:
    """An operator that takes and returns numbers only, within the size limit."""

    def apply(*args: Any) -> Any:
        return _check_number(op(*(_check_number(a) for a in args)))

    return apply


def _power(base: Any, exponent: Any) -> Any:
    """`base ** exponent` with |exponent| <= MAX_EXPONENT and a result within MAX_DIGITS digits."""
    base, exponent = _check_number(base), _check_number(exponent)
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponents are limited to {MAX_EXPONENT}")
    if base != 0 and exponent > 0 and exponent * math.log10(abs(base)) > MAX_DIGITS:
        raise ValueError(f"the result would have more than {MAX_DIGITS} digits")
    return _check_number(base**exponent)


_OPERATORS = {
    ast.Add: _checked(operator.add),
    ast.Sub: _checked(operator.sub),
    ast.Mult: _checked(operator.mul),
    ast.Div: _checked(operator.truediv),
    ast.FloorDiv: _checked(operator.floordiv),
    ast.Mod: _checked(operator.mod),
    ast.Pow: _power,
    ast.USub: _checked(operator.neg),
    ast.UAdd: _checked(operator.pos),
}


def format_number(value: int | float) -> str:
    """An int as is; a float with up to 15 significant digits ("5.0" -> "5", 0.1 + 0.2 -> "0.3")."""
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return format(value, ".15g")
    return str(value)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: An arithmetic expression with numbers, + - * / // % ** and parentheses, e.g. "347 * 58".
    """
    from simpleeval import InvalidExpression, OperatorNotDefined, SimpleEval

    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.replace("×", "*").replace("÷", "/").replace("^", "**")
    evaluator = SimpleEval(operators=_OPERATORS, functions={}, names={})
    try:
        value = evaluator.eval(text)
    except (OperatorNotDefined, KeyError):  # simpleeval raises KeyError for comparisons
        raise ValueError("only + - * / // % ** and parentheses are supported") from None
    except SyntaxError:
        raise ValueError(f"cannot read {expression!r} as an arithmetic expression") from None
    except InvalidExpression as e:
        raise ValueError(str(e)) from None
    return format_number(_check_number(value))


def _as_number(text: str) -> float | None:
    """A number written in `text` (commas between digit groups allowed, `$`/spaces ignored), or None."""
    cleaned = re.sub(r"[\s$]", "", text).rstrip(".")
    if not _NUMBER.fullmatch(cleaned):
        return None
    return float(cleaned.replace(",", ""))


def extract_answer(reply: str, answer_format: str = "boxed_or_last_number") -> str | None:
    """The answer of a final reply, read outside its `<think>` blocks: its boxed answer
    (`final_boxed_answer`: None for boxes with different answers), else, when it has no box and
    the format is "boxed_or_last_number", its last number."""
    reply = strip_think(reply)
    if boxed_contents(reply) or answer_format == "boxed":
        return final_boxed_answer(reply)
    numbers = _NUMBER.findall(reply)
    return numbers[-1] if numbers else None


ANSWER_FORMATS = ("boxed", "boxed_or_last_number")


def check_answer_format(answer_format: str) -> str:
    """`answer_format` if it is one of ANSWER_FORMATS; raises ValueError otherwise."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be 'boxed' or 'boxed_or_last_number', got {answer_format!r}")
    return answer_format


def score_number_answer(reply: str, answer: Any, answer_format: str) -> tuple[float, dict[str, Any]]:
    """1.0 when the reply's answer (`extract_answer`) equals the number `answer`, else 0.0; info
    "extracted_answer" and "correct"."""
    extracted = extract_answer(reply, answer_format)
    value = _as_number(extracted) if extracted is not None else None
    correct = value is not None and value == float(answer)
    return float(correct), {"extracted_answer": extracted, "correct": correct}


def product_prompt(a: int, b: int) -> str:
    """The user turn of a task."""
    return (
        f"What is {a} * {b}?\n"
        "You can use the calculator tool. Give your final answer as a number in \\boxed{}."
    )


@register_environment("tool_calculator")
class CalculatorEnvironment(ToolEnvironment):
    """3-digit × 2-digit products with a calculator tool; reward 1 for the right product, else 0.

    Tasks are `{"a": int, "b": int}` (from `generate_tasks(count, seed)`); the product is
    the answer. Info of the final turn: "extracted_answer", "correct", "called_tool".
    Metrics (see `ToolEnvironment.batch_metrics`): `env/accuracy`, `env/tool_call_rate`,
    `env/tool_errors`, `env/reward_mean`, `env/tool_budget_exhausted_rate`.

    Args:
        max_tool_calls: calculator calls allowed per episode.
        answer_format: "boxed_or_last_number" (the last `\\boxed{}`, else the last number) or
            "boxed" (a reply without a box is wrong).
        system_prompt: a system message to begin each episode with (None: the template's default).
        stop_at_tool_call, tools_in_system_prompt, tool_choice, examples,
            describe_tools: see `ToolEnvironment`.
    """

    required_fields = ("a", "b")
    """Task fields every dataset row must give (`reset` builds the product a × b from them)."""

    def __init__(
        self,
        max_tool_calls: int = 3,
        answer_format: Literal["boxed", "boxed_or_last_number"] = "boxed_or_last_number",
        system_prompt: str | None = None,
        stop_at_tool_call: bool = True,
        tools_in_system_prompt: bool = False,
        tool_choice: str = "auto",
        examples: list[dict[str, Any]] | None = None,
        describe_tools: bool = True,
    ) -> None:
        self.answer_format = check_answer_format(answer_format)
        super().__init__(
            ToolRegistry([calculator]),
            max_tool_calls=max_tool_calls,
            stop_at_tool_call=stop_at_tool_call,
            tools_in_system_prompt=tools_in_system_prompt,
            system_prompt=system_prompt,
            tool_choice=tool_choice,
            examples=examples,
            describe_tools=describe_tools,
        )

    def generate_tasks(self, count: int, seed: int) -> list[dict[str, Any]]:
        """`count` products: a in 100..999, b in 10..99, drawn from `seed`."""
        rng = random.Random(seed)
        return [{"a": rng.randint(100, 999), "b": rng.randint(10, 99)} for _ in range(count)]

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """One episode per task; the seeds are not needed (a task is one product)."""
        starts = []
        for task in tasks:
            a, b = int(task["a"]), int(task["b"])
            messages = [{"role": "user", "content": product_prompt(a, b)}]
            starts.append(self.start(messages, {**task, "answer": a * b}))
        return starts

    def score(self, reply: str, metadata: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """1.0 when the reply's answer equals metadata["answer"], else 0.0."""
        return score_number_answer(reply, metadata["answer"], self.answer_format)
