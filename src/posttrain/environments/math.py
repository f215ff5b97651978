"""Math answers checked with math-verify: reward 1 when the reply's boxed answer equals the ground truth.

The answer is read by `final_boxed_answer`: outside `<think>` blocks, and only when every box of
the reply holds the same answer (several different boxed answers are a hedge and answer nothing).
An answer copied from the prompt (`copied_from_prompt`: the question's expression, a placeholder
such as `\\boxed{your answer}`) scores 0 even when the verifier would accept it, and a wrong answer
earns the format reward only in the ground truth's shape (`answer_shaped`: a number for a number).

Verification runs in a persistent subprocess (`TimeoutPool`), so a sample whose check hangs
(sympy on adversarial output) or raises scores 0 after at most `timeout_s`, is recorded in
`info["verifier_error"]`, and the rest of the batch is unaffected. math-verify's own timeouts
use `signal.alarm`, which only works in a main thread; they are switched off here in favour of
the subprocess timeout, which works in any thread, in Ray actors, and for any `verify_fn`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from posttrain.data.boxed import boxed_contents
from posttrain.environments.interface import (
    EnvStepResult,
    Message,
    PooledEnvironment,
    last_assistant_content,
    register_environment,
    verifier_error_metrics,
)
from posttrain.environments.timeout_pool import TimeoutPool

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def strip_think(text: str) -> str:
    """The reply without its reasoning: every `<think>…</think>` block removed, the text before a
    stray `</think>` (a chat template may open the block in the prompt) and after an unclosed
    `<think>` (reasoning cut short) dropped. An answer only inside the reasoning is no answer."""
    text = _THINK_BLOCK.sub(" ", text)
    end = text.lower().rfind("</think>")
    if end >= 0:
        text = text[end + len("</think>") :]
    start = text.lower().find("<think>")
    return text if start < 0 else text[:start]


def final_boxed_answer(text: str) -> str | None:
    """A reply's one boxed answer, read outside its reasoning (`strip_think`): the content of its
    boxes when every non-empty box holds the same answer (whitespace aside); None when it has no
    non-empty box, a box left unclosed (a truncated reply), or boxes with different answers (a
    hedge such as `\\boxed{7} \\boxed{8}` answers nothing)."""
    boxes = boxed_contents(strip_think(text))
    if any(b is None for b in boxes):
        return None
    answers = [b for b in boxes if b]
    if len({_squash(b) for b in answers}) != 1:
        return None
    return answers[-1]


def _squash(text: str) -> str:
    """`text` case-folded with all whitespace and `\\text{…}` wrappers removed, for comparisons."""
    return re.sub(r"\s+", "", re.sub(r"\\(?:text|mathrm)\{([^{}]*)\}", r"\1", text)).casefold()


_PLACEHOLDER = re.compile(
    r"(?:your|the|my)?(?:final)?(?:answer|result|solution|number|value)(?:here|goeshere)?|\.\.\.|…|\?+|_+"
)


def prompt_text(log: list[Message]) -> str:
    """Everything the policy was shown in an episode: the content of its non-assistant messages."""
    return "\n".join(str(m.get("content") or "") for m in log if m.get("role") != "assistant")


def copied_from_prompt(answer: str, prompt: str, ground_truth: Any) -> bool:
    """Whether an answer is a copy rather than an answer: not a number literal and not the ground
    truth's own text, but found in the prompt (the question's expression, a format placeholder
    such as `your answer`) or a placeholder word (`answer`, `your final answer`, `...`). Such an
    answer scores 0, even where a verifier would accept it (math-verify finds `\\frac{2}{4}`, copied
    from "Simplify \\frac{2}{4}", equal to `\\frac{1}{2}`). Comparisons ignore case, whitespace and
    `\\text{}`."""
    squashed = _squash(answer)
    if not squashed or is_number_literal(answer) or squashed == _squash(str(ground_truth)):
        return False
    return squashed in _squash(prompt) or bool(_PLACEHOLDER.fullmatch(squashed))


class _QuietTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


_NUMBER = re.compile(r"[-+]?((\d{1,3}(,\d{3})+|\d+)(\.\d*)?|\.\d+)")
_FRACTION = re.compile(r"[-+]?(\\[dt]?frac\{\d+\}\{\d+\}|\d+/\d+)")
_DECORATION = re.compile(r"\\text\{[^{}]*\}|\\[$%!,;]|[$%]")


def is_number_literal(text: str) -> bool:
    """`12`, `-3.5`, `1,000`, `\\$12`, `7\\%`, `12 \\text{ cm}`, `1/2`, `\\frac{1}{2}`; not `4 + 8`,
    `2*6`, `x`, `7, 8`, `7 8` or `7 \\text{ or } 8` (commas only between groups of three digits,
    spaces only around the number)."""
    bare = _DECORATION.sub("", text).strip()
    return bool(_NUMBER.fullmatch(bare) or _FRACTION.fullmatch(bare))


def answer_shaped(prediction: str, answer: Any) -> bool:
    """Whether a wrong boxed answer has the ground truth's shape, which the format reward pays:
    a number literal when the ground truth is one (not `3+4`, `7 or 8`, `x = 7`, `1e999`); anything
    for a symbolic ground truth."""
    return not is_number_literal(str(answer)) or is_number_literal(prediction)


def math_verify_equal(prediction: str, answer: str) -> bool:
    """Whether `prediction` (the content of a box) equals `answer` by math-verify (`1/2` == `0.5`).

    When the ground truth is a number, the prediction must be a number too: math-verify would
    otherwise accept an unevaluated expression such as `4 + 8` for 12, which a policy learns to
    exploit by copying the question into the box.
    """
    from math_verify import parse, verify

    if is_number_literal(answer) and not is_number_literal(prediction):
        return False

    log = logging.getLogger("math_verify")
    if not any(isinstance(f, _QuietTimeoutWarning) for f in log.filters):
        for name in ("math_verify", "math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_QuietTimeoutWarning())
    gold_text = answer if ("\\boxed" in answer or "$" in answer) else f"\\boxed{{{answer}}}"
    # timeouts off: math-verify's signal.alarm only works in a main thread; TimeoutPool bounds the time
    gold = parse(gold_text, parsing_timeout=None)
    pred = parse(f"\\boxed{{{prediction}}}", parsing_timeout=None)
    return bool(verify(gold, pred, timeout_seconds=None))


@register_environment("math")
class MathEnvironment(PooledEnvironment):
    """Single-turn math: reward 1.0 if the boxed answer of the last assistant message is correct.

    Every task needs "answer", the ground truth (`required_fields`; the data loader checks each row).

    Args:
        timeout_s: limit for verifying one sample; a sample past it scores 0 (`verifier_error="timeout"`).
        format_reward: reward for a boxed answer that is wrong (0.1 by default, which teaches the
            answer format to a model that rarely uses it) and has the ground truth's shape (a number
            for a numeric ground truth); no box, an empty one, boxes with different answers, an
            answer only inside `<think>`, or one copied from the prompt score 0.
        verify_fn: `verify_fn(prediction, answer) -> bool`; default `math_verify_equal`. It runs in
            a subprocess, so it must be picklable (a module-level function).
        num_procs: verifier processes per environment (each holds sympy, ~100 MB).

    Metadata of each sample needs "answer" (the ground truth; str or number). `info` gets
    "extracted_answer" (str or None), "correct" (bool), "verifier_error" (None, "timeout",
    or "exception: ...") and "copied_prompt" (bool: the answer is a copy of the prompt).
    """

    required_fields = ("answer",)
    """Task fields every dataset row must give (checked when the data loads)."""

    def __init__(
        self,
        timeout_s: float = 5.0,
        format_reward: float = 0.1,
        *,
        verify_fn: Callable[[str, str], bool] | None = None,
        num_procs: int = 1,
    ) -> None:
        self.timeout_s = timeout_s
        self.format_reward = format_reward
        self.verify_fn = verify_fn or math_verify_equal
        self.num_procs = num_procs
        self._pool: TimeoutPool | None = None

    def _get_pool(self) -> TimeoutPool:
        if self._pool is None:
            warmup = ("1", "1") if self.verify_fn is math_verify_equal else None
            self._pool = TimeoutPool(
                self.verify_fn, timeout_s=self.timeout_s, num_procs=self.num_procs, warmup_args=warmup
            )
        return self._pool

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        if len(message_logs) != len(metadata):
            raise ValueError(f"{len(message_logs)} message logs but {len(metadata)} metadata entries")
        for k, meta in enumerate(metadata):
            if "answer" not in meta:
                raise ValueError(
                    f"MathEnvironment needs metadata['answer'] (the ground truth); sample {k} has {sorted(meta)}"
                )
        boxed = [final_boxed_answer(last_assistant_content(log)) for log in message_logs]
        copied = [
            b is not None and copied_from_prompt(b, prompt_text(log), meta["answer"])
            for b, log, meta in zip(boxed, message_logs, metadata, strict=True)
        ]
        to_check = [k for k, b in enumerate(boxed) if b is not None and not copied[k]]
        outcomes = (
            self._get_pool().map([(boxed[k], str(metadata[k]["answer"])) for k in to_check])
            if to_check
            else []
        )

        rewards = [0.0] * len(boxed)
        info: list[dict[str, Any]] = [
            {"extracted_answer": b, "correct": False, "verifier_error": None, "copied_prompt": c}
            for b, c in zip(boxed, copied, strict=True)
        ]
        for k, outcome in zip(to_check, outcomes, strict=True):
            if not outcome.ok:
                info[k]["verifier_error"] = outcome.error
            elif outcome.value:
                info[k]["correct"] = True
                rewards[k] = 1.0
            elif answer_shaped(boxed[k], metadata[k]["answer"]):
                rewards[k] = self.format_reward
        return EnvStepResult.final(rewards, metadata, info)

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        n = max(len(results), 1)
        return {
            "env/accuracy": sum(bool(i.get("correct")) for i in results.info) / n,
            "env/boxed_rate": sum(i.get("extracted_answer") is not None for i in results.info) / n,
            "env/reward_mean": sum(results.rewards) / n,
            **verifier_error_metrics(results),
        }
