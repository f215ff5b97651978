"""Preference pairs: rows in the common shapes -> (prompt, chosen reply, rejected reply) -> token pairs.

Shapes read (see `PreferenceDatasetConfig`): prompt + chosen + rejected strings; chosen/rejected
message lists that contain the prompt (UltraFeedback, TRL's HH-RLHF); raw HH-RLHF transcripts
("\\n\\nHuman: ... \\n\\nAssistant: ..."); HelpSteer3 (context, response1/2, overall_preference).
Both sequences of a pair are templated with the tokenizer's chat template; the loss mask covers
the assistant tokens of the reply only (not earlier assistant turns of a multi-turn prompt).

A batch interleaves the pair: rows 2i and 2i+1 are the chosen and rejected sequences of pair i,
so any even-sized contiguous slice (a shard, a microbatch) holds whole pairs.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from posttrain.config.common import DatasetConfig
from posttrain.config.supervised import PreferenceDatasetConfig
from posttrain.data.batching import TokenBatch, collate
from posttrain.data.sft import ROLES
from posttrain.data.sources import BOXED_INSTRUCTION, DataError, Row, load_rows, worked_answer
from posttrain.data.tokenize import Message, TokenizedExample, assistant_char_spans, tokenize_conversation


@dataclass(frozen=True)
class PreferencePair:
    """Tokenised chosen and rejected conversations of one prompt."""

    chosen: TokenizedExample
    rejected: TokenizedExample


@dataclass
class PreferenceDataset:
    pairs: list[PreferencePair]
    num_rows: int
    num_truncated: int
    num_dropped: int

    def __len__(self) -> int:
        return len(self.pairs)


@dataclass
class PreferenceBatch(TokenBatch):
    """2P rows: row 2i is pair i's chosen sequence, row 2i+1 its rejected one.

    reference_logps: [2P] sequence log-probabilities under the frozen reference (DPO; zeros until set).
    """

    reference_logps: torch.Tensor = field(default_factory=lambda: torch.zeros(0))

    @property
    def num_pairs(self) -> int:
        return len(self) // 2


# ----------------------------------------------------------------------------- rows -> messages
_HH_TURN = re.compile(r"\n\n(Human|Assistant): ")


def parse_hh_transcript(text: str) -> list[Message]:
    """'\\n\\nHuman: hi\\n\\nAssistant: hello' -> [{user: hi}, {assistant: hello}] (Anthropic HH-RLHF)."""
    parts = _HH_TURN.split(text)
    if len(parts) < 3 or parts[0].strip():
        raise ValueError("not an HH-RLHF transcript ('\\n\\nHuman: ... \\n\\nAssistant: ...')")
    roles = {"Human": "user", "Assistant": "assistant"}
    return [{"role": roles[r], "content": c.strip()} for r, c in zip(parts[1::2], parts[2::2], strict=True)]


def _as_messages(row: Row, key: str, value: Any, default_role: str) -> list[Message]:
    if isinstance(value, str):
        if value.startswith("\n\nHuman: "):
            try:
                return parse_hh_transcript(value)
            except ValueError as e:
                raise DataError(f"{row.where}: `{key}`: {e}") from None
        return [{"role": default_role, "content": value}]
    if isinstance(value, list) and value:
        for i, m in enumerate(value):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise DataError(f"{row.where}: `{key}` message {i} must have `role` and `content`, got {m!r}")
            if m["role"] not in ROLES:
                raise DataError(
                    f"{row.where}: `{key}` message {i} has role {m['role']!r}; expected {sorted(ROLES)}"
                )
            if not isinstance(m["content"], str):
                raise DataError(
                    f"{row.where}: `{key}` message {i} has content {m['content']!r}; expected a string"
                )
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise DataError(f"{row.where}: `{key}` must be a string or a non-empty message list, got {value!r}")


def _require(row: Row, key: str) -> Any:
    if key not in row.data:
        raise DataError(
            f"{row.where}: missing key {key!r} (the row has keys: {', '.join(row.data) or 'none'})"
        )
    if row.data[key] is None:  # parquet and HF datasets fill a column a row lacks with null
        raise DataError(f"{row.where}: {key!r} is null")
    return row.data[key]


def _common_prefix(a: list[Message], b: list[Message]) -> int:
    n = 0
    while n < min(len(a), len(b)) - 1 and a[n] == b[n]:
        n += 1
    return n


def _reply(row: Row, key: str, conversation: list[Message], prompt: list[Message]) -> list[Message]:
    """The part of `conversation` after `prompt`; it must contain an assistant message."""
    if conversation[: len(prompt)] == prompt:
        reply = conversation[len(prompt) :]
    elif conversation[0]["role"] == "assistant":
        reply = conversation
    else:
        raise DataError(f"{row.where}: `{key}` is a conversation that does not start with the row's prompt")
    if not any(m["role"] == "assistant" for m in reply):
        raise DataError(f"{row.where}: `{key}` has no assistant reply after the prompt")
    return reply


def row_to_pair(
    row: Row, cfg: PreferenceDatasetConfig
) -> tuple[list[Message], list[Message], list[Message]] | None:
    """(prompt, chosen reply, rejected reply) messages; None for a HelpSteer3 tie."""
    fmt = cfg.format
    if fmt == "auto":
        fmt = "helpsteer3" if "overall_preference" in row.data else "chosen_rejected"
    if fmt == "helpsteer3":
        prompt = _as_messages(row, "context", _require(row, "context"), "user")
        preference = _require(row, "overall_preference")
        if preference == 0:
            return None
        better, worse = ("response1", "response2") if preference < 0 else ("response2", "response1")
        chosen = _as_messages(row, better, _require(row, better), "assistant")
        rejected = _as_messages(row, worse, _require(row, worse), "assistant")
    else:
        chosen_full = _as_messages(row, cfg.chosen_key, _require(row, cfg.chosen_key), "assistant")
        rejected_full = _as_messages(row, cfg.rejected_key, _require(row, cfg.rejected_key), "assistant")
        if cfg.prompt_key in row.data and row.data[cfg.prompt_key] is not None:
            prompt = _as_messages(row, cfg.prompt_key, row.data[cfg.prompt_key], "user")
        else:  # full conversations: the prompt is what chosen and rejected share
            prompt = chosen_full[: _common_prefix(chosen_full, rejected_full)]
        chosen = _reply(row, cfg.chosen_key, chosen_full, prompt)
        rejected = _reply(row, cfg.rejected_key, rejected_full, prompt)
    if cfg.system_prompt and (not prompt or prompt[0]["role"] != "system"):
        prompt = [{"role": "system", "content": cfg.system_prompt}, *prompt]
    return prompt, chosen, rejected


# ----------------------------------------------------------------------------- tokenisation
def tokenize_reply(tokenizer: Any, prompt: list[Message], reply: list[Message]) -> TokenizedExample:
    """The templated conversation prompt + reply; the loss mask covers the reply's assistant tokens only."""
    messages = [*prompt, *reply]
    if getattr(tokenizer, "chat_template", None) is None:
        full = tokenize_conversation(tokenizer, messages)
        cut = len(tokenize_conversation(tokenizer, prompt).input_ids) if prompt else 0
        return TokenizedExample(full.input_ids, [0] * cut + full.loss_mask[cut:])
    text, spans = assistant_char_spans(tokenizer, messages)
    assistant_index = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    spans = [s for s, i in zip(spans, assistant_index, strict=True) if i >= len(prompt)]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s <= start < e for s, e in spans)) for start, _ in enc["offset_mapping"]]
    return TokenizedExample(list(enc["input_ids"]), mask)


def _fit(example: TokenizedExample, max_seq_len: int) -> TokenizedExample:
    return TokenizedExample(example.input_ids[:max_seq_len], example.loss_mask[:max_seq_len])


def build_preference_dataset(
    cfg: PreferenceDatasetConfig, tokenizer: Any, *, max_seq_len: int, overlong: str = "truncate"
) -> PreferenceDataset:
    """Load, template and tokenise pairs; truncate or drop pairs longer than `max_seq_len`."""
    rows = preference_rows(cfg)
    if not rows:
        raise DataError(f"preference dataset {cfg.path or cfg.reasoning_gym} is empty")
    pairs, truncated, dropped = [], 0, 0
    for row in rows:
        parsed = row_to_pair(row, cfg)
        if parsed is None:
            dropped += 1
            continue
        prompt, chosen, rejected = parsed
        pair = PreferencePair(
            tokenize_reply(tokenizer, prompt, chosen), tokenize_reply(tokenizer, prompt, rejected)
        )
        too_long = max(len(pair.chosen), len(pair.rejected)) > max_seq_len
        if too_long and overlong == "truncate":
            pair = PreferencePair(_fit(pair.chosen, max_seq_len), _fit(pair.rejected, max_seq_len))
        if (too_long and overlong == "drop") or not (
            sum(pair.chosen.loss_mask[1:]) and sum(pair.rejected.loss_mask[1:])
        ):
            dropped += 1
            continue
        truncated += too_long
        pairs.append(pair)
    if not pairs:
        raise DataError(
            f"every one of the {len(rows)} preference rows was dropped (ties, or too long for "
            f"policy.max_seq_len={max_seq_len})"
        )
    return PreferenceDataset(pairs, len(rows), truncated, dropped)


def collate_pairs(pairs: list[PreferencePair], pad_id: int = 0) -> PreferenceBatch:
    """Interleave [chosen_0, rejected_0, chosen_1, ...] into one right-padded batch."""
    base = collate([e for p in pairs for e in (p.chosen, p.rejected)], pad_id=pad_id)
    return PreferenceBatch(
        base.input_ids, base.attention_mask, base.loss_mask, reference_logps=torch.zeros(len(base))
    )


# ----------------------------------------------------------------------------- sources
def preference_rows(cfg: PreferenceDatasetConfig) -> list[Row]:
    """Rows of a file or `datasets` split (via the shared loaders), or generated arithmetic pairs."""
    if cfg.reasoning_gym is not None:
        rows = generated_pairs(cfg)
    else:
        rows = load_rows(DatasetConfig(path=cfg.path, subset=cfg.subset, split=cfg.split))
    return rows[: cfg.max_samples] if cfg.max_samples else rows


def wrong_answer(answer: str, rng: random.Random, distractors: list[str]) -> str:
    """A wrong answer: an integer answer moved by a nonzero offset in [-5, 5]; otherwise another item's answer."""
    try:
        value = int(answer)
    except ValueError:
        others = [d for d in distractors if d != answer]
        if not others:
            raise DataError(
                f"cannot make a wrong answer for {answer!r}: no other answers to borrow"
            ) from None
        return rng.choice(others)
    return str(value + rng.choice([-5, -4, -3, -2, -1, 1, 2, 3, 4, 5]))


def _generated_prompt(question: str, system_prompt: str | None) -> str | list[Message]:
    if system_prompt is None:
        return question
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def generated_pairs(cfg: PreferenceDatasetConfig) -> list[Row]:
    """Offline pairs from reasoning-gym: the worked right answer vs the same worked form with a wrong number.

    Both responses end in `\\boxed{}` as the GRPO quickstart's rewards expect; the wrong number is drawn
    from a generator seeded by the task seed, so a split is the same on every machine.
    """
    import reasoning_gym

    gym = cfg.reasoning_gym
    assert gym is not None
    try:
        items = list(reasoning_gym.create_dataset(gym.task, size=gym.size, seed=gym.seed, **gym.kwargs))
    except Exception as e:  # noqa: BLE001
        raise DataError(f"reasoning-gym could not make task {gym.task!r} with {gym.kwargs}: {e}") from e
    rng = random.Random(gym.seed * 7919 + 17)
    answers = [str(item["answer"]) for item in items]
    rows = []
    for i, item in enumerate(items):
        meta, answer = item.get("metadata", {}), answers[i]
        wrong = wrong_answer(answer, rng, answers)
        data = {
            "prompt": _generated_prompt(f"{item['question']}\n{BOXED_INSTRUCTION}", gym.system_prompt),
            "chosen": worked_answer(meta, answer),
            "rejected": worked_answer(meta, wrong),
            "answer": answer,
        }
        rows.append(Row(data, f"reasoning_gym:{gym.task}(seed={gym.seed}) pair {i}"))
    return rows
