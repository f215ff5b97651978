"""One episode's token sequence, assembled from what an OpenAI-compatible client sent and what the
generator produced: token in, token out, never re-tokenised.

The first request's messages (and `tools`) are rendered by the chat template, as an in-process rollout
renders an episode's first messages (`prompt_ids_of`, tools written into the system message for a
template that ignores `tools=`). Each reply's tokens are kept exactly as generated (loss mask 1, with
their generation logprobs). A follow-up request must repeat the conversation recorded so far (its
messages and the replies the endpoint returned, compared by role, content and tool calls; ids, names
and other fields are free) and add only new `tool` / `user` / `system` messages: those are the
observation, tokenised with `observation_ids` after the previous reply's generated tokens (loss mask 0),
exactly as the in-process rollout appends an environment's observation. So the assembled sequence is the
in-process rollout's for the same episode (tests/functional/test_endpoint.py::
test_endpoint_episode_equals_in_process_rollout).

A request whose messages do not continue the recorded conversation (an edited or dropped message, a
changed `tools` list, an assistant message the endpoint did not generate) raises `HistoryEdited`: the
request fails with HTTP 400 and the episode is left out of the loss (unscored), never trained on a
sequence the model did not see. A request after `max_turns` replies, or with no room left under
`max_seq_len` or the episode token budget, raises `EpisodeOver` (HTTP 400); the episode keeps what it has.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.data.tokenize import observation_ids
from posttrain.data.trajectory import (
    EpisodeLimits,
    Trajectory,
    append_observation,
    cut_observation,
    episode_room,
    record_turn,
)
from posttrain.environments.interface import EpisodeStart, Message
from posttrain.environments.tools import prompt_ids_of, tools_for_template


class HistoryEdited(ValueError):
    """The request's messages do not continue the conversation recorded for its session."""


class EpisodeOver(ValueError):
    """The episode can take no more turns (max_turns, max_seq_len or its token budget reached)."""


def content_text(content: Any) -> str:
    """A message's content as text: a string as is, OpenAI content parts joined, None as ""."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    raise HistoryEdited(
        f"message content must be a string or a list of text parts, got {type(content).__name__}"
    )


def _arguments(text: Any) -> Any:
    """Tool-call arguments compared by value: JSON text decoded, anything else as is."""
    if isinstance(text, str):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def canonical(message: Message) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """(role, content text, ((name, arguments as canonical JSON), ...)): what must match between a
    recorded message and the client's copy of it."""
    calls = tuple(
        (
            str((c.get("function") or c).get("name")),
            json.dumps(_arguments((c.get("function") or c).get("arguments")), sort_keys=True),
        )
        for c in message.get("tool_calls") or ()
    )
    return str(message.get("role")), content_text(message.get("content")), calls


def template_messages(
    messages: list[Message], render_calls: Callable[[list[dict[str, Any]]], str] | None = None
) -> list[Message]:
    """The client's messages as the chat template takes them: content as text; a `tool` message named
    after its call (found by `tool_call_id` among the conversation's calls); an assistant message's
    `tool_calls` with decoded arguments, or, for a template that ignores tools (`render_calls` given),
    written into its content in the parser's format."""
    names = {
        c.get("id"): (c.get("function") or {}).get("name")
        for m in messages
        for c in m.get("tool_calls") or ()
    }
    out = []
    for m in messages:
        msg: Message = {"role": m.get("role"), "content": content_text(m.get("content"))}
        if m.get("role") == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id"))
            msg.update({"name": name} if name else {})
            msg.update({"tool_call_id": m["tool_call_id"]} if m.get("tool_call_id") else {})
        calls = m.get("tool_calls")
        if calls and render_calls is not None:
            msg["content"] = "\n".join(x for x in (msg["content"], render_calls(calls)) if x)
        elif calls:
            msg["tool_calls"] = [
                {
                    "type": "function",
                    "function": {"name": f.get("name"), "arguments": _arguments(f.get("arguments"))},
                }
                for f in ((c.get("function") or c) for c in calls)
            ]
        out.append(msg)
    return out


@dataclass
class EpisodeRecorder:
    """The token sequence of one session's episode (`trajectory`), grown request by request.

    `prompt(messages, tools, prefix)` checks a request against the recorded conversation and returns
    the ids to generate from (the sequence so far, ending with the observation's tokens and the turn's
    forced `prefix`); `record(ids, logprobs, truncated, reply)` appends the generated tokens and the
    reply returned to the client. Holds after every `record`: `trajectory.input_ids` is the first
    request's rendered prompt followed, per turn, by its prefix and generated tokens, and before every
    later turn the observation's `observation_ids`."""

    tokenizer: Any
    limits: EpisodeLimits
    group_id: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    trajectory: Trajectory | None = None
    seen: list[tuple] = field(default_factory=list)
    tools_key: str = ""
    last_ids: list[int] = field(default_factory=list)
    render_calls: Callable[[list[dict[str, Any]]], str] | None = None

    def room(self) -> int:
        """How many tokens the next turn may generate (max_seq_len and the episode token budget)."""
        t = self.trajectory
        assert t is not None
        return min(
            self.limits.max_seq_len - len(t.input_ids), episode_room(t, self.limits.max_episode_tokens)
        )

    def prompt(self, messages: list[Message], tools: list[dict] | None, prefix: str) -> list[int]:
        """The ids to generate the next reply from; raises HistoryEdited or EpisodeOver."""
        if not messages:
            raise HistoryEdited("a request needs at least one message")
        tools_key = json.dumps(tools or [], sort_keys=True)
        rendered = template_messages(messages, self.render_calls)
        if self.trajectory is None:
            self._first(rendered, tools, prefix)
            self.tools_key = tools_key
        else:
            if tools_key != self.tools_key:
                raise HistoryEdited("the request's tools differ from the episode's first request's")
            self._follow_up(messages, rendered, prefix)
        self.seen = [canonical(m) for m in messages]
        if self.room() <= 0:
            self.trajectory.done, self.trajectory.stop_reason = True, "truncated"
            raise EpisodeOver("the episode has no room left (max_seq_len or its token budget reached)")
        return list(self.trajectory.input_ids)

    def _prefix_ids(self, prefix: str) -> list[int]:
        return list(self.tokenizer(prefix, add_special_tokens=False)["input_ids"]) if prefix else []

    def _first(self, messages: list[Message], tools: list[dict] | None, prefix: str) -> None:
        """Render the first request's messages (and tools) as the episode's prompt."""
        start = tools_for_template(self.tokenizer, EpisodeStart(messages, dict(self.metadata), tools=tools))
        prompt = prompt_ids_of(self.tokenizer, start)
        if len(prompt) >= self.limits.max_seq_len:
            raise EpisodeOver(
                f"the prompt has {len(prompt)} tokens, at least max_seq_len ({self.limits.max_seq_len})"
            )
        prefix_ids = self._prefix_ids(prefix)
        ids = prompt + prefix_ids
        self.trajectory = Trajectory(
            input_ids=ids,
            loss_mask=[0] * len(ids),
            generation_logprobs=[0.0] * len(ids),
            messages=[dict(m) for m in start.messages],
            metadata=dict(self.metadata),
            group_id=self.group_id,
            response_prefix=prefix,
            prefix_ids=prefix_ids,
            num_prompt_messages=len(start.messages),
        )

    def _follow_up(self, messages: list[Message], rendered: list[Message], prefix: str) -> None:
        """Append the observation (the messages after the recorded conversation) and the turn's prefix."""
        t = self.trajectory
        assert t is not None
        if t.done:
            raise EpisodeOver(f"the episode is over ({t.stop_reason})")
        given = [canonical(m) for m in messages[: len(self.seen)]]
        if given != self.seen:
            at = next(
                (i for i, (a, b) in enumerate(zip(given, self.seen, strict=False)) if a != b), len(given)
            )
            raise HistoryEdited(
                f"message {at} differs from the conversation recorded for this session (the endpoint "
                "keeps the tokens it generated; a client may only append tool/user messages)"
            )
        observation = rendered[len(self.seen) :]
        if not observation or any(m.get("role") == "assistant" for m in observation):
            raise HistoryEdited(
                "a follow-up request must add tool/user messages after the last reply, and no assistant message"
            )
        if t.num_turns >= self.limits.max_turns:
            t.done, t.stop_reason = True, "max_turns"
            raise EpisodeOver(f"the episode reached max_turns ({self.limits.max_turns})")
        observation = cut_observation(self.tokenizer, observation, self.limits.max_observation_tokens)
        prefix_ids = self._prefix_ids(prefix)
        extra = observation_ids(self.tokenizer, self.last_ids, observation) + prefix_ids
        if not append_observation(t, extra, observation, self.limits.max_seq_len):
            raise EpisodeOver(f"the observation leaves no room under max_seq_len ({self.limits.max_seq_len})")
        t.truncated, t.response_prefix, t.prefix_ids = False, prefix, prefix_ids

    def record(self, ids: list[int], logprobs: list[float], truncated: bool, reply: Message) -> list[int]:
        """Append one generated turn (tokens as generated) and the reply returned for it; the ids kept."""
        t = self.trajectory
        assert t is not None
        kept = record_turn(
            t,
            ids,
            logprobs,
            truncated,
            self.tokenizer,
            self.limits.max_seq_len,
            None,
            self.limits.max_episode_tokens,
        )
        self.last_ids = kept
        self.seen.append(canonical(reply))
        return kept
