"""Tokenizer loading with a pad token guaranteed, and the chat template a run trains with.

`policy.chat_template` (eval: `chat_template`) sets or replaces the tokenizer's template: a Jinja
string (it contains `{{` or `{%`), the path of a file holding one, or `plain` (no template: turns
are concatenated, assistant turns end with EOS). A tokenizer without a template (a base model) and
no such key is a config error naming the key, never a silent fallback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.errors import UserError

PLAIN = "plain"
"""The `chat_template` value that trains without a template (turns concatenated)."""


class ChatTemplateError(UserError, ValueError):
    """A chat template that is missing or cannot be read; the message names the key to set."""


def load_tokenizer(name_or_path: str, chat_template: str | None = None) -> Any:
    """The tokenizer of `name_or_path` with a pad token (EOS when it has none); `chat_template`
    (see the module docstring) replaces its template when given."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template is not None:
        tokenizer.chat_template = read_chat_template(chat_template)
    return tokenizer


def read_chat_template(value: str, key: str = "policy.chat_template") -> str | None:
    """The Jinja text a `chat_template` setting names: the string itself when it holds Jinja
    (`{{` or `{%`), None for `plain`, else the contents of the file it names."""
    if value == PLAIN:
        return None
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ChatTemplateError(
            f"{key}={value!r} is neither a Jinja template (it has no '{{{{' or '{{%') nor a file; "
            "give the template's text, the path of a .jinja file, or 'plain'"
        )
    text = path.read_text()
    if "{{" not in text and "{%" not in text:
        raise ChatTemplateError(f"{key}: {path} holds no Jinja template (no '{{{{' or '{{%')")
    return text


def require_chat_template(tokenizer: Any, source: str, chat_template: str | None, key: str) -> None:
    """Raise `ChatTemplateError` when the tokenizer has no template and `chat_template` is not set:
    the user says which template a base model's conversations are rendered with."""
    if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
        raise ChatTemplateError(
            f"the tokenizer of {source} has no chat template (a base model?); set {key} to a Jinja "
            f"template or a .jinja file (e.g. {key}=template.jinja), or {key}={PLAIN} to concatenate "
            "turns without role markers"
        )


def training_tokenizer(source: str, chat_template: str | None, run_dir: Path, key: str) -> tuple[Any, str]:
    """(tokenizer, the path workers load it from) for a run.

    Without `chat_template`: the tokenizer of `source` (it must have a template) and `source`.
    With it: the tokenizer with that template, saved to `<run_dir>/tokenizer` so that every worker
    and every checkpoint renders conversations with the same template."""
    tokenizer = load_tokenizer(source, chat_template)
    require_chat_template(tokenizer, source, chat_template, key)
    if chat_template is None:
        return tokenizer, source
    folder = run_dir / "tokenizer"
    tokenizer.save_pretrained(folder)
    return tokenizer, str(folder)
