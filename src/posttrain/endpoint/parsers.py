"""Tool-call parsers: a chat template's tool-call text <-> OpenAI `tool_calls`, one per template family.

A parser reads the text a model generated (special tokens removed) and returns the reply's content
and its calls as OpenAI's `tool_calls` (`[{"id", "type": "function", "function": {"name",
"arguments": <JSON text>}}]`). Registered parsers (`TOOL_CALL_PARSERS`, `get_tool_call_parser`):

- `hermes` (also `qwen`: Qwen2.5 / Qwen3 and SmolLM2 use it): `<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>` blocks; the content is the text before the first block. A last block left open
  (its closing tag was the stop string) counts. A block whose JSON does not decode to an object with a
  "name" string is no call: the text stays in the content.
- `llama3_json`: Llama 3.1 / 3.2's JSON tool calls: the whole reply is `{"name": ..., "parameters":
  {...}}` (or several such objects separated by ";"), optionally after `<|python_tag|>`; any other
  reply is plain content.

`forced_prefix(tool_choice)` is the text that makes a turn follow `tool_choice` ("required" or a named
function) in the parser's format (`posttrain.environments.tools.first_turn_prefix` for Hermes);
`call_close` is a stop string that ends a call (Hermes: `</tool_call>`), so that the tool result comes
back before the model goes on.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from posttrain.environments.tools import _TOOL_CALL, TOOL_CALL_CLOSE, TOOL_CALL_OPEN


class ToolCallParser(Protocol):
    """Reads tool calls out of generated text (`parse`) and writes a forced call opening (`forced_prefix`)."""

    call_close: str | None

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]: ...

    def forced_prefix(self, tool_choice: Any) -> str: ...

    def render_calls(self, calls: list[dict[str, Any]]) -> str: ...


def openai_tool_call(index: int, name: str, arguments: Any) -> dict[str, Any]:
    """One OpenAI `tool_calls` entry; `arguments` as JSON text (a string is kept as written)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {
        "id": f"call_{index}_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


def _named_call(data: Any, arguments_key: str) -> tuple[str, Any] | None:
    """(name, arguments) of a decoded `{"name": str, <arguments_key>: ...}`; None when it is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    return data["name"], data.get(arguments_key, data.get("arguments", data.get("parameters", {})))


def _call_json(call: dict[str, Any], arguments_key: str) -> str:
    """`{"name": ..., <arguments_key>: {...}}` of an OpenAI tool call (its arguments decoded when JSON)."""
    function = call.get("function") or call
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return json.dumps({"name": function.get("name"), arguments_key: arguments}, ensure_ascii=False)


def _choice_name(tool_choice: Any) -> str | None:
    """The function a `tool_choice` names ({"type": "function", "function": {"name"}} or a bare name)."""
    if isinstance(tool_choice, dict):
        return (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
    return None


@dataclass(frozen=True)
class HermesParser:
    """`<tool_call>{json}</tool_call>` blocks (Hermes, Qwen, SmolLM2)."""

    call_close: str | None = TOOL_CALL_CLOSE

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content before the first call or the whole text, calls); content None when empty."""
        calls = []
        for block in _TOOL_CALL.findall(text):
            try:
                data, _ = json.JSONDecoder().raw_decode(block.strip())
            except json.JSONDecodeError:
                return text or None, []
            call = _named_call(data, "arguments")
            if call is None:
                return text or None, []
            calls.append(openai_tool_call(len(calls), *call))
        content = text.split(TOOL_CALL_OPEN, 1)[0].strip() if calls else text
        return content or None, calls

    def forced_prefix(self, tool_choice: Any) -> str:
        """ "" for "auto"/"none"; the tag for "required"; the call's opening up to its arguments for a name."""
        name = _choice_name(tool_choice)
        if name is not None:
            return TOOL_CALL_OPEN + "\n" + '{"name": ' + json.dumps(name) + ', "arguments": {'
        return TOOL_CALL_OPEN + "\n" if tool_choice == "required" else ""

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        """The calls as the model writes them: one `<tool_call>` block each."""
        return "\n".join(f"{TOOL_CALL_OPEN}\n{_call_json(c, 'arguments')}\n{TOOL_CALL_CLOSE}" for c in calls)


PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class Llama3JsonParser:
    """Llama 3.1 / 3.2 JSON calls: the whole reply is `{"name", "parameters"}` objects joined by ";"."""

    call_close: str | None = None

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(None, calls) when the whole reply is calls; (text, []) otherwise."""
        body = text.strip().removeprefix(PYTHON_TAG).strip()
        calls, decoder = [], json.JSONDecoder()
        while body.startswith("{"):
            try:
                data, end = decoder.raw_decode(body)
            except json.JSONDecodeError:
                return text or None, []
            call = _named_call(data, "parameters")
            if call is None:
                return text or None, []
            calls.append(openai_tool_call(len(calls), *call))
            body = body[end:].strip().removeprefix(";").strip()
        return (None, calls) if calls and not body else (text or None, [])

    def forced_prefix(self, tool_choice: Any) -> str:
        """The object's opening for a named function; "" otherwise (a forced call cannot be begun
        without a name in this format)."""
        name = _choice_name(tool_choice)
        return '{"name": ' + json.dumps(name) + ', "parameters": {' if name is not None else ""

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        """The calls as the model writes them: JSON objects joined by "; "."""
        return "; ".join(_call_json(c, "parameters") for c in calls)


TOOL_CALL_PARSERS: dict[str, ToolCallParser] = {
    "hermes": HermesParser(),
    "qwen": HermesParser(),
    "llama3_json": Llama3JsonParser(),
}


def get_tool_call_parser(name: str) -> ToolCallParser:
    """The registered parser `name`; ValueError naming the registered ones otherwise."""
    if name not in TOOL_CALL_PARSERS:
        raise ValueError(
            f"unknown tool-call parser {name!r}; registered: {', '.join(sorted(TOOL_CALL_PARSERS))}"
        )
    return TOOL_CALL_PARSERS[name]


def register_tool_call_parser(name: str, parser: ToolCallParser) -> None:
    """Add a parser under `name` (for a template posttrain does not know)."""
    if name in TOOL_CALL_PARSERS:
        raise ValueError(f"a tool-call parser named {name!r} is already registered")
    TOOL_CALL_PARSERS[name] = parser
