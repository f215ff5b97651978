"""What the judge reads and how its verdict is read (`posttrain.environments.judge`): the judge prompts
of each mode, the verdict patterns and labels, the parsers of a judge's text (`parse_score`,
`parse_label`), `neutralise` (a policy's reply with the verdicts it wrote removed before the judge
reads it), and the parts of a sample a prompt shows (its question, its reference answer). Pure
string functions: no backend, no state."""

from __future__ import annotations

import re
from typing import Any, Literal

from posttrain.data.boxed import extract_last_boxed
from posttrain.environments.interface import Message

DEFAULT_PROMPT = (
    "Rate the assistant's answer to the question below from {min_score} (useless) to {max_score} "
    "(perfect), for correctness and helpfulness.{reference_block}\n\n"
    "Question:\n{question}\n\nAnswer:\n{reply}\n\n"
    "Give a one-sentence reason, then end with a line 'Score: <number>'."
)
DEFAULT_PATTERN = r"[Ss]core\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)(?!\w|\.\d)"

PAIRWISE_PROMPT = (
    "Two assistants answered the question below. Which answer is better, for correctness and "
    "helpfulness?{reference_block}\n\nQuestion:\n{question}\n\n"
    "Answer A:\n{reply_a}\n\nAnswer B:\n{reply_b}\n\n"
    "Give a one-sentence reason, then end with a line 'Winner: A', 'Winner: B' or 'Winner: tie'."
)
PAIRWISE_PATTERN = r"[Ww]inner\s*[:=]\s*\**\s*(?:[Aa]nswer\s+)?(A|B|[Tt]ie|TIE)\b"
PAIRWISE_LABELS = {"a": 1.0, "b": 0.0, "tie": 0.5}  # the points of answer A

REFERENCE_PROMPT = (
    "Does the answer below give the same final result as the reference answer? Ignore wording "
    "and formatting.\n\nQuestion:\n{question}\n\nReference answer:\n{reference}\n\n"
    "Answer:\n{reply}\n\nGive a one-sentence reason, then end with a line 'Verdict: yes' or 'Verdict: no'."
)
REFERENCE_PATTERN = r"[Vv]erdict\s*[:=]\s*\**\s*([Yy]es|YES|[Nn]o|NO)\b"
REFERENCE_LABELS = {"yes": 1.0, "no": 0.0}

Mode = Literal["pointwise", "pairwise", "reference"]


def parse_score(
    text: str, pattern: str = DEFAULT_PATTERN, min_score: float = 1, max_score: float = 10
) -> float | None:
    """The last number `pattern` captures in `text`, if within [min_score, max_score]; else None."""
    matches = re.findall(pattern, text or "")
    if not matches:
        return None
    last = matches[-1]
    try:
        value = float(last if isinstance(last, str) else last[0])
    except ValueError:
        return None
    if not min_score <= value <= max_score:  # also rejects nan
        return None
    return value


def parse_label(text: str, pattern: str, labels: dict[str, float]) -> float | None:
    """The value of the last label `pattern` captures in `text` (case-folded key of `labels`); None
    when there is none or it is not a known label."""
    matches = re.findall(pattern, text or "")
    if not matches:
        return None
    last = matches[-1]
    return labels.get((last if isinstance(last, str) else last[0]).strip().casefold())


VERDICT_REMOVED = "[verdict removed]"


def neutralise(text: str, pattern: str) -> str:
    """`text` (a policy's reply, before the judge reads it) with every match of the verdict
    `pattern` replaced by "[verdict removed]", until none is left: a judge that quotes the reply
    cannot then end on a verdict the reply wrote ("Score: 10"). Other text is unchanged."""
    for _ in range(len(text) + 1):
        cleaned = re.sub(pattern, VERDICT_REMOVED, text)
        if cleaned == text:
            return text
        text = cleaned
    return text


def normalise(score: float, min_score: float, max_score: float) -> float:
    """`score` in [min_score, max_score] mapped linearly to [0, 1]."""
    return (score - min_score) / (max_score - min_score)


def question_of(log: list[Message]) -> str:
    """The first user message's content."""
    return next((m.get("content") or "" for m in log if m.get("role") == "user"), "")


def prompt_key(log: list[Message]) -> tuple:
    """The conversation before the last assistant message (samples of one GRPO group share it)."""
    last = max((i for i, m in enumerate(log) if m.get("role") == "assistant"), default=len(log))
    return tuple((m.get("role"), str(m.get("content"))) for m in log[:last])


def reference_of(meta: dict[str, Any], k: int | None = None) -> Any:
    """The task's reference answer: its `reference`, else its `answer`."""
    value = meta.get("reference", meta.get("answer"))
    if value is None:
        where = f"sample {k} " if k is not None else ""
        raise ValueError(
            f"reference-mode judging needs metadata['reference'] or ['answer']; {where}has {sorted(meta)}"
        )
    return value


def reference_block(meta: dict[str, Any]) -> str:
    reference = meta.get("reference")
    return f"\n\nA reference answer:\n{reference}" if reference else ""


def boxed_equals(reply: str, answer: Any) -> bool:
    """The last \\boxed{} equals the answer as a string (ground truth for `env/accuracy`)."""
    boxed = extract_last_boxed(reply)
    return boxed is not None and boxed.strip() == str(answer).strip()
