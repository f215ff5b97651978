"""HumanEval-shaped code tasks, generated offline: a typed `def` signature and a docstring that states
the task and gives `>>>` examples; the model completes the function (issue #32 item 3).

Each template (`DOCSTRING_TEMPLATES`) holds a description, a reference body and input makers; a task
draws a function name, the template's constants, 2-3 example inputs (shown in the docstring) and
hidden inputs (the template's edge cases: empty input, negatives, duplicates, unicode or whitespace
where they apply, and 3 more random inputs). The prompt is the signature with its docstring, given
to the model exactly as `HUMANEVAL_PROMPT` gives HumanEval's (`code.humaneval_tasks`); it is also the task's `prelude`,
so a reply holding only the body continues it, as on HumanEval. Every expected value is computed by
running the template's reference (prompt + body) on the host, never typed by hand; the tests are
plain `assert f(args) == <value>` statements (`abs(f(args) - <value>) < 1e-06` for floats), decided
on the host (`code_checks.host_checks`). The tests beyond the examples always hold >= 2 distinct
expected values, so no reply that answers the examples from a table and a constant otherwise passes.

Splits: "heldout" is the templates of `HELDOUT_TEMPLATES` (none of them in "train"); None, all.
No function name is a HumanEval entry point and no prompt shares 8 consecutive words with a
HumanEval prompt (`tests/unit/test_code_docstring.py` checks every template over several seeds).
"""

from __future__ import annotations

import copy
import functools
import random
import re
import string
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

from posttrain.environments.code_docstring_inputs import Args, DocTemplate
from posttrain.environments.code_docstring_numbers import list_templates, number_templates
from posttrain.environments.code_docstring_text import dict_templates, string_templates

SPLITS = ("train", "heldout")
EXAMPLES = (2, 3)  # how many `>>>` examples a docstring shows (drawn)
HIDDEN_RANDOM = 3  # random hidden inputs beside the template's edge cases
FLOAT_TOL = 1e-06
HUMANEVAL_PROMPT = (
    "Complete the following Python function. Reply with the whole function in a ```python code block.\n\n"
    "```python\n{prompt}```"
)
"""The user message of a HumanEval problem (`code.humaneval_tasks`) and of a docstring task alike."""


DOCSTRING_TEMPLATES: dict[str, DocTemplate] = {
    t.key: t for t in (*string_templates(), *list_templates(), *dict_templates(), *number_templates())
}
HELDOUT_TEMPLATES = frozenset(
    {
        "encode_runs",
        "mirror_text",
        "fit_width",
        "longest_rising_run",
        "zip_merge",
        "window_totals",
        "merge_counts",
        "key_of_largest",
        "collatz_length",
        "label_number",
    }
)


# ----------------------------------------------------------------------------- tasks
def templates_of(split: str | None) -> list[DocTemplate]:
    """The templates a split draws from: "train", "heldout" (`HELDOUT_TEMPLATES`) or None (all)."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown docstring split {split!r}; use one of {SPLITS} or None")
    return [
        t
        for t in DOCSTRING_TEMPLATES.values()
        if split is None or (t.key in HELDOUT_TEMPLATES) == (split == "heldout")
    ]


def _substitute(text: str, constants: dict[str, Any]) -> str:
    return string.Template(text).substitute({k: repr(v) for k, v in constants.items()})


def _signature_imports(template: DocTemplate) -> str:
    names = sorted(set(re.findall(r"\b(Dict|List|Optional|Tuple)\b", template.signature + template.returns)))
    return f"from typing import {', '.join(names)}\n\n\n" if names else "\n\n"


def _call(name: str, args: Args) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def docstring_prompt(
    template: DocTemplate, name: str, constants: dict[str, Any], examples: list[tuple[Args, Any]]
) -> str:
    """The HumanEval-shaped prompt: typing imports, the signature, the docstring with its examples."""
    doc = textwrap.fill(
        _substitute(template.doc, constants), width=92, break_long_words=False, break_on_hyphens=False
    )
    lines = [f"def {name}({template.signature}) -> {template.returns}:"]
    lines += ['    """' + textwrap.indent(doc, "    ").lstrip()]
    for args, expected in examples:
        lines += [f"    >>> {_call(name, args)}", f"    {expected!r}"]
    return _signature_imports(template) + "\n".join(lines) + '\n    """\n'


def reference_body(template: DocTemplate, constants: dict[str, Any]) -> str:
    """The template's reference body for these constants, indented to continue the prompt."""
    return textwrap.indent(textwrap.dedent(_substitute(template.body, constants)).strip() + "\n", "    ")


@functools.lru_cache(maxsize=4096)
def _compiled(source: str, name: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"__name__": "docstring_reference"}
    exec(compile(source, f"<reference {name}>", "exec"), namespace)  # our own template text, not a model's
    return namespace[name]


def reference_function(template: DocTemplate, name: str, constants: dict[str, Any]) -> Callable[..., Any]:
    """The reference solution as a host function (prompt without examples + reference body)."""
    return _compiled(
        docstring_prompt(template, name, constants, []) + reference_body(template, constants), name
    )


def _test(name: str, args: Args, expected: Any, close: bool) -> str:
    if close:
        return f"assert abs({_call(name, args)} - {expected!r}) < {FLOAT_TOL!r}"
    return f"assert {_call(name, args)} == {expected!r}"


def _draw_inputs(template: DocTemplate, rng: random.Random, fn: Callable[..., Any]) -> tuple[list, list]:
    """(examples, hidden): (args, expected) pairs, all inputs distinct; the hidden ones are the edge
    cases and HIDDEN_RANDOM random inputs, redrawn until they hold >= 2 distinct expected values."""
    seen: set[str] = set()

    def fresh(count: int, limit: int = 200) -> list[tuple[Args, Any]]:
        out = []
        for _ in range(limit):
            if len(out) == count:
                break
            args = template.make_args(rng)
            if repr(args) not in seen:
                seen.add(repr(args))
                out.append((args, fn(*copy.deepcopy(args))))
        return out

    examples = fresh(rng.choice(EXAMPLES))
    edges = [(a, fn(*copy.deepcopy(a))) for a in template.edge if repr(a) not in seen]
    seen.update(repr(a) for a, _ in edges)
    for _ in range(50):
        hidden = edges + fresh(HIDDEN_RANDOM)
        if len({repr(v) for _, v in hidden}) >= 2:
            return examples, hidden
        seen.difference_update(repr(a) for a, _ in hidden[len(edges) :])
    raise RuntimeError(f"template {template.key}: hidden tests with one expected value only")


def docstring_task(
    template: DocTemplate, name: str, constants: dict[str, Any], rng: random.Random
) -> dict[str, Any]:
    """One task of `template` for the function `name` with these constants, its inputs drawn from `rng`."""
    examples, hidden = _draw_inputs(template, rng, reference_function(template, name, constants))
    prompt = docstring_prompt(template, name, constants, examples)
    spec = ",".join(f"{k}={v!r}" for k, v in sorted(constants.items()))
    return {
        "messages": [{"role": "user", "content": HUMANEVAL_PROMPT.format(prompt=prompt)}],
        "entry_point": name,
        "tests": [_test(name, a, v, template.close) for a, v in examples + hidden],
        "prelude": prompt,
        "test_setup": "",
        "task_id": f"docstring/{template.key}/{name}" + (f"/{spec}" if spec else ""),
    }


def generate_docstring_tasks(count: int, seed: int, split: str | None = None) -> list[dict[str, Any]]:
    """`count` HumanEval-shaped tasks drawn from `seed` (offline) from the templates of `split`
    ("train", "heldout" or None: all)."""
    return [task for task, _ in _draw_tasks(count, seed, split)]


def generate_docstring_solutions(
    count: int, seed: int, split: str | None = None
) -> list[tuple[dict[str, Any], str]]:
    """The tasks of `generate_docstring_tasks(count, seed, split)`, each with its reference solution:
    the prompt's imports and `def` line, then the template's reference body (no docstring). For an
    SFT warm start (`examples/code_transcripts.py`); a reply of it in a python block scores 1."""
    return list(_draw_tasks(count, seed, split))


def _draw_tasks(count: int, seed: int, split: str | None) -> Iterator[tuple[dict[str, Any], str]]:
    rng = random.Random(seed)
    templates = templates_of(split)
    for _ in range(count):
        template = rng.choice(templates)
        name, constants = rng.choice(template.names), template.constants(rng)
        task = docstring_task(template, name, constants, rng)
        header = task["prelude"].split('    """', 1)[0]
        yield task, header + reference_body(template, constants)
