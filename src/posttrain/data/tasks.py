"""RL tasks: a dataset row becomes a task, its messages plus every other field as metadata.

A task is a plain dict. Its "messages" (a list of chat messages) start the episode; every other
field goes to the environment as metadata (`posttrain.environments.task_start`). Where the
messages come from:

- a row with a `messages_key` list: those messages (the system prompt is prepended when the row
  has none);
- otherwise the row's `problem_key` field rendered by `prompt_template` (`{problem}` is that field;
  any other `{name}` is the row's field of that name), after the system prompt if one is set;
- either way, worked examples (`example_turns`: user/assistant messages) go after the system
  message and before the row's own messages;
- an environment that makes its own tasks (`DatasetConfig.environment_tasks`): the environment's
  `generate_tasks(size, seed)` returns them, and its `reset` builds each episode's first messages.

When the row has the `answer_key` field, `task["answer"]` is the ground truth read by
`answer_format` (plain, GSM8K's "####", MATH's last \\boxed{}), which is what the math
environment checks.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from typing import Any

from posttrain.config.common import DatasetConfig
from posttrain.data.math import read_answer
from posttrain.data.sources import DataError, Row, load_rows

Task = dict[str, Any]
RequiredFields = tuple[str, tuple[str, ...]]
"""(environment name, the task fields it needs): what `build_tasks` checks every row for."""


def row_messages(
    row: Row,
    cfg: DatasetConfig,
    prompt_template: str,
    system_prompt: str | None,
    example_turns: Sequence[dict] = (),
) -> list[dict]:
    """The first messages of the row's episode (see the module docstring)."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    examples = [dict(m) for m in example_turns]
    given = row.data.get(cfg.messages_key)
    if isinstance(given, list):
        if not all(isinstance(m, dict) and "role" in m and "content" in m for m in given):
            raise DataError(f"{row.where}: {cfg.messages_key!r} must be a list of {{role, content}} messages")
        own = [dict(m) for m in given]
        leading = next((i for i, m in enumerate(own) if m["role"] != "system"), len(own))
        if any(m["role"] == "system" for m in own):
            system = []
        return [*system, *own[:leading], *examples, *own[leading:]]
    if cfg.problem_key not in row.data:
        raise DataError(
            f"{row.where}: missing key {cfg.problem_key!r} (or a {cfg.messages_key!r} list); the row has "
            f"keys: {', '.join(row.data)}. Set data.<split>.problem_key to the prompt's column"
        )
    fields = {**row.data, "problem": row.data[cfg.problem_key]}
    try:
        content = prompt_template.format_map(fields)
    except KeyError as e:
        raise DataError(
            f"{row.where}: data.prompt_template names the field {e.args[0]!r}, which the row does not "
            f"have (keys: {', '.join(row.data)})"
        ) from None
    return [*system, *examples, {"role": "user", "content": content}]


def row_task(
    row: Row,
    cfg: DatasetConfig,
    prompt_template: str,
    system_prompt: str | None,
    example_turns: Sequence[dict] = (),
) -> Task:
    """One dataset row as a task: "messages" plus every other field of the row."""
    task = {k: v for k, v in row.data.items() if k != cfg.messages_key}
    task["messages"] = row_messages(row, cfg, prompt_template, system_prompt, example_turns)
    if cfg.answer_key in row.data and row.data[cfg.answer_key] is not None:
        task["answer"] = read_answer(row, cfg)
    return task


def check_required_fields(task: Task, row: Row, cfg: DatasetConfig, required: RequiredFields) -> None:
    """Raise `DataError` (file, row, field) when the task lacks a field its environment needs.

    `required` is (environment name, its `required_fields`); a field that is None counts as missing.
    The ground truth "answer" is read from the row's `answer_key` column, so the message names that."""
    name, fields = required
    for key in fields:
        if task.get(key) is not None:
            continue
        column = cfg.answer_key if key == "answer" else key
        needs = f"needs as {key!r}" if column != key else "needs"
        hint = "; set data.<split>.answer_key to the column that holds it" if key == "answer" else ""
        raise DataError(
            f"{row.where}: missing field {column!r}, which the {name} environment {needs} "
            f"(the row has keys: {', '.join(row.data) or 'none'}){hint}"
        )


def build_tasks(
    cfg: DatasetConfig,
    *,
    prompt_template: str = "{problem}",
    system_prompt: str | None = None,
    example_turns: Sequence[dict] = (),
    environment: Any = None,
    required: RequiredFields | None = None,
) -> list[Task]:
    """The tasks of one dataset split: from its rows, or generated by `environment` (an instance or
    class with `generate_tasks`) when `cfg.environment_tasks` is set. With `required` (environment
    name, field names), every row is checked for those fields (`check_required_fields`)."""
    if cfg.environment_tasks is not None:
        return generated_tasks(cfg, environment)
    tasks = []
    for row in load_rows(cfg):
        tasks.append(row_task(row, cfg, prompt_template, system_prompt, example_turns))
        if required:
            check_required_fields(tasks[-1], row, cfg, required)
    if not tasks:
        raise DataError(f"no rows in {cfg.path or cfg.reasoning_gym}")
    return tasks


def generated_tasks(cfg: DatasetConfig, environment: Any) -> list[Task]:
    """`environment.generate_tasks(size, seed)` (and `split=` when the config sets one), checked to be
    a list of dicts."""
    spec = cfg.environment_tasks
    assert spec is not None
    generate = getattr(environment, "generate_tasks", None)
    if generate is None:
        name = getattr(environment, "__name__", type(environment).__name__)
        raise DataError(
            f"data.<split>.environment_tasks is set but the environment {name} has no generate_tasks(); "
            "use a dataset (path or reasoning_gym) instead"
        )
    if spec.split is not None and "split" not in inspect.signature(generate).parameters:
        raise DataError(
            f"data.<split>.environment_tasks.split={spec.split!r} is set but "
            f"{getattr(environment, '__name__', type(environment).__name__)}.generate_tasks takes no split; "
            "remove it"
        )
    extra = {} if spec.split is None else {"split": spec.split}
    tasks = list(generate(spec.size, spec.seed, **extra))
    if not tasks or not all(isinstance(t, dict) for t in tasks):
        raise DataError(f"{getattr(environment, '__name__', environment)}.generate_tasks must return dicts")
    return tasks[: cfg.max_samples] if cfg.max_samples else tasks


def tasks_within(tasks: list[Task], tokenizer: Any, max_prompt_len: int) -> list[Task]:
    """The tasks whose prompt (messages under the chat template) has at most `max_prompt_len` tokens.

    Tasks without "messages" (the environment's reset makes them) are kept: their prompt length is
    known only once the episode starts, where an over-long prompt is an error."""
    from posttrain.data.tokenize import encode_prompt

    kept = [
        t
        for t in tasks
        if "messages" not in t
        or len(encode_prompt(tokenizer, t["messages"], tools=t.get("tools"))) <= max_prompt_len
    ]
    if tasks and not kept:
        raise DataError(
            f"every prompt is longer than {max_prompt_len} tokens (policy.max_seq_len - "
            "generation.max_new_tokens); raise policy.max_seq_len"
        )
    return kept


def prompt_key(task: Task) -> str | None:
    """What makes two tasks the same problem for the model: their first messages (system prompt,
    worked examples and the question), as text; None for a task whose environment makes them."""
    messages = task.get("messages")
    return None if messages is None else json.dumps(messages, sort_keys=True)


def without_held_out(train: list[Task], held_out: list[Task]) -> tuple[list[Task], int]:
    """`train` without the tasks whose prompt (`prompt_key`) is a `held_out` task's, and how many
    were dropped. Tasks without messages are kept (their prompts exist only once an episode starts).
    Raises DataError when nothing is left."""
    seen = {k for k in map(prompt_key, held_out) if k is not None}
    kept = [t for t in train if prompt_key(t) is None or prompt_key(t) not in seen]
    if train and not kept:
        raise DataError(
            f"every one of the {len(train)} training tasks is also a validation task: nothing is left to "
            "train on once the held-out problems are removed. Draw the splits from different data, or set "
            "data.exclude_validation_from_train=false to train on the validation problems (the validation "
            "score then measures memory, not generalisation)"
        )
    return kept, len(train) - len(kept)
