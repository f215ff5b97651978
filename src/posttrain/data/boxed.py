"""Reading `\\boxed{}` answers out of text: the last box (`extract_last_boxed`) and every box
(`boxed_contents`), braces balanced. Pure string parsing, shared by the datasets' answer reader
(`posttrain.data.math`) and the environments that read a reply's answer (`posttrain.environments.math`)."""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def extract_last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced; None if absent.

    Nested braces are matched (`\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`), escaped braces `\\{ \\}`
    are skipped, and a last box left unclosed (a truncated completion) gives None.
    """
    end = len(text)
    while True:
        start = max(text.rfind(cmd, 0, end) for cmd in _BOX_COMMANDS)
        if start < 0:
            return None
        i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
        while i < len(text) and text[i].isspace():
            i += 1
        if i < len(text) and text[i] == "{":
            break
        end = start  # `\boxed` without a brace (prose, `\boxed 5`): look at the box before it
    return _braced(text, i)


def _braced(text: str, i: int) -> str | None:
    """The stripped content of the brace group opening at `text[i]` ("{"); None if it never closes."""
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
        j += 1
    return None


_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed_contents(text: str) -> list[str | None]:
    """Every `\\boxed{…}` / `\\fbox{…}` of `text` in order (nested ones too): its stripped content, or
    None for a box left unclosed."""
    return [_braced(text, m.end() - 1) for m in _BOX_OPEN.finditer(text)]
