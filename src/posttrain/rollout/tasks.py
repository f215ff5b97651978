"""A dataset split's RL tasks, with the environment that may generate them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from posttrain.config.common import DatasetConfig
from posttrain.config.rollout import EnvironmentConfig
from posttrain.data.tasks import Task, build_tasks, tasks_within, without_held_out
from posttrain.environments.interface import make_environment, resolve_environment


def load_tasks(
    split: DatasetConfig,
    environment: EnvironmentConfig,
    *,
    prompt_template: str,
    system_prompt: str | None,
    tokenizer: Any,
    max_prompt_len: int,
    example_turns: Sequence[Any] = (),
) -> list[Task]:
    """The split's tasks (its rows, or the environment's `generate_tasks` for `environment_tasks`),
    without those whose prompt is longer than `max_prompt_len` tokens. Every row must have the fields
    that the environment class declares in `required_fields` (a `DataError` names file, row, field).
    `example_turns` (dicts or `ChatTurn`s) go between the system prompt and each row's messages."""
    maker = make_environment(environment.name, **environment.kwargs) if split.environment_tasks else None
    fields = tuple(getattr(resolve_environment(environment.name), "required_fields", ()))
    try:
        tasks = build_tasks(
            split,
            prompt_template=prompt_template,
            system_prompt=system_prompt,
            example_turns=[_message(m) for m in example_turns],
            environment=maker,
            required=(environment.name, fields) if fields else None,
        )
    finally:
        getattr(maker, "close", lambda: None)()
    return tasks_within(tasks, tokenizer, max_prompt_len)


def _message(turn: Any) -> dict:
    return turn.model_dump() if hasattr(turn, "model_dump") else dict(turn)


class SplitTasks(NamedTuple):
    """An RL run's tasks: `train` without the held-out problems, `validation`, and `dropped`, how many
    training tasks were validation problems (removed when data.exclude_validation_from_train)."""

    train: list[Task]
    validation: list[Task]
    dropped: int


def rl_tasks(data: Any, environment: EnvironmentConfig, *, tokenizer: Any, max_prompt_len: int) -> SplitTasks:
    """The tasks of an RL config's `data` section (`GRPODataConfig`): both splits with the same
    prompt (template, system prompt, worked examples), prompts over `max_prompt_len` tokens dropped,
    and, with `data.exclude_validation_from_train`, no training task whose prompt is a validation
    task's (`without_held_out`)."""

    def load(split: DatasetConfig) -> list[Task]:
        return load_tasks(
            split,
            environment,
            prompt_template=data.prompt_template,
            system_prompt=data.system_prompt,
            example_turns=data.example_turns,
            tokenizer=tokenizer,
            max_prompt_len=max_prompt_len,
        )

    train = load(data.train)
    validation = load(data.validation) if data.validation is not None else []
    dropped = 0
    if data.exclude_validation_from_train and validation:
        train, dropped = without_held_out(train, validation)
    return SplitTasks(train, validation, dropped)
