"""Single-turn math with two named rewards, correctness and format: the environment of the GDPO
recipe (`advantage.estimator=gdpo`, examples/configs/gdpo_math.yaml).

Each reply gets `reward_components` {"correct": c, "format": f} and the reward c + f:

    c = 1                  when its boxed answer is right (`MathEnvironment`'s verdict), else 0
    f = format_weight      when it has one boxed answer, outside its reasoning, not copied from the
                           prompt, of the ground truth's shape or right (`MathEnvironment`'s format
                           rule, `answer_shaped`), else 0

So a right answer earns 1 + format_weight, a wrong one in the right format format_weight, and
everything `MathEnvironment` scores 0 (no box, several different boxes, an answer only inside
`<think>`, a copy of the question, a placeholder) scores 0 in both parts: no path pays more than
answering right (tests/unit/test_gdpo.py::test_math_format_red_team).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posttrain.environments.interface import EnvStepResult, Message, register_environment
from posttrain.environments.math import MathEnvironment


@register_environment("math_format")
class MathFormatEnvironment(MathEnvironment):
    """`MathEnvironment` with its reward split into named parts "correct" and "format" (see the
    module docstring). Metrics: MathEnvironment's, plus `env/format_rate` (share paid the format part).

    Args:
        format_weight: the format part of a well-formed reply (> 0).
        timeout_s, verify_fn, num_procs: see `MathEnvironment`.
    """

    def __init__(
        self,
        format_weight: float = 0.2,
        timeout_s: float = 5.0,
        *,
        verify_fn: Callable[[str, str], bool] | None = None,
        num_procs: int = 1,
    ) -> None:
        if format_weight <= 0:
            raise ValueError(f"format_weight must be > 0, got {format_weight}")
        # MathEnvironment pays format_weight exactly to a wrong answer of the right shape
        super().__init__(timeout_s, format_weight, verify_fn=verify_fn, num_procs=num_procs)
        self.format_weight = float(format_weight)

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        """MathEnvironment's verdicts, the reward split into "correct" and "format" (c + f)."""
        result = super().step(message_logs, metadata)
        parts = []
        for reward, info in zip(result.rewards, result.info, strict=True):
            correct = 1.0 if info["correct"] else 0.0
            formatted = info["correct"] or reward == self.format_weight
            parts.append({"correct": correct, "format": self.format_weight if formatted else 0.0})
        rewards = [p["correct"] + p["format"] for p in parts]
        return EnvStepResult(
            rewards, result.observations, result.done, result.metadata, result.info, reward_components=parts
        )

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        n = max(len(results), 1)
        paid = sum(p.get("format", 0.0) > 0 for p in results.reward_components)
        return {**super().batch_metrics(results), "env/format_rate": paid / n}
