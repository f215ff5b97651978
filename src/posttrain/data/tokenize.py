"""Conversations -> token ids with a loss mask on the assistant's tokens only.

The chat template comes from the tokenizer. Assistant spans are found by rendering the
conversation up to each assistant turn with and without that turn: the characters between
the two renderings (the reply and its end-of-turn marker) are the assistant's, and a token
counts when it starts inside such a span (offsets from the fast tokenizer).

Multi-turn rollouts never re-render what the model generated: `observation_ids` takes the
tokens of an environment's observation from a fixed dummy history (see `turn_suffix`).
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


def encode_prompt(tokenizer: Any, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
    """Token ids of a conversation followed by the assistant generation prompt; `tools` (JSON
    schemas) go to the chat template as `tools=`."""
    if getattr(tokenizer, "chat_template", None) is None:
        text = "\n".join(m["content"] for m in messages) + "\n"
        return tokenizer(text)["input_ids"]
    extra = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


DUMMY_HISTORY: tuple[Message, ...] = ({"role": "user", "content": "x"}, {"role": "assistant", "content": "y"})
"""The fixed conversation whose rendering locates the text between an assistant reply and the next turn."""


def turn_suffix(tokenizer: Any, observation: Message | list[Message]) -> str:
    """The text the chat template puts after an assistant reply's content when `observation` follows it:
    the reply's end-of-turn marker, the observation's own turn and the next assistant generation prompt.

    Rendered on `DUMMY_HISTORY` (user "x", assistant "y") plus `observation`: the suffix is everything
    after the dummy reply's content. Templates that trim replies or drop their <think> block do not
    touch "y", and a reasoning template that renders the last reply differently (Qwen3's empty
    <think></think>) renders "y" as an earlier turn here, as it will the real reply. SmolLM2:
    "<|im_end|>\\n<|im_start|>user\\n{observation}<|im_end|>\\n<|im_start|>assistant\\n".
    """
    history = list(DUMMY_HISTORY)
    observations = [observation] if isinstance(observation, dict) else list(observation)
    prompt = _render(tokenizer, history[:1], add_generation_prompt=True)
    full = _render(tokenizer, [*history, *observations], add_generation_prompt=True)
    reply = history[1]["content"]
    at = full.find(reply, len(prompt)) if full.startswith(prompt) else -1
    if at < 0:
        raise ValueError(
            "the chat template does not render [user, assistant, observation] as a continuation of "
            f"[user] + its generation prompt, so a multi-turn observation cannot be located; got {full!r}"
        )
    return full[at + len(reply) :]


def observation_ids(
    tokenizer: Any, generated_ids: list[int], observation: Message | list[Message]
) -> list[int]:
    """Tokens to append after a turn's generated tokens (kept exactly as generated) so that the
    sequence continues with `observation` (one message, or several: the results of several tool
    calls) and the next assistant generation prompt.

    They are the tokens of `turn_suffix`, which begins with the template's end-of-turn marker. A
    model that ended its turn itself emitted that marker as its last token (SmolLM2: `<|im_end|>`,
    its EOS), so the marker's first token is not repeated: the sequence equals the templated
    conversation when the reply round-trips through the tokenizer. A turn that ended otherwise (a
    stop string) gets the whole marker from the template. Without a chat template: the
    observation's content on a line of its own, as `encode_prompt` writes prompts.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        observations = [observation] if isinstance(observation, dict) else observation
        text = "".join("\n" + m["content"] for m in observations) + "\n"
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    ids = list(tokenizer(turn_suffix(tokenizer, observation), add_special_tokens=False)["input_ids"])
    if generated_ids and ids and generated_ids[-1] == ids[0] and _is_special(tokenizer, ids[0]):
        ids = ids[1:]
    return ids


def _is_special(tokenizer: Any, token_id: int) -> bool:
    """Whether `token_id` is a special token (an end-of-turn marker, not text that merely matches)."""
    if token_id in tokenizer.all_special_ids:
        return True
    added = getattr(tokenizer, "added_tokens_decoder", {}).get(token_id)
    return bool(added is not None and added.special)
