"""A `python(code)` tool that runs in `posttrain.sandbox`, and an example environment that offers it.

`python_tool(pool)` makes the tool for a `ToolRegistry`: each call is one fresh sandboxed run
(`SandboxPool.run`); its result for the model is the run's stdout, then its stderr after a
"[stderr]" line, each cut to `max_chars` (the middle dropped), and "[status: timeout]" (or
error, memory, ...) when the run did not end with exit status 0. A sandbox failure comes back
as an error text too (the tool never raises into the episode).

`PythonToolEnvironment` ("tool_python"): "What is the sum of the digits of 7**53?", a number a
small model cannot work out in its head but can compute with one call; reward 1 when the final
reply's last `\\boxed{}` (or last number) is right. Tasks from `generate_tasks(count, seed)`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Literal

from posttrain.environments.calculator import check_answer_format, score_number_answer
from posttrain.environments.interface import EpisodeStart, register_environment
from posttrain.environments.tools import ToolEnvironment, ToolRegistry


def cut_middle(text: str, max_chars: int) -> str:
    """`text` if it has at most `max_chars` characters, else its start and end around a marker."""
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}\n...[{len(text) - 2 * half} characters cut]...\n{text[-half:]}"


def format_result(result: Any, max_chars: int) -> str:
    """The tool's text for one `ExecResult`: stdout, "[stderr]" and stderr, "[status: ...]"."""
    parts = [cut_middle(result.stdout, max_chars)] if result.stdout else []
    if result.stderr:
        parts.append("[stderr]\n" + cut_middle(result.stderr, max_chars))
    if result.status != "ok":
        parts.append(f"[status: {result.status}]")
    return "\n".join(parts) or "[no output]"


def python_tool(pool: Any, *, max_chars: int = 1000, timeout_s: float | None = None) -> Callable[[str], str]:
    """The `python(code)` tool over `pool` (a `SandboxPool`, or a function returning one, so that
    the pool starts on the first call)."""

    def python(code: str) -> str:
        """Run Python code in a fresh sandboxed interpreter and return what it printed.

        Args:
            code: A Python program; use print() to see values. Nothing persists between calls.
        """
        from posttrain.sandbox import SandboxError

        try:
            sandbox = pool() if callable(pool) else pool
            result = sandbox.run(code, timeout_s=timeout_s)
        except SandboxError as e:
            raise RuntimeError(f"the sandbox failed, try again: {e}") from None
        return format_result(result, max_chars)

    return python


def digit_sum_prompt(base: int, exponent: int) -> str:
    """The user turn of a task."""
    return (
        f"What is the sum of the digits of {base}**{exponent}?\n"
        "You can run Python code with the python tool. Give your final answer as a number in \\boxed{}."
    )


@register_environment("tool_python")
class PythonToolEnvironment(ToolEnvironment):
    """Digit sums of powers with a sandboxed `python(code)` tool; reward 1 for the right sum.

    Tasks are `{"base": int, "exponent": int}`; info of the final turn: "extracted_answer",
    "correct", "called_tool". Metrics: see `ToolEnvironment.batch_metrics`.

    Args:
        max_tool_calls: python calls allowed per episode.
        max_chars: stdout and stderr of a call are each cut to this many characters.
        answer_format, system_prompt, stop_at_tool_call, tools_in_system_prompt,
            tool_choice, examples, describe_tools: as for `tool_calculator`.
        sandbox: `SandboxConfig` fields (e.g. {"workers": 2, "timeout_s": 5}).
    """

    required_fields = ("base", "exponent")
    """Task fields every dataset row must give (`reset` builds the digit-sum task from them)."""

    def __init__(
        self,
        max_tool_calls: int = 3,
        max_chars: int = 1000,
        answer_format: Literal["boxed", "boxed_or_last_number"] = "boxed_or_last_number",
        system_prompt: str | None = None,
        stop_at_tool_call: bool = True,
        tools_in_system_prompt: bool = False,
        tool_choice: str = "auto",
        examples: list[dict[str, Any]] | None = None,
        describe_tools: bool = True,
        sandbox: dict[str, Any] | None = None,
    ) -> None:
        self.answer_format = check_answer_format(answer_format)
        self.sandbox = dict(sandbox or {})
        self._pool: Any = None
        super().__init__(
            ToolRegistry([python_tool(self.pool, max_chars=max_chars)], max_result_chars=4 * max_chars),
            max_tool_calls=max_tool_calls,
            stop_at_tool_call=stop_at_tool_call,
            tools_in_system_prompt=tools_in_system_prompt,
            system_prompt=system_prompt,
            tool_choice=tool_choice,
            examples=examples,
            describe_tools=describe_tools,
        )

    def pool(self) -> Any:
        """The sandbox pool, started on the first call."""
        if self._pool is None:
            from posttrain.config.rollout import SandboxConfig
            from posttrain.sandbox import SandboxPool

            self._pool = SandboxPool(SandboxConfig(**self.sandbox))
        return self._pool

    def close(self) -> None:
        """Stop the sandbox pool (a later call starts a new one)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def generate_tasks(self, count: int, seed: int) -> list[dict[str, Any]]:
        """`count` tasks: base in 3..9, exponent in 20..80, drawn from `seed`."""
        rng = random.Random(seed)
        return [{"base": rng.randint(3, 9), "exponent": rng.randint(20, 80)} for _ in range(count)]

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """One episode per task."""
        starts = []
        for task in tasks:
            base, exponent = int(task["base"]), int(task["exponent"])
            messages = [{"role": "user", "content": digit_sum_prompt(base, exponent)}]
            answer = sum(int(d) for d in str(base**exponent))
            starts.append(self.start(messages, {**task, "answer": answer}))
        return starts

    def score(self, reply: str, metadata: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """1.0 when the reply's answer equals metadata["answer"], else 0.0."""
        return score_number_answer(reply, metadata["answer"], self.answer_format)
