"""Tool calling the way the ecosystem does it: typed Python functions as tools, calls in the
Hermes / Qwen format, `tool` role results, and a base environment that runs them between turns.

- A tool is a typed Python function with a Google-style docstring; its JSON schema (what chat
  templates take as `tools=`) comes from `transformers.utils.get_json_schema`.
- `ToolRegistry` holds tools by name and runs a call: arguments are checked against the schema,
  and every failure (unknown tool, bad arguments, the tool raising) comes back as an error text
  the model can read, never as an exception.
- `parse_tool_calls` reads the calls of an assistant message: its `tool_calls` field when present,
  else every `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block of its text (a last
  block left open, its closing tag cut as a stop string, counts too). A block that is not valid
  JSON is a call with a parse error, answered with that error.
- `template_supports_tools(tokenizer)` tells whether a chat template renders `tools=` at all
  (SmolLM2's does not); `with_tools_in_system_prompt` then writes the tools into the system
  message in the Hermes format instead.
- `ToolEnvironment`: each turn, an assistant message that calls tools gets the results as the
  observation (`tool` messages, the episode goes on); a message without calls is the final reply,
  scored by the subclass's `score`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.data.tokenize import encode_prompt
from posttrain.environments.interface import EnvStepResult, EpisodeStart, Message, last_assistant_content

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of a typed function with a Google-style docstring (`transformers.utils.get_json_schema`):
    `{"type": "function", "function": {"name", "description", "parameters": {...}}}`."""
    from transformers.utils import get_json_schema

    return get_json_schema(fn)


@dataclass
class ToolCall:
    """One call parsed from an assistant message. `error` is set when the call could not be read
    (bad JSON, no name); such a call is answered with the error instead of being run."""

    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    error: str | None = None


@dataclass
class ToolResult:
    """What a call returned (`content`, text for the model) and whether it failed; `invalid`: it
    failed before running (unreadable, unknown tool, arguments that do not fit the schema)."""

    call: ToolCall
    content: str
    error: bool = False
    invalid: bool = False

    def message(self) -> Message:
        """The `tool` message: {"role": "tool", "name", "content"} (+ "tool_call_id" when the call had an id)."""
        message: Message = {"role": "tool", "name": self.call.name or "unknown", "content": self.content}
        if self.call.id is not None:
            message["tool_call_id"] = self.call.id
        return message


def _call_from_json(data: Any, call_id: str | None = None) -> ToolCall:
    """A `ToolCall` from a decoded `{"name": ..., "arguments": {...}}` (arguments may be a JSON string;
    `parameters` is accepted for `arguments`, as some models write)."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return ToolCall(None, id=call_id, error='a tool call must be a JSON object with a "name" string')
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(data["name"], id=call_id, error=f"the arguments are not valid JSON ({e})")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCall(data["name"], id=call_id, error='"arguments" must be a JSON object')
    return ToolCall(data["name"], arguments, id=call_id)


def parse_tool_calls(message: Message) -> list[ToolCall]:
    """The tool calls of an assistant message, in order: its `tool_calls` field if it has one
    (`[{"id", "type": "function", "function": {"name", "arguments"}}]`), else the
    `<tool_call>…</tool_call>` blocks of its content. [] when it calls nothing.

    A block's call is the JSON value it begins with; text after that value is ignored (small
    models often close one brace too many: `{"name": "f", "arguments": {}}}`)."""
    structured = message.get("tool_calls")
    if structured:
        return [_call_from_json(c.get("function", c), c.get("id")) for c in structured]
    calls = []
    for block in _TOOL_CALL.findall(message.get("content") or ""):
        try:
            data, _ = json.JSONDecoder().raw_decode(block.strip())
        except json.JSONDecodeError as e:
            calls.append(ToolCall(None, error=f"the tool call is not valid JSON ({e})"))
            continue
        calls.append(_call_from_json(data))
    return calls


def called_a_tool(log: list[Message]) -> bool:
    """Whether an assistant turn after the task's question (the last user message) called a tool: how a
    verdict on a finished transcript (an agent's episode, whose calls the agent ran) knows the episode
    used the tool. Calls in worked examples before the question do not count."""
    start = max((i for i, m in enumerate(log) if m.get("role") == "user"), default=-1)
    return any(m.get("role") == "assistant" and parse_tool_calls(m) for m in log[start + 1 :])


def _type_error(value: Any, schema: dict[str, Any]) -> str | None:
    """Why `value` does not fit a parameter's JSON schema type (None when it does, or no type is given)."""
    types = schema.get("type")
    if types is None:
        return None
    types = [types] if isinstance(types, str) else list(types)
    if schema.get("nullable"):
        types.append("null")
    for t in types:
        allowed = _JSON_TYPES.get(t, (object,))
        if isinstance(value, allowed) and not (t in ("integer", "number") and isinstance(value, bool)):
            return None
    return f"must be of type {' or '.join(types)}, got {type(value).__name__} {json.dumps(value)[:50]}"


class ToolRegistry:
    """Tools by name: `ToolRegistry([calculator])`, or `@registry.register` on a function.

    `call` checks the arguments against the schema (required ones present, no unknown ones, JSON
    types), runs the function and returns a `ToolResult`; it never raises. A result that is not a
    string is written as JSON; results longer than `max_result_chars` are cut.
    """

    def __init__(self, tools: Iterable[Callable[..., Any]] = (), *, max_result_chars: int = 2000) -> None:
        self.max_result_chars = max_result_chars
        self._functions: dict[str, Callable[..., Any]] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        for fn in tools:
            self.register(fn)

    def register(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Add a tool (usable as a decorator); its name is the function's name."""
        schema = tool_schema(fn)
        name = schema["function"]["name"]
        if name in self._functions:
            raise ValueError(f"a tool named {name!r} is already registered")
        self._functions[name], self._schemas[name] = fn, schema
        return fn

    @property
    def names(self) -> list[str]:
        """Tool names, in registration order."""
        return list(self._functions)

    def schemas(self) -> list[dict[str, Any]]:
        """The JSON schemas, in registration order (the chat template's `tools=`)."""
        return [self._schemas[n] for n in self._functions]

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    def __len__(self) -> int:
        return len(self._functions)

    def argument_error(self, call: ToolCall) -> str | None:
        """Why the call's arguments do not fit the tool's schema, or None."""
        parameters = self._schemas[call.name]["function"].get("parameters", {})
        properties = parameters.get("properties", {})
        missing = [p for p in parameters.get("required", []) if p not in call.arguments]
        if missing:
            return f"missing argument(s) {', '.join(missing)}"
        unknown = [a for a in call.arguments if a not in properties]
        if unknown:
            return f"unknown argument(s) {', '.join(unknown)}; {call.name} takes {', '.join(properties) or 'none'}"
        for name, value in call.arguments.items():
            problem = _type_error(value, properties[name])
            if problem:
                return f"argument {name} {problem}"
        return None

    def call(self, call: ToolCall) -> ToolResult:
        """Run one call; every failure is an error result ("Error: ..."), never an exception."""
        if call.error is not None:
            return ToolResult(call, f"Error: {call.error}", error=True, invalid=True)
        if call.name not in self._functions:
            unknown = f"Error: unknown tool {call.name!r}; available: {', '.join(self.names)}"
            return ToolResult(call, unknown, error=True, invalid=True)
        problem = self.argument_error(call)
        if problem:
            return ToolResult(call, f"Error: {problem}", error=True, invalid=True)
        try:
            value = self._functions[call.name](**call.arguments)
        except Exception as e:  # the model reads the error and may try again
            return ToolResult(call, f"Error: {type(e).__name__}: {e}"[: self.max_result_chars], error=True)
        content = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(content) > self.max_result_chars:
            content = content[: self.max_result_chars] + " ...[truncated]"
        return ToolResult(call, content)


def tools_system_prompt(schemas: Sequence[dict[str, Any]]) -> str:
    """The tools written out for a system message, in the Hermes / Qwen format that
    `parse_tool_calls` reads, for chat templates that ignore `tools=`."""
    listing = "\n".join(json.dumps(s) for s in schemas)
    return (
        "# Tools\n\n"
        "You may call functions to help you answer. Their signatures are listed within <tools></tools>:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "To call a function, write a JSON object with its name and arguments within "
        "<tool_call></tool_call> tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
        "The result comes back in the next message."
    )


def with_tools_in_system_prompt(
    messages: Sequence[Message], schemas: Sequence[dict[str, Any]]
) -> list[Message]:
    """The messages with the tools described in the system message (appended to an existing
    one, or in a new one first). For chat templates without tool support."""
    prompt = tools_system_prompt(schemas)
    messages = [dict(m) for m in messages]
    if messages and messages[0].get("role") == "system":
        messages[0]["content"] = f"{messages[0].get('content') or ''}\n\n{prompt}".lstrip()
        return messages
    return [{"role": "system", "content": prompt}, *messages]


def _probe_tool(query: str) -> str:
    """Look something up.

    Args:
        query: what to look up
    """
    return query


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders `tools=`: a conversation rendered with a probe
    tool differs from the same one without. False without a chat template, or when the template
    raises on tools."""
    if getattr(tokenizer, "chat_template", None) is None:
        return False
    messages = [{"role": "user", "content": "Hello"}]
    try:
        plain = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        with_tools = tokenizer.apply_chat_template(
            messages, tools=[tool_schema(_probe_tool)], tokenize=False, add_generation_prompt=True
        )
    except Exception:
        return False
    return plain != with_tools


def tools_for_template(tokenizer: Any, start: EpisodeStart) -> EpisodeStart:
    """The start as the chat template can show it: tools offered to a template that ignores `tools=`
    (SmolLM2's) are written into the system message instead (`with_tools_in_system_prompt`)."""
    if not start.tools or template_supports_tools(tokenizer):
        return start
    messages = with_tools_in_system_prompt(start.messages, start.tools)
    return dataclasses.replace(start, messages=messages, tools=None)


def prompt_ids_of(tokenizer: Any, start: EpisodeStart) -> list[int]:
    """The prompt's token ids: the first messages (and tools) under the chat template."""
    return encode_prompt(tokenizer, start.messages, tools=start.tools)


_THINK_TAG = re.compile(r"</?think>", re.IGNORECASE)


def malformed_thinking(text: str) -> bool:
    """Whether an assistant message's `<think>` block is malformed. Well formed: no thinking tag at
    all; or one `<think>` at the start (after whitespace) closed by one `</think>`; or one `</think>`
    alone (the chat template opened the block in the prompt). Anything else is malformed: an
    unclosed block (reasoning cut short), several blocks, a block after the answer began, a stray
    `<think>` (NeMo RL's malformed_thinking: thinking tags where they do not belong)."""
    tags = [m.group(0).lower() for m in _THINK_TAG.finditer(text)]
    if not tags or tags == ["</think>"]:
        return False
    return tags != ["<think>", "</think>"] or bool(text[: _THINK_TAG.search(text).start()].strip())


def first_turn_prefix(tool_choice: str, tools: ToolRegistry) -> str:
    """The response prefix that makes the first turn follow `tool_choice` (see `ToolEnvironment`)."""
    if tool_choice == "auto":
        return ""
    if tool_choice == "required":
        return TOOL_CALL_OPEN + "\n"
    if tool_choice not in tools:
        names = [schema["function"]["name"] for schema in tools.schemas()]
        raise ValueError(
            f"tool_choice must be 'auto', 'required' or a tool's name {names}, got {tool_choice!r}"
        )
    return TOOL_CALL_OPEN + "\n" + '{"name": ' + json.dumps(tool_choice) + ', "arguments": {'


class ToolEnvironment:
    """Base for environments where the model may call tools before its final reply.

    Each turn, per sample: if the last assistant message calls tools (`parse_tool_calls`), they
    are run and their `tool` messages are the observation (one message, or a list when the turn
    made several calls), reward 0, the episode goes on; a call that cannot be parsed or run is
    answered with its error. A message without calls is the final reply: `score(reply, metadata)`
    gives its reward and info, and the episode ends. A turn whose calls would exceed
    `max_tool_calls` in the episode is not run: the episode ends and that reply is scored as final.

    Subclasses implement `score` and build episodes with `start(messages, metadata)` in their
    `reset`. Metadata keeps "tool_calls" and "tool_errors" (counts so far in the episode).

    Args:
        tools: the tools offered.
        max_tool_calls: calls allowed per episode.
        stop_at_tool_call: end a turn's generation at `</tool_call>` so that the result comes
            back before the model goes on (one call per turn); False allows several per turn.
        system_prompt: a system message to begin each episode with (None: the template's default).
        tools_in_system_prompt: write the tools into the system message (`with_tools_in_system_prompt`)
            and offer no `tools=` schemas, for chat templates that ignore `tools=` (SmolLM2; see
            `template_supports_tools`).
        tool_choice: the first turn, as chat APIs' `tool_choice` for a first request: "auto" (the model
            decides), "required" (the turn begins with the tool-call tag, so the model writes a
            call's JSON) or a tool's name (the turn begins with that call's opening,
            `<tool_call>\n{"name": NAME, "arguments": {`, so the model writes the arguments). The
            forced text is the episode's response prefix, not generated; later turns start free.
            For a model that never opens a call by itself.
        examples: worked examples as chat turns (e.g. a user question, an assistant tool call, the
            `tool` result, the final answer), put after the system prompt and before the task's
            first message: a small model copies a demonstrated call far more often than it follows
            a described format.
        describe_tools: offer the tools' schemas (as `tools=`, or in the system prompt for templates
            that ignore it). False offers none: the `examples` or the `system_prompt` must show
            the call format (a schema costs a small model ~100 prompt tokens per tool, and
            SmolLM2-135M copies the schema's JSON instead of writing a call).
    """

    def __init__(
        self,
        tools: ToolRegistry,
        *,
        max_tool_calls: int = 4,
        stop_at_tool_call: bool = True,
        tools_in_system_prompt: bool = False,
        system_prompt: str | None = None,
        tool_choice: str = "auto",
        examples: Sequence[Message] | None = None,
        describe_tools: bool = True,
    ) -> None:
        self.tools = tools
        self.examples = [dict(m) for m in examples or ()]
        self.describe_tools = describe_tools
        self.max_tool_calls = max_tool_calls
        self.stop_strings: tuple[str, ...] = (TOOL_CALL_CLOSE,) if stop_at_tool_call else ()
        self.tools_in_system_prompt = tools_in_system_prompt
        self.system_prompt = system_prompt
        self.first_prefix = first_turn_prefix(tool_choice, tools)

    def start(self, messages: list[Message], metadata: dict[str, Any]) -> EpisodeStart:
        """An episode that offers this environment's tools (as `tools=` schemas or in the system
        prompt), after `system_prompt` and the `examples` when they are set."""
        metadata = {**metadata, "tool_calls": 0, "tool_errors": 0}
        messages = [*copy.deepcopy(self.examples), *messages]
        if self.system_prompt is not None:
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        tools: list[dict[str, Any]] | None = self.tools.schemas() if self.describe_tools else None
        if self.tools_in_system_prompt and tools:
            messages, tools = with_tools_in_system_prompt(messages, self.tools.schemas()), None
        return EpisodeStart(
            list(messages),
            metadata,
            tools=tools,
            stop_strings=self.stop_strings,
            response_prefix=self.first_prefix,
        )

    def score(self, reply: str, metadata: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """The reward of the final reply and info to log (e.g. {"correct": True}). Subclasses implement it."""
        raise NotImplementedError

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        """Each sample's turn (`_turn`); flags: invalid_tool_call when a call of the turn could not be
        run (`ToolResult.invalid`), malformed_thinking by `malformed_thinking` of the message."""
        turns = [self._turn(log, meta) for log, meta in zip(message_logs, metadata, strict=True)]
        replies = [last_assistant_content(log) for log in message_logs]
        return EnvStepResult(
            rewards=[t[0] for t in turns],
            observations=[t[1] for t in turns],
            done=[t[2] for t in turns],
            metadata=[t[3] for t in turns],
            info=[t[4] for t in turns],
            stop_strings=[None if t[2] else self.stop_strings for t in turns],
            response_prefixes=[None if t[2] or not self.first_prefix else "" for t in turns],
            invalid_tool_call=[t[5] for t in turns],
            malformed_thinking=[malformed_thinking(reply) for reply in replies],
        )

    def _turn(
        self, log: list[Message], meta: dict[str, Any]
    ) -> tuple[float, Message | list[Message] | None, bool, dict[str, Any], dict[str, Any], bool]:
        """One sample's turn: (reward, observation, done, new metadata, info, invalid tool call: a
        call of the turn could not be run)."""
        message = next((m for m in reversed(log) if m.get("role") == "assistant"), {})
        calls = parse_tool_calls(message)
        used, errors = meta.get("tool_calls", 0), meta.get("tool_errors", 0)
        over_budget = used + len(calls) > self.max_tool_calls
        if calls and not over_budget:
            results = [self.tools.call(c) for c in calls]
            turn_errors = sum(r.error for r in results)
            new_meta = {**meta, "tool_calls": used + len(calls), "tool_errors": errors + turn_errors}
            info = {"tool_calls": len(calls), "tool_errors": turn_errors, "called_tool": True}
            messages = [r.message() for r in results]
            invalid = any(r.invalid for r in results)
            return 0.0, messages[0] if len(messages) == 1 else messages, False, new_meta, info, invalid
        info: dict[str, Any] = {
            "tool_calls": 0,
            "tool_errors": 0,
            "called_tool": used > 0 or called_a_tool(log),
        }
        info["tool_budget_exhausted"] = bool(calls)
        try:
            reward, score_info = self.score(message.get("content") or "", meta)
        except Exception as e:  # one sample's scoring failure scores it 0; the batch goes on
            reward, score_info = 0.0, {"verifier_error": f"exception: {type(e).__name__}: {e}"[:500]}
        return float(reward), None, True, dict(meta), {**info, **score_info}, False

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        """`env/tool_errors` (failed calls this turn); over the episodes that ended: `env/tool_call_rate`
        (share that called a tool), `env/reward_mean`, `env/tool_budget_exhausted_rate`, and
        `env/accuracy` when `score` reports "correct"."""
        metrics = {"env/tool_errors": float(sum(i.get("tool_errors", 0) for i in results.info))}
        ended = [(r, i) for r, i, d in zip(results.rewards, results.info, results.done, strict=True) if d]
        if ended:
            n = len(ended)
            metrics["env/tool_call_rate"] = sum(bool(i.get("called_tool")) for _, i in ended) / n
            metrics["env/reward_mean"] = sum(r for r, _ in ended) / n
            metrics["env/tool_budget_exhausted_rate"] = (
                sum(bool(i.get("tool_budget_exhausted")) for _, i in ended) / n
            )
            if any("correct" in i for _, i in ended):
                metrics["env/accuracy"] = sum(bool(i.get("correct")) for _, i in ended) / n
        return metrics
