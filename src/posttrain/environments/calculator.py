"""Calculator tool use: products (3-digit × 2-digit by default) or sums, with a `calculator(expression)` tool.

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
import json
import math
import operator
import random
import re
import zlib
from collections.abc import Callable
from typing import Any, Literal

from posttrain.data.boxed import boxed_contents
from posttrain.environments.interface import EpisodeStart, Message, register_environment
from posttrain.environments.math import final_boxed_answer, strip_think
from posttrain.environments.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolEnvironment, ToolRegistry

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


def parse_number(text: str) -> float | None:
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
    value = parse_number(extracted) if extracted is not None else None
    correct = value is not None and value == float(answer)
    return float(correct), {"extracted_answer": extracted, "correct": correct}


OPERATIONS: dict[str, Callable[[int, int], int]] = {"*": operator.mul, "+": operator.add}
"""A task's operation (its "op" field; "*" when absent)."""

PHRASINGS: dict[str, dict[str, str]] = {
    "*": {
        "what_is": "What is {a} * {b}?",
        "times": "Compute {a} times {b}.",
        "product": "What is the product of {a} and {b}?",
        "multiply": "Multiply {a} by {b}.",
        "rows": "A hall has {a} rows of {b} seats. How many seats are there in all?",
        "area": "What is the area of a rectangle with sides {a} and {b}?",
        "find_area": "Find the area of a rectangle with sides {a} and {b}.",
    },
    "+": {
        "what_is": "What is {a} + {b}?",
        "plus": "Compute {a} plus {b}.",
        "sum": "What is the sum of {a} and {b}?",
        "add": "Add {a} and {b}.",
        "total": "What is the total of {a} and {b}?",
        "more": "Sam has {a} marbles and finds {b} more. How many marbles does Sam have now?",
        "find_total": "Find the total of {a} and {b}.",
    },
}
"""The question of a task per operation and phrasing (its "phrasing" field; "what_is" when absent):
held-out families ask the same thing in words training never used. The recipes train on "what_is",
"rows", "area", "find_area", "total", "more" and "find_total" (`TRAINING_PHRASINGS`) and hold out the
other six, whose words ("times", "product", "multiply", "plus", "sum", "add") no training question
uses. Every sentence shape training uses is asked of both operations, so no shape alone decides the
operation: "area" gives the products the sums' "What is the X of ... a and b?" ("What is the product
of a and b?" was once answered a + b without it), and "find_area"/"find_total" give both an
imperative ("Add a and b." was once answered a * b when no training question was imperative)."""

TRAINING_PHRASINGS: dict[str, list[str]] = {
    "*": ["what_is", "rows", "area", "find_area"],
    "+": ["what_is", "total", "more", "find_total"],
}
"""The phrasings the calculator recipes train on, per operation (see `PHRASINGS`)."""

TOOL_HINT = "You can use the calculator tool. Give your final answer as a number in \\boxed{}."


SPLITS = ("train", "heldout")


def task_split(task: dict[str, Any]) -> str:
    """ "heldout" for one task in 8 by a stable hash of its operands and operation (never its
    phrasing: a held-out question is not a training one in other words), else "train"."""
    key = f"{int(task['a'])} {task.get('op', '*')} {int(task['b'])}".encode()
    return "heldout" if zlib.crc32(key) % 8 == 0 else "train"


def check_op(op: str) -> str:
    """`op` when it is an operation of `PHRASINGS`, else ValueError."""
    if op not in PHRASINGS:
        raise ValueError(f"a calculator task's op must be one of {sorted(PHRASINGS)}, got {op!r}")
    return op


def task_prompt(a: int, b: int, op: str = "*", phrasing: str = "what_is") -> str:
    """The user turn of a task: the question, then the tool hint."""
    check_op(op)
    if phrasing not in PHRASINGS[op]:
        raise ValueError(f"phrasing {phrasing!r} is not one of {sorted(PHRASINGS[op])} for op {op!r}")
    return PHRASINGS[op][phrasing].format(a=a, b=b) + "\n" + TOOL_HINT


def family_phrasings(operations: list[str], phrasings: list[str]) -> dict[str, list[str]]:
    """The phrasings of each operation of a task family: `phrasings` split by the operation whose
    `PHRASINGS` name them. ValueError for an unknown operation, a phrasing of none of `operations`,
    or an operation left without a phrasing."""
    if not operations:
        raise ValueError("a calculator family needs at least one operation")
    for op in operations:
        check_op(op)
    for phrasing in phrasings:
        if not any(phrasing in PHRASINGS[op] for op in operations):
            known = sorted({p for op in operations for p in PHRASINGS[op]})
            raise ValueError(f"phrasing {phrasing!r} is not one of {known} for operations {operations}")
    by_op = {op: [p for p in phrasings if p in PHRASINGS[op]] for op in dict.fromkeys(operations)}
    for op, mine in by_op.items():
        if not mine:
            raise ValueError(f"operation {op!r} has none of the phrasings {phrasings}")
    return by_op


def product_prompt(a: int, b: int) -> str:
    """The user turn of a product task in the default phrasing."""
    return task_prompt(a, b)


@register_environment("tool_calculator")
class CalculatorEnvironment(ToolEnvironment):
    """Products (3-digit × 2-digit by default) or sums with a calculator tool; reward 1 for the
    right result, else 0.

    Tasks are `{"a": int, "b": int}` and, outside the default family, "op" ("*" or "+") and
    "phrasing" (a key of `PHRASINGS[op]`); `generate_tasks(count, seed)` draws them from the
    family `operation`, `digits` and `phrasings` name. The result of a op b is the answer. Info
    of the final turn: "extracted_answer", "correct", "called_tool".
    Metrics (see `ToolEnvironment.batch_metrics`): `env/accuracy`, `env/tool_call_rate`,
    `env/tool_errors`, `env/reward_mean`, `env/tool_budget_exhausted_rate`.

    Args:
        max_tool_calls: calculator calls allowed per episode.
        answer_format: "boxed_or_last_number" (the last `\\boxed{}`, else the last number) or
            "boxed" (a reply without a box is wrong).
        system_prompt: a system message to begin each episode with (None: the template's default).
        stop_at_tool_call, tools_in_system_prompt, tool_choice, examples,
            describe_tools: see `ToolEnvironment`.
        operation: the generated tasks' operation, "*" or "+", or a list of both (one drawn per
            task).
        digits: the generated operands' digit counts (a, b).
        phrasings: the generated tasks' phrasings, one drawn per task among those of its operation
            (keys of `PHRASINGS[op]`; every phrasing must be one of an operation's, and every
            operation needs one); None: "what_is" only.
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
        operation: Literal["*", "+"] | list[Literal["*", "+"]] = "*",
        digits: tuple[int, int] = (3, 2),
        phrasings: list[str] | None = None,
    ) -> None:
        self.answer_format = check_answer_format(answer_format)
        if len(digits) != 2 or min(int(d) for d in digits) < 1:
            raise ValueError(f"digits must be two digit counts >= 1, got {digits!r}")
        self.digits = (int(digits[0]), int(digits[1]))
        self.operations = [operation] if isinstance(operation, str) else list(operation)
        self.phrasings = family_phrasings(self.operations, list(phrasings or ["what_is"]))
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

    def generate_tasks(self, count: int, seed: int, split: str | None = None) -> list[dict[str, Any]]:
        """`count` tasks of the family, drawn from `seed`: operands of `digits` digits (3 and 2 by
        default: a in 100..999, b in 10..99), a phrasing drawn per task when there are several.
        Tasks of the default family are `{"a", "b"}` only. `split` "train" or "heldout" keeps only
        the draws of that pool (`task_split`: disjoint by operands, whatever the seeds); None keeps
        every draw."""
        if split not in (None, *SPLITS):
            raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
        rng = random.Random(seed)
        (da, db), tasks = self.digits, []
        while len(tasks) < count:
            task: dict[str, Any] = {
                "a": rng.randint(10 ** (da - 1), 10**da - 1),
                "b": rng.randint(10 ** (db - 1), 10**db - 1),
            }
            op = _draw(rng, self.operations)
            phrasing = _draw(rng, self.phrasings[op])
            if op != "*":
                task["op"] = op
            if phrasing != "what_is":
                task["phrasing"] = phrasing
            if split is None or task_split(task) == split:
                tasks.append(task)
        return tasks

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """One episode per task; the seeds are not needed (a task is one question)."""
        starts = []
        for task in tasks:
            a, b = int(task["a"]), int(task["b"])
            op, phrasing = task.get("op", "*"), task.get("phrasing", "what_is")
            messages = [{"role": "user", "content": task_prompt(a, b, op, phrasing)}]
            starts.append(self.start(messages, {**task, "answer": OPERATIONS[op](a, b)}))
        return starts

    def score(self, reply: str, metadata: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """1.0 when the reply's answer equals metadata["answer"], else 0.0."""
        return score_number_answer(reply, metadata["answer"], self.answer_format)


def _draw(rng: random.Random, options: list[str]) -> str:
    """One of `options`; a single option draws nothing from `rng` (`choice` would), so that a family
    of one operation and one phrasing draws the operands it always drew."""
    return rng.choice(options) if len(options) > 1 else options[0]


def oracle_transcript(env: CalculatorEnvironment, task: dict[str, Any]) -> list[Message]:
    """The conversation of a player that calls the calculator once with the task's expression and
    boxes the result, through the environment's own `reset` and `step` (its system prompt, tool
    description, examples and tool message): SFT rows for a warm start. Raises ValueError when the
    environment offers the tools as `tools=` schemas (an SFT row has no `tools=`: describe them
    in the system prompt, `tools_in_system_prompt`, or not at all) or does not score it 1."""
    [start] = env.reset([task], [0])
    if start.tools:
        raise ValueError(
            "oracle transcripts are chat rows without tools=: set tools_in_system_prompt=true (or "
            "describe_tools=false) so that the tools are described in the messages"
        )
    expression = f"{int(task['a'])} {task.get('op', '*')} {int(task['b'])}"
    call = {"name": "calculator", "arguments": {"expression": expression}}
    messages = [
        *start.messages,
        {"role": "assistant", "content": f"{TOOL_CALL_OPEN}\n{json.dumps(call)}\n{TOOL_CALL_CLOSE}"},
    ]
    turn = env.step([messages], [start.metadata])
    observation = turn.observations[0]
    messages += observation if isinstance(observation, list) else [observation]
    messages.append({"role": "assistant", "content": f"The answer is \\boxed{{{start.metadata['answer']}}}."})
    final = env.step([messages], [turn.metadata[0]])
    if not (final.done[0] and final.rewards[0] == 1.0 and final.info[0].get("called_tool")):
        raise ValueError(f"the oracle transcript of {task} does not score 1: {final.info[0]}")
    return messages
