"""The OpenAI-compatible endpoint's logic, apart from HTTP: sessions, chat completions, rewards.

A session is one episode (`open_session(id, recorder)`); the HTTP routes (`posttrain.endpoint.server`)
call `chat_completions(session_id, body)`, `responses(session_id, body)` and `post_reward(session_id,
body)`. A chat completion request is checked (`n` = 1, no streaming, `top_logprobs` 0: the generator
records only the sampled token's logprob), its prompt ids come from the session's `EpisodeRecorder`
(token in, token out), the reply is generated through the `GenerationQueue`, recorded, and returned with
its content and `tool_calls` parsed by the session's tool-call parser.

Sampling: with `request_sampling` false (training) every request samples from the run's distribution
(temperature, top_p, top_k), which the policy loss assumes; true: a request's `temperature` / `top_p`
apply. `max_tokens` (or `max_completion_tokens`) is capped by the run's `max_new_tokens` and the
episode's room. Stop strings: the run's, the request's `stop`, and, when the request offers `tools`
(and `tool_choice` is not "none") with `stop_at_tool_call`, the parser's call close (`</tool_call>`).
As in OpenAI's API, returned text ends before a matched stop string of the request or the run (the
token ids recorded keep everything generated).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from posttrain.endpoint.batching import GenerationQueue
from posttrain.endpoint.parsers import ToolCallParser
from posttrain.endpoint.recorder import EpisodeOver, EpisodeRecorder, HistoryEdited
from posttrain.generation.sampling import SamplingParams


class APIError(Exception):
    """An error answered as OpenAI does: HTTP `status` and {"error": {"message", "type", "code"}}."""

    def __init__(
        self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type_, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}}


@dataclass
class Session:
    """One episode's state: its recorder, a reward the agent posted, and what went wrong."""

    recorder: EpisodeRecorder
    parser: ToolCallParser
    lock: threading.Lock = field(default_factory=threading.Lock)
    posted_reward: float | None = None
    posted_info: dict[str, Any] = field(default_factory=dict)
    history_edited: str | None = None
    requests: int = 0


def _stop_list(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise APIError(400, "stop must be a string or a list of strings")


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """(text before the first of `stops` it contains, whether one was found)."""
    hits = [text.find(s) for s in stops if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)


def _check_supported(body: dict[str, Any]) -> None:
    """400 for what the endpoint does not do (several choices, streaming, alternatives' logprobs)."""
    if body.get("n", 1) != 1:
        raise APIError(400, "n must be 1: each sample of a group is its own session", code="unsupported")
    if body.get("stream"):
        raise APIError(400, "stream is not supported", code="unsupported")
    if body.get("top_logprobs"):
        raise APIError(
            400,
            "top_logprobs > 0 is not supported: the generator records only the sampled token's logprob",
            code="unsupported",
        )
    if not isinstance(body.get("messages"), list):
        raise APIError(400, "messages must be a list of chat messages")


class AgentEndpoint:
    """Sessions and the chat-completions / responses / reward operations over a `GenerationQueue`.

    Args:
        tokenizer: the policy's tokenizer (its chat template renders prompts and observations).
        queue: where replies are generated.
        defaults: the run's sampling (temperature, top_p, top_k, max_new_tokens, stop strings, seed).
        request_sampling: let a request's temperature / top_p apply (False in training).
        stop_at_tool_call: stop a reply at the parser's call close when the request offers tools.
        model_name: the model id reported back (requests may name any model).
    """

    def __init__(
        self,
        tokenizer: Any,
        queue: GenerationQueue,
        defaults: SamplingParams,
        *,
        request_sampling: bool = False,
        stop_at_tool_call: bool = True,
        model_name: str = "posttrain-policy",
    ) -> None:
        self.tokenizer, self.queue, self.defaults = tokenizer, queue, defaults
        self.request_sampling, self.stop_at_tool_call, self.model_name = (
            request_sampling,
            stop_at_tool_call,
            model_name,
        )
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open_session(self, session_id: str, session: Session) -> None:
        with self._lock:
            if session_id in self.sessions:
                raise ValueError(f"session {session_id!r} is already open")
            self.sessions[session_id] = session

    def close_session(self, session_id: str) -> Session:
        with self._lock:
            return self.sessions.pop(session_id)

    def session(self, session_id: str) -> Session:
        with self._lock:
            if session_id not in self.sessions:
                raise APIError(404, f"no open session {session_id!r}", code="session_not_found")
            return self.sessions[session_id]

    def sampling(self, body: dict[str, Any], stops: tuple[str, ...], room: int) -> SamplingParams:
        """The request's sampling: the run's, its max_tokens capped by max_new_tokens and `room`."""
        limit = body.get("max_completion_tokens", body.get("max_tokens")) or self.defaults.max_new_tokens
        if not isinstance(limit, int) or limit <= 0:
            raise APIError(400, "max_tokens must be a positive integer")
        update: dict[str, Any] = {
            "max_new_tokens": min(limit, self.defaults.max_new_tokens, room),
            "stop_strings": tuple(dict.fromkeys(self.defaults.stop_strings + stops)),
        }
        if self.request_sampling:
            for key in ("temperature", "top_p"):
                if body.get(key) is not None:
                    update[key] = float(body[key])
        return dataclasses.replace(self.defaults, **update)

    def chat_completions(self, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """One OpenAI chat completion in the session's episode (see the module docstring)."""
        _check_supported(body)
        session = self.session(session_id)
        with session.lock:
            return self._complete(session, body)

    def _complete(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        tools, choice = body.get("tools") or None, body.get("tool_choice", "auto")
        use_tools = tools is not None and choice != "none"
        prefix = session.parser.forced_prefix(choice) if use_tools else ""
        stops = _stop_list(body.get("stop"))
        call_stop = (
            (session.parser.call_close,)
            if use_tools and self.stop_at_tool_call and session.parser.call_close
            else ()
        )
        recorder = session.recorder
        session.requests += 1
        try:
            prompt = recorder.prompt(body["messages"], tools, prefix)
        except HistoryEdited as e:
            session.history_edited = str(e)
            raise APIError(400, str(e), code="history_edited") from None
        except EpisodeOver as e:
            raise APIError(400, str(e), code="episode_over") from None
        params = self.sampling(body, stops + call_stop, recorder.room())
        ids, logprobs, truncated = self.queue.generate(prompt, params)
        ids = ids[: params.max_new_tokens]
        text = prefix + self.tokenizer.decode(ids, skip_special_tokens=True)
        text, stopped = cut_at_stop(text, tuple(self.defaults.stop_strings) + stops)
        content, calls = session.parser.parse(text) if use_tools else (text, [])
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        kept = recorder.record(ids, logprobs, truncated, message)
        finish = "tool_calls" if calls else "length" if truncated and not stopped else "stop"
        choice_out: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": finish,
            "logprobs": None,
        }
        if body.get("logprobs"):
            choice_out["logprobs"] = {"content": self.token_logprobs(kept, logprobs[: len(kept)])}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice_out],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(kept),
                "total_tokens": len(prompt) + len(kept),
            },
        }

    def token_logprobs(self, ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
        """OpenAI's per-token logprobs of the generated tokens (no alternatives: `top_logprobs` [])."""
        out = []
        for token_id, logprob in zip(ids, logprobs, strict=True):
            token = self.tokenizer.decode([token_id])
            out.append(
                {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []}
            )
        return out

    def post_reward(self, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Record the reward the agent posts for its episode: {"reward": number, "info": {...}}."""
        reward = body.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise APIError(400, 'the body must be {"reward": <number>, "info": {...}}')
        info = body.get("info") or {}
        if not isinstance(info, dict):
            raise APIError(400, "info must be an object")
        session = self.session(session_id)
        with session.lock:
            session.posted_reward, session.posted_info = float(reward), dict(info)
        return {"ok": True}

    def responses(self, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """One Responses API call (`/v1/responses`) in the session's episode: its `instructions`,
        `input` items (messages, `function_call`, `function_call_output`) and flat `tools` become a chat
        request over the same recorder; the reply comes back as output items."""
        if body.get("stream"):
            raise APIError(400, "stream is not supported", code="unsupported")
        chat = {
            "messages": responses_messages(body),
            "tools": [chat_tool(t) for t in body.get("tools") or []] or None,
            "tool_choice": body.get("tool_choice", "auto"),
            "max_tokens": body.get("max_output_tokens"),
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
        }
        session = self.session(session_id)
        with session.lock:
            out = self._complete(session, chat)
        return response_object(out, self.model_name)


def _text_parts(content: Any) -> str:
    if isinstance(content, str) or content is None:
        return content or ""
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def responses_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a Responses API request: `instructions` as the system message, then its
    `input` (a string: one user message); a `function_call` item joins the assistant message before it."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise APIError(400, "input must be a string or a list of items")
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _text_parts(item.get("content"))})
        elif kind == "function_call":
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": ""})
            call = {"id": item.get("call_id"), "type": "function"}
            call["function"] = {"name": item.get("name"), "arguments": item.get("arguments")}
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": _text_parts(item.get("output")),
                }
            )
        elif kind != "reasoning":
            raise APIError(400, f"input items of type {kind!r} are not supported", code="unsupported")
    return messages


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses API tool ({"type": "function", "name", "description", "parameters"}) in chat format."""
    if tool.get("type") != "function":
        raise APIError(400, f"tools of type {tool.get('type')!r} are not supported", code="unsupported")
    if "function" in tool:
        return tool
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


def response_object(chat: dict[str, Any], model: str) -> dict[str, Any]:
    """A chat completion as a Responses API `response`: a message item (when there is text) and a
    `function_call` item per tool call; status "incomplete" when cut at max_output_tokens."""
    choice = chat["choices"][0]
    message, items = choice["message"], []
    if message.get("content"):
        text = {"type": "output_text", "text": message["content"], "annotations": []}
        items.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        )
    for call in message.get("tool_calls") or []:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    cut = choice["finish_reason"] == "length"
    usage = chat["usage"]
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": chat["created"],
        "model": model,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": items,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
