"""One RL run over several environments: the named environments (`environments`), the sources of
tasks with their sampling weights (`data.sources`), how weights become each batch's prompt counts
(`source_counts`), and the checks the RL configs run on them (`check_environments`).

A run names either one environment (`environment`, every recipe before this) or several
(`environments: {math: {...}, calculator: {...}}`, each an `EnvironmentConfig` of its own). Each task
then belongs to one of them: its row's `task_name` field names it (NeMo RL's key), or its source's
`environment` does. See docs/environments.md, "One run, many environments".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from pydantic import Field, model_validator

from posttrain.config.common import ChatTurn, DatasetConfig, Strict, check_example_turns
from posttrain.config.rollout import EnvironmentConfig

TASK_NAME = "task_name"
"""The task field that names a task's environment (NeMo RL's key)."""

RESERVED_NAMES = frozenset(
    {
        "advantages", "agent", "async", "critic", "dapo", "distill", "env", "episode", "grpo", "logprob_error",
        "logps", "loss", "ppo", "refit", "reinforce_ma", "returns", "reward", "rewards", "system", "timing",
        "train", "val",
    }
)  # fmt: skip
"""Environment names that would collide with the first segment of a logged metric (`<name>/...`)."""

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")

SOURCE_PROMPT_KEYS = ("train", "validation", "prompt_template", "system_prompt", "example_turns")
"""The `data` keys that each source of `data.sources` has of its own."""


class TaskSourceConfig(Strict):
    """One source of tasks of a run over several environments (`data.sources.<name>`): its training
    and held-out splits, the environment its tasks belong to, its share of every batch, and how its
    prompts are shown."""

    environment: str | None = Field(
        None,
        description="The environment (a key of `environments`) of this source's tasks whose row has no "
        "`task_name` field; null: every row must name its own in `task_name`. Required for generated "
        "tasks (`environment_tasks`: that environment generates them; `reasoning_gym`).",
    )
    weight: float = Field(
        1.0,
        gt=0,
        description="This source's share of each step's prompts: of P = <loop>.prompts_per_step prompts, "
        "source i gets floor(P·w_i/Σw) plus one more for the P − Σfloor sources with the largest "
        "remainders (ties: the source listed first); the same counts every step, and each must be at "
        "least 1. E.g. weights 1, 1, 1 with P = 8: 3, 3, 2.",
    )
    train: DatasetConfig = Field(description="The source's training split (required).")
    validation: DatasetConfig | None = Field(
        None,
        description="The source's held-out split, validated with each task's environment "
        "(val/<environment>/accuracy); null: none.",
    )
    prompt_template: str = Field("{problem}", description="Formats the user message of a row's task.")
    system_prompt: str | None = None
    example_turns: list[ChatTurn] = Field(
        default_factory=list,
        description="Worked examples before each row's messages (as data.example_turns); []: none.",
    )

    @model_validator(mode="after")
    def _examples(self) -> TaskSourceConfig:
        check_example_turns(self.example_turns, "data.sources.<name>.example_turns")
        generated = self.train.environment_tasks is not None
        if self.example_turns and generated:
            raise ValueError(
                "example_turns is set but train uses environment_tasks, whose episodes start from the "
                "environment's reset (the turns would never be shown); set example_turns=[]"
            )
        return self


def source_counts(weights: Sequence[float], total: int) -> list[int]:
    """How many of `total` prompts each source gives a batch (largest remainders, exact arithmetic):
    source i's quota is q_i = total·w_i/Σw; it gets floor(q_i), and the total − Σ floor(q_i) left go
    one each to the sources with the largest q_i − floor(q_i), the first listed on ties.

    >>> source_counts([1, 1, 1], 8), source_counts([2, 1, 1], 8), source_counts([5, 3, 2], 4)
    ([3, 3, 2], [4, 2, 2], [2, 1, 1])
    """
    if total < 0 or not weights or any(w <= 0 for w in weights):
        raise ValueError(f"source_counts needs positive weights and total >= 0, got {list(weights)}, {total}")
    exact = [Fraction(w) for w in weights]
    quotas = [total * w / sum(exact) for w in exact]
    counts = [int(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def task_sources(data: Any) -> dict[str, TaskSourceConfig]:
    """The sources of a run over several environments: `data.sources`, else one source "train" made of
    data.train and data.validation (rows that name their environment in `task_name`) with data's
    prompt settings."""
    if data.sources is not None:
        return dict(data.sources)
    return {
        "train": TaskSourceConfig(
            train=data.train,
            validation=data.validation,
            prompt_template=data.prompt_template,
            system_prompt=data.system_prompt,
            example_turns=data.example_turns,
        )
    }


def named_environment_entries(value: Any) -> Any:
    """`environments` as given, each mapping entry without a `name` named by its key
    (`environments: {sliding_puzzle: {kwargs: ...}}` is the sliding_puzzle environment)."""
    if not isinstance(value, dict):
        return value
    return {k: ({"name": k, **v} if isinstance(v, dict) and "name" not in v else v) for k, v in value.items()}


def drop_replaced_defaults(defaults: dict, user: dict) -> None:
    """Remove from a config's default mapping what a user's mapping replaces, so that a validator sees
    only the user's own: `environment` when the user names `environments`, and data's own splits and
    prompt settings (`SOURCE_PROMPT_KEYS`) when the user names `data.sources`."""
    if user.get("environments") is not None:
        defaults.pop("environment", None)
    data = user.get("data")
    if isinstance(data, dict) and data.get("sources") is not None and isinstance(defaults.get("data"), dict):
        for key in SOURCE_PROMPT_KEYS:
            defaults["data"].pop(key, None)


def check_sources_alone(data: Any) -> None:
    """`data.sources` replaces data's own splits and prompt settings: none of them may be set beside it."""
    if data.sources is None:
        return
    given = [key for key in SOURCE_PROMPT_KEYS if key in data.model_fields_set]
    if given:
        raise ValueError(
            f"data.sources is set, and so is data.{', data.'.join(given)}: each source has its own train, "
            "validation, prompt_template, system_prompt and example_turns; move them into the sources "
            "(data.sources.<name>.<key>) and remove them from data"
        )
    if not data.sources:
        raise ValueError("data.sources is empty: name at least one source, or remove the key")


def check_environments(cfg: Any, loop: str) -> None:
    """The checks of a run over several environments (`environments`; nothing to check without it):
    not beside `environment`, names usable in metric keys, every source's environment named and its
    share of a batch at least one prompt (`source_counts`), every environment given tasks."""
    named, sources = cfg.environments, cfg.data.sources
    if named is None:
        if sources is not None:
            raise ValueError(
                "data.sources assigns tasks to named environments, but `environments` is not set: name them "
                "(environments: {<name>: {name: ..., kwargs: ...}}; one entry is fine)"
            )
        return
    if "environment" in cfg.model_fields_set:
        raise ValueError(
            "both `environment` and `environments` are set: use `environment` for a run over one "
            "environment, or `environments` (several, each by name) and remove `environment`"
        )
    if not named:
        raise ValueError("environments is empty: name at least one environment, or use `environment`")
    for name in named:
        check_environment_name(name)
    by_source = task_sources(cfg.data)
    for source_name, source in by_source.items():
        check_source(f"data.sources.{source_name}" if sources is not None else "data", source, named)
    check_counts(by_source, getattr(cfg, loop).prompts_per_step, loop)
    check_all_used(by_source, named)


def check_environment_name(name: str) -> None:
    """An environment's name goes into metric keys (`<name>/reward/mean`, `val/<name>/accuracy`)."""
    if not _NAME.fullmatch(name) or name in RESERVED_NAMES:
        raise ValueError(
            f"environments.{name}: an environment's name starts metric keys (<name>/reward/mean, "
            "val/<name>/accuracy), so it must be letters, digits, '_' or '-' from a letter on, and not one of "
            f"{sorted(RESERVED_NAMES)}; rename it"
        )


def check_source(key: str, source: TaskSourceConfig, named: dict[str, EnvironmentConfig]) -> None:
    """The source's environment is a named one; generated tasks have one. `key`: the source's config
    key (data.sources.<name>, or data for data.train whose rows name their environments)."""
    if source.environment is not None and source.environment not in named:
        raise ValueError(
            f"{key}.environment={source.environment!r} is not one of the named environments "
            f"{sorted(named)}; name one of them, or add it to `environments`"
        )
    for split_name in ("train", "validation"):
        split = getattr(source, split_name)
        if split is not None and split.path is None and source.environment is None:
            raise ValueError(
                f"{key}.{split_name} generates its tasks (environment_tasks or reasoning_gym), which carry "
                f"no `{TASK_NAME}`: name the environment they belong to (data.sources.<name>.environment)"
            )


def check_counts(sources: dict[str, TaskSourceConfig], prompts: int, loop: str) -> None:
    """Every source gets at least one of the batch's prompts."""
    counts = source_counts([s.weight for s in sources.values()], prompts)
    for (name, source), count in zip(sources.items(), counts, strict=True):
        if count == 0:
            raise ValueError(
                f"data.sources.{name}.weight={source.weight} gives it 0 of the {prompts} prompts per step "
                f"({loop}.prompts_per_step; counts by source: {dict(zip(sources, counts, strict=True))}): "
                f"raise its weight or {loop}.prompts_per_step, or remove the source"
            )


def check_all_used(sources: dict[str, TaskSourceConfig], named: dict[str, EnvironmentConfig]) -> None:
    """When every source generates its tasks (rows of a file may name any environment), every named
    environment is one of theirs."""
    if any(s.train.path is not None for s in sources.values()):
        return  # rows name theirs: known once the data is read
    used = {s.environment for s in sources.values()}
    unused = sorted(set(named) - used)
    if unused:
        raise ValueError(
            f"environments {unused} get no tasks: no source of data.sources names them; add a source "
            "(data.sources.<name>.environment) or remove them"
        )


def without_unused_sections(config: Any, dumped: dict[str, Any]) -> dict[str, Any]:
    """An RL config's dump without the section it does not use: `environments` for a run over one
    environment (so such configs dump as before it existed), else `environment`."""
    dumped.pop("environments" if config.environments is None else "environment", None)
    return dumped


def without_unused_data_keys(data: Any, dumped: dict[str, Any]) -> dict[str, Any]:
    """A `data` section's dump without `sources` when it has none, else without the keys the sources
    replace (`SOURCE_PROMPT_KEYS`): config.yaml loads back as the config it records."""
    for key in ("sources",) if data.sources is None else SOURCE_PROMPT_KEYS:
        dumped.pop(key, None)
    return dumped
