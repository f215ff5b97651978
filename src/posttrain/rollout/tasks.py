"""A dataset split's RL tasks, with the environment that may generate them."""

from __future__ import annotations

from typing import Any

from posttrain.config.schema import DatasetConfig, EnvironmentConfig
from posttrain.data.tasks import Task, build_tasks, tasks_within
from posttrain.environments.interface import make_environment, resolve_environment


def load_tasks(
    split: DatasetConfig,
    environment: EnvironmentConfig,
    *,
    prompt_template: str,
    system_prompt: str | None,
    tokenizer: Any,
    max_prompt_len: int,
) -> list[Task]:
    """The split's tasks (its rows, or the environment's `generate_tasks` for `environment_tasks`),
    without those whose prompt is longer than `max_prompt_len` tokens. Every row must have the fields
    that the environment class declares in `required_fields` (a `DataError` names file, row, field)."""
    maker = make_environment(environment.name, **environment.kwargs) if split.environment_tasks else None
    fields = tuple(getattr(resolve_environment(environment.name), "required_fields", ()))
    try:
        tasks = build_tasks(
            split,
            prompt_template=prompt_template,
            system_prompt=system_prompt,
            environment=maker,
            required=(environment.name, fields) if fields else None,
        )
    finally:
        getattr(maker, "close", lambda: None)()
    return tasks_within(tasks, tokenizer, max_prompt_len)
