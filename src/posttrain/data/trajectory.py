"""One episode as one token sequence (`Trajectory`), what bounds it (`EpisodeLimits`), and the functions
that grow it: a generated turn (`record_turn`, loss mask 1, tokens exactly as generated) and an
observation (`append_observation`, loss mask 0; cut in the middle to `max_observation_tokens` by
`cut_observation`). Shared by the rollout loops (`posttrain.rollout`) and the agent endpoint's recorder
(`posttrain.endpoint.recorder`), which both build trajectories and import this module, not each other.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Any

from posttrain.data.tokenize import Message


@dataclass
class ClosedContext:
    """The token sequence of an episode's earlier turns, closed off when the environment restarted
    the conversation (`EnvStepResult.new_context`): ids, loss mask and generation logprobs as they
    were, and per turn in it the [start, end) positions of its generated tokens."""

    input_ids: list[int]
    loss_mask: list[int]
    generation_logprobs: list[float]
    turn_spans: list[tuple[int, int]]


@dataclass
class Trajectory:
    """One episode as one token sequence, with who wrote each token and what each turn earned.

    input_ids / loss_mask / generation_logprobs: [T] each; loss_mask 1 on generated tokens.
    turn_spans: per turn, the [start, end) positions of its generated tokens in input_ids.
    turn_rewards: per turn, the environment's reward; `reward` is their sum.
    reward_components: the episode's named reward parts (`EnvStepResult.reward_components`), each
        summed over its turns; {} when the environment names none.
    turn_invalid_tool_call / turn_malformed_thinking: per turn, the environment's flags of its
        assistant message (`EnvStepResult.invalid_tool_call` / `malformed_thinking`).
    observation_tokens: tokens the environment's observations (and their template) added.
    scored: False when the environment could not score the episode: left out of the loss.
    stop_reason: "done" (the environment ended it), "max_turns", or "truncated" (max_new_tokens
        or max_seq_len reached).
    policy_version: the version of the policy weights that generated it (the number of policy updates
        before them); None when unknown (then it is never treated as exactly on-policy). With partial
        rollouts, the oldest version that sampled any of its tokens.
    token_versions: partial rollouts: the version of the weights that sampled each generated token
        (in order of the loss_mask-1 positions); empty otherwise.
    task_name: in a run over several environments, the name of the one that played it; else None.
    contexts: the token sequences of earlier turns, closed off each time the environment restarted
        the conversation (`restart_context`); input_ids / loss_mask / generation_logprobs then hold
        the current context only, and turn_spans the turns of all contexts, each in its own
        context's positions. Empty for an episode that is one sequence.
    """

    input_ids: list[int]
    loss_mask: list[int]
    generation_logprobs: list[float]
    messages: list[Message]
    metadata: dict[str, Any]
    group_id: int
    reward: float = 0.0
    truncated: bool = False
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    reward_components: dict[str, float] = field(default_factory=dict)
    turn_invalid_tool_call: list[bool] = field(default_factory=list)
    turn_malformed_thinking: list[bool] = field(default_factory=list)
    observation_tokens: int = 0
    scored: bool = True
    stop_reason: str = ""
    stop_strings: tuple[str, ...] = ()
    response_prefix: str = ""
    prefix_ids: list[int] = field(default_factory=list)
    num_prompt_messages: int = 0
    policy_version: int | None = None
    token_versions: list[int] = field(default_factory=list)
    task_name: str | None = None
    contexts: list[ClosedContext] = field(default_factory=list)

    @property
    def response_length(self) -> int:
        """Generated tokens over all the episode's contexts."""
        return sum(self.loss_mask) + sum(sum(c.loss_mask) for c in self.contexts)

    @property
    def num_turns(self) -> int:
        return len(self.turn_spans)


@dataclass(frozen=True)
class EpisodeLimits:
    """What bounds an episode: turns, the whole sequence's tokens, one observation's tokens, and the
    tokens generated over all its turns (the episode token budget; None: no bound beyond the turns)."""

    max_turns: int
    max_seq_len: int
    max_observation_tokens: int | None = None
    max_episode_tokens: int | None = None


def episode_room(t: Trajectory, max_episode_tokens: int | None) -> int:
    """How many more tokens t may generate under the episode token budget (unbounded: None)."""
    if max_episode_tokens is None:
        return sys.maxsize
    return max(max_episode_tokens - t.response_length, 0)


def append_generated(
    t: Trajectory,
    ids: list[int],
    lps: list[float],
    truncated: bool,
    max_seq_len: int,
    versions: list[int] | None = None,
    max_episode_tokens: int | None = None,
) -> list[int]:
    """Add one turn's generated tokens (cut at max_seq_len and at the episode token budget
    `max_episode_tokens`; `versions`: of the weights that sampled each, partial rollouts) and the
    assistant message; returns the ids kept."""
    room = min(max_seq_len - len(t.input_ids), episode_room(t, max_episode_tokens))
    t.truncated = truncated or len(ids) > room
    ids, lps = ids[:room], lps[:room]
    if versions:
        t.token_versions += versions[:room]
    t.turn_spans.append((len(t.input_ids), len(t.input_ids) + len(ids)))
    t.input_ids += ids
    t.loss_mask += [1] * len(ids)
    t.generation_logprobs += lps
    return ids


def append_observation(t: Trajectory, extra: list[int], observation: list[Message], max_seq_len: int) -> bool:
    """Add an observation's messages and tokens (loss mask 0); False (and the episode ends
    truncated) when they would leave no room for the next turn."""
    t.messages.extend(observation)
    if len(t.input_ids) + len(extra) >= max_seq_len:
        t.done, t.truncated, t.stop_reason = True, True, "truncated"
        return False
    t.input_ids += extra
    t.loss_mask += [0] * len(extra)
    t.generation_logprobs += [0.0] * len(extra)
    t.observation_tokens += len(extra)
    return True


def restart_context(
    t: Trajectory, prompt_ids: list[int], observation: list[Message], max_seq_len: int
) -> bool:
    """Close off the episode's token sequence so far (`ClosedContext`) and start the next turn's
    from `prompt_ids` (the observation alone under the chat template, then the response prefix);
    the observation's messages join `messages` (the whole conversation, for the environment and
    the transcripts). False (and the episode ends truncated) when the prompt leaves no room."""
    t.messages.extend(observation)
    if len(prompt_ids) >= max_seq_len:
        t.done, t.truncated, t.stop_reason = True, True, "truncated"
        return False
    earlier = sum(len(c.turn_spans) for c in t.contexts)
    t.contexts.append(
        ClosedContext(t.input_ids, t.loss_mask, t.generation_logprobs, list(t.turn_spans[earlier:]))
    )
    t.input_ids = list(prompt_ids)
    t.loss_mask = [0] * len(prompt_ids)
    t.generation_logprobs = [0.0] * len(prompt_ids)
    t.observation_tokens += len(prompt_ids)
    return True


def split_contexts(t: Trajectory) -> list[Trajectory]:
    """The episode as one trajectory per context (closed ones first, in order, then the current one),
    each with the episode's reward, group, flags and state, its own tokens and its own turns' spans
    and flags; [t] for an episode without closed contexts."""
    if not t.contexts:
        return [t]
    closed = [(c.input_ids, c.loss_mask, c.generation_logprobs, c.turn_spans) for c in t.contexts]
    current = t.turn_spans[sum(len(c[3]) for c in closed) :]
    rows, first = [], 0
    for ids, mask, lps, spans in [*closed, (t.input_ids, t.loss_mask, t.generation_logprobs, current)]:
        last = first + len(spans)
        rows.append(
            replace(
                t,
                input_ids=ids,
                loss_mask=mask,
                generation_logprobs=lps,
                turn_spans=list(spans),
                turn_invalid_tool_call=t.turn_invalid_tool_call[first:last],
                turn_malformed_thinking=t.turn_malformed_thinking[first:last],
                contexts=[],
            )
        )
        first = last
    return rows


def record_turn(
    t: Trajectory,
    ids: list[int],
    lps: list[float],
    truncated: bool,
    tokenizer: Any,
    max_seq_len: int,
    versions: list[int] | None = None,
    max_episode_tokens: int | None = None,
) -> list[int]:
    """Append a generated turn (tokens as generated, cut at max_seq_len and the episode token budget)
    and its assistant message; returns the token ids kept."""
    ids = append_generated(t, ids, lps, truncated, max_seq_len, versions, max_episode_tokens)
    text = t.response_prefix + tokenizer.decode(ids, skip_special_tokens=True)
    t.messages.append({"role": "assistant", "content": text})
    return ids


def _content_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _cut_marker(tokenizer: Any, cut: int, max_tokens: int) -> str:
    """The most telling marker of a cut that fits in `max_tokens` tokens: "[... n tokens cut ...]",
    "[...]", "…", or none."""
    for marker in (f"\n[... {cut} tokens cut ...]\n", "\n[...]\n", "…"):
        if len(_content_ids(tokenizer, marker)) <= max_tokens:
            return marker
    return ""


def cut_middle(tokenizer: Any, message: Message, max_tokens: int | None) -> Message:
    """`message` with its content cut to at most `max_tokens` tokens, the cut's marker included:
    the start and the end are kept around a marker ("[... n tokens cut ...]", shorter where that
    does not fit). Holds: the returned content encodes (no special tokens) to <= max_tokens ids."""
    if max_tokens is None:
        return message
    ids = _content_ids(tokenizer, message.get("content") or "")
    if len(ids) <= max_tokens:
        return message
    marker = _cut_marker(tokenizer, len(ids) - max_tokens, max_tokens)
    keep = max_tokens - len(_content_ids(tokenizer, marker))
    while True:  # decode + re-encode may merge tokens differently at the seams: shrink until it fits
        head, tail = ids[: keep // 2], ids[len(ids) - (keep - keep // 2) :] if keep else []
        marker = _cut_marker(tokenizer, len(ids) - keep, max_tokens) if marker else ""
        content = tokenizer.decode(head) + marker + tokenizer.decode(tail)
        if keep <= 0 or len(_content_ids(tokenizer, content)) <= max_tokens:
            return {**message, "content": content}
        keep -= 1


def cut_observation(tokenizer: Any, messages: list[Message], max_tokens: int | None) -> list[Message]:
    """An observation's messages with their contents cut (`cut_middle`) so that together they have
    at most `max_tokens` content tokens, markers included (the chat template's own tokens are not
    counted). Messages that fit in an even share of what the shorter ones leave are kept whole; the
    longer ones share the rest equally."""
    if max_tokens is None:
        return messages
    sizes = [len(_content_ids(tokenizer, m.get("content") or "")) for m in messages]
    if sum(sizes) <= max_tokens:
        return messages
    shares, left, open_ = dict.fromkeys(range(len(messages)), 0), max_tokens, len(messages)
    for i in sorted(range(len(messages)), key=lambda i: sizes[i]):
        shares[i] = min(sizes[i], left // open_)
        left, open_ = left - shares[i], open_ - 1
    return [
        m if sizes[i] <= shares[i] else cut_middle(tokenizer, m, shares[i]) for i, m in enumerate(messages)
    ]
