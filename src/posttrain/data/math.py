"""Math problems for RL: a prompt (chat messages and token ids) and a ground-truth answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.config.schema import DatasetConfig
from posttrain.data.sources import DataError, Row, load_rows
from posttrain.data.tokenize import Message, encode_prompt


@dataclass(frozen=True)
class Problem:
    messages: list[Message]
    prompt_ids: list[int]
    answer: str


def read_answer(row: Row, cfg: DatasetConfig) -> str:
    if cfg.answer_key not in row.data or row.data[cfg.answer_key] is None:
        raise DataError(
            f"{row.where}: missing key {cfg.answer_key!r} (the row has keys: {', '.join(row.data)})"
        )
    raw = str(row.data[cfg.answer_key])
    if cfg.answer_format == "gsm8k":
        if "####" not in raw:
            raise DataError(f"{row.where}: a GSM8K answer must end with '#### <answer>', got {raw[-60:]!r}")
        return raw.split("####")[-1].strip().replace(",", "")
    if cfg.answer_format == "boxed":
        from posttrain.environments.math import extract_last_boxed

        boxed = extract_last_boxed(raw)
        if boxed is None:
            raise DataError(f"{row.where}: no \\boxed{{}} answer in {cfg.answer_key!r}")
        return boxed
    return raw.strip()


def build_math_problems(
    cfg: DatasetConfig,
    tokenizer: Any,
    *,
    prompt_template: str,
    system_prompt: str | None,
    max_prompt_len: int,
) -> list[Problem]:
    """Rows -> problems; prompts longer than `max_prompt_len` tokens are dropped."""
    problems = []
    for row in load_rows(cfg):
        if cfg.problem_key not in row.data:
            raise DataError(
                f"{row.where}: missing key {cfg.problem_key!r} (the row has keys: {', '.join(row.data)})"
            )
        content = prompt_template.format(problem=row.data[cfg.problem_key])
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": content}
        ]
        ids = encode_prompt(tokenizer, messages)
        if len(ids) <= max_prompt_len:
            problems.append(Problem(messages, ids, read_answer(row, cfg)))
    if not problems:
        raise DataError(
            f"no usable problems in {cfg.path or cfg.reasoning_gym} (all prompts over {max_prompt_len} tokens?)"
        )
    return problems
