"""Conversations -> token ids with a loss mask on the assistant's tokens only.

The chat template comes from the tokenizer. Assistant spans are found by rendering the
conversation up to each assistant turn with and without that turn: the characters between
the two renderings (the reply and its end-of-turn marker) are the assistant's, and a token
counts when it starts inside such a span (offsets from the fast tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Message = dict[str, str]


@dataclass(frozen=True)
class TokenizedExample:
    """One sequence: `input_ids[t]` with `loss_mask[t] = 1` when token t is a training target."""

    input_ids: list[int]
    loss_mask: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


def _render(tokenizer: Any, messages: list[Message], add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def assistant_char_spans(tokenizer: Any, messages: list[Message]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the [start, end) character spans of assistant turns."""
    text = _render(tokenizer, messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], add_generation_prompt=True) if i else ""
        through = _render(tokenizer, messages[: i + 1])
        if not (through.startswith(before) and text.startswith(through)):
            raise ValueError(
                "the tokenizer's chat template does not render a conversation as a prefix of its "
                "continuation, so assistant tokens cannot be located; use a template without "
                "history rewriting or the prompt/response format"
            )
        spans.append((len(before), len(through)))
    return text, spans


def tokenize_conversation(tokenizer: Any, messages: list[Message]) -> TokenizedExample:
    """Token ids of the templated conversation; the loss mask marks assistant tokens."""
    if getattr(tokenizer, "chat_template", None) is None:
        return _tokenize_plain(tokenizer, messages)
    text, spans = assistant_char_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s <= start < e for s, e in spans)) for start, _ in enc["offset_mapping"]]
    return TokenizedExample(list(enc["input_ids"]), mask)


def _tokenize_plain(tokenizer: Any, messages: list[Message]) -> TokenizedExample:
    """No chat template: concatenate turns; assistant turns end with EOS and are the targets."""
    ids: list[int] = []
    mask: list[int] = []
    if tokenizer.bos_token_id is not None:
        ids.append(tokenizer.bos_token_id)
        mask.append(0)
    for m in messages:
        piece = tokenizer(m["content"], add_special_tokens=False)["input_ids"]
        target = m["role"] == "assistant"
        if target and tokenizer.eos_token_id is not None:
            piece = [*piece, tokenizer.eos_token_id]
        ids.extend(piece)
        mask.extend([int(target)] * len(piece))
    return TokenizedExample(ids, mask)


def encode_prompt(tokenizer: Any, messages: list[Message]) -> list[int]:
    """Token ids of a conversation followed by the assistant generation prompt."""
    if getattr(tokenizer, "chat_template", None) is None:
        text = "\n".join(m["content"] for m in messages) + "\n"
        return tokenizer(text)["input_ids"]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
