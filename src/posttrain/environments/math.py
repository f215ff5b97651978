"""Math answers checked with math-verify: reward 1 when the last `\\boxed{}` equals the ground truth.

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

from posttrain.environments.interface import (
    EnvStepResult,
    Message,
    PooledEnvironment,
    last_assistant_content,
    register_environment,
    verifier_error_metrics,
)
from posttrain.environments.timeout_pool import TimeoutPool

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def extract_last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced; None if absent.

    Nested braces are matched (`\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`), escaped braces `\\{ \\}`
    are skipped, and a last box left unclosed (a truncated completion) gives None.
    """
    end = len(text)
    while True:
        start = max(text.rfind(cmd, 0, end) for cmd in _BOX_COMMANDS)
        if start < 0:
            return None
        i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
        while i < len(text) and text[i].isspace():
            i += 1
        if i < len(text) and text[i] == "{":
            break
        end = start  # `\boxed` without a brace (prose, `\boxed 5`): look at the box before it
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
        j += 1
    return None


class _QuietTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)")
_FRACTION = re.compile(r"[-+]?(\\[dt]?frac\{\d+\}\{\d+\}|\d+/\d+)")
_DECORATION = re.compile(r"\\text\{[^{}]*\}|\\[$%!,;]|[\s$%,]")


def is_number_literal(text: str) -> bool:
    """`12`, `-3.5`, `1,000`, `\\$12`, `1/2`, `\\frac{1}{2}`; not `4 + 8`, `2*6` or `x`."""
    bare = _DECORATION.sub("", text)
    return bool(_NUMBER.fullmatch(bare) or _FRACTION.fullmatch(bare))


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
    """Single-turn math: reward 1.0 if the last `\\boxed{}` of the last assistant message is correct.

    Args:
        timeout_s: limit for verifying one sample; a sample past it scores 0 (`verifier_error="timeout"`).
        format_reward: reward for a boxed answer that is wrong (0.1 by default, which teaches the
            answer format to a model that rarely uses it); no box, or an empty one, scores 0.
        verify_fn: `verify_fn(prediction, answer) -> bool`; default `math_verify_equal`. It runs in
            a subprocess, so it must be picklable (a module-level function).
        num_procs: verifier processes per environment (each holds sympy, ~100 MB).

    Metadata of each sample needs "answer" (the ground truth; str or number). `info` gets
    "extracted_answer" (str or None), "correct" (bool) and "verifier_error" (None, "timeout",
    or "exception: ...").
    """

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
        boxed = [extract_last_boxed(last_assistant_content(log)) for log in message_logs]
        boxed = [b if b and b.strip() else None for b in boxed]  # an empty \\boxed{} is no answer
        to_check = [k for k, b in enumerate(boxed) if b is not None]
        outcomes = (
            self._get_pool().map([(boxed[k], str(metadata[k]["answer"])) for k in to_check])
            if to_check
            else []
        )

        rewards = [0.0] * len(boxed)
        info: list[dict[str, Any]] = [
            {"extracted_answer": b, "correct": False, "verifier_error": None} for b in boxed
        ]
        for k, outcome in zip(to_check, outcomes, strict=True):
            if not outcome.ok:
                info[k]["verifier_error"] = outcome.error
            elif outcome.value:
                info[k]["correct"] = True
                rewards[k] = 1.0
            else:
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
