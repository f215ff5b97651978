"""SFT datasets: rows in `messages` or `prompt`/`response` shape -> tokenised examples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.config.common import DatasetConfig
from posttrain.data.sources import DataError, Row, load_rows
from posttrain.data.tokenize import Message, TokenizedExample, tokenize_conversation

ROLES = {"system", "user", "assistant"}
SFT_ROLES = ROLES | {"tool"}
"""An SFT conversation may hold `tool` messages (a tool's result, as in multi-turn episodes with
tools: not trained on, like every turn but the assistant's); they keep `name` and `tool_call_id`."""
TOOL_MESSAGE_KEYS = ("name", "tool_call_id")


@dataclass
class SFTDataset:
    examples: list[TokenizedExample]
    num_rows: int
    num_truncated: int
    num_dropped: int

    def __len__(self) -> int:
        return len(self.examples)


def row_to_messages(row: Row, cfg: DatasetConfig) -> list[Message]:
    """Normalise a row to a chat message list, failing with the row's location."""
    data = row.data
    fmt = cfg.format
    if fmt == "auto":
        if cfg.messages_key not in data and cfg.prompt_key not in data:
            raise DataError(
                f"{row.where}: missing key {cfg.messages_key!r} (a list of chat messages), or "
                f"{cfg.prompt_key!r} and {cfg.response_key!r} (the row has keys: {', '.join(data) or 'none'})"
            )
        fmt = "messages" if cfg.messages_key in data else "prompt_response"
    if fmt == "messages":
        messages = _require(row, cfg.messages_key)
        _check_messages(row, messages)
        messages = [
            {"role": m["role"], "content": m["content"], **{k: m[k] for k in TOOL_MESSAGE_KEYS if k in m}}
            if m["role"] == "tool"
            else {"role": m["role"], "content": m["content"]}
            for m in messages
        ]
    else:
        prompt = _require(row, cfg.prompt_key)
        response = _require(row, cfg.response_key)
        if cfg.context_key is not None:
            prompt = f"{_require(row, cfg.context_key)}\n\n{prompt}"
        messages = [{"role": "user", "content": str(prompt)}, {"role": "assistant", "content": str(response)}]
    if cfg.system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": cfg.system_prompt}, *messages]
    return messages


def _require(row: Row, key: str) -> Any:
    if key not in row.data:
        raise DataError(
            f"{row.where}: missing key {key!r} (the row has keys: {', '.join(row.data) or 'none'})"
        )
    if row.data[key] is None:  # parquet and HF datasets fill a column a row lacks with null
        raise DataError(f"{row.where}: {key!r} is null")
    return row.data[key]


def _check_messages(row: Row, messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{row.where}: `messages` must be a non-empty list of {{role, content}} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataError(f"{row.where}: message {i} must have `role` and `content`, got {m!r}")
        if m["role"] not in SFT_ROLES:
            raise DataError(
                f"{row.where}: message {i} has role {m['role']!r}; expected one of {sorted(SFT_ROLES)}"
            )
        if not isinstance(m["content"], str):
            raise DataError(f"{row.where}: message {i} has content {m['content']!r}; expected a string")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{row.where}: no assistant message, so nothing to train on")


def build_sft_dataset(
    cfg: DatasetConfig, tokenizer: Any, *, max_seq_len: int, overlong: str = "truncate"
) -> SFTDataset:
    """Load, template, tokenise; truncate or drop sequences longer than `max_seq_len`."""
    rows = load_rows(cfg)
    if not rows:
        raise DataError(f"dataset {cfg.path or cfg.reasoning_gym} is empty")
    examples, truncated, dropped = [], 0, 0
    for row in rows:
        example = tokenize_conversation(tokenizer, row_to_messages(row, cfg))
        too_long = len(example) > max_seq_len
        if too_long and overlong == "truncate":
            example = TokenizedExample(example.input_ids[:max_seq_len], example.loss_mask[:max_seq_len])
        if (too_long and overlong == "drop") or sum(example.loss_mask[1:]) == 0:
            dropped += 1
            continue
        truncated += too_long
        examples.append(example)
    if not examples:
        raise DataError(
            f"every one of the {len(rows)} rows was dropped; raise policy.max_seq_len ({max_seq_len})"
        )
    return SFTDataset(examples, len(rows), truncated, dropped)
