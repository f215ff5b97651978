"""One RL run over several environments (`environments`, posttrain.config.multienv): the tasks of its
sources, each tagged with its environment's name (`task_name`); a batch that mixes them, rolled out
environment by environment and put back in input order (`mixed_rollouts`); and the metrics per
environment (`<name>/...`, `val/<name>/...`) beside the overall ones.

Each environment's episodes run exactly as in a run over that environment alone: its own worker
group, turn limits, observation cap, episode token budget, turn barrier and agent. The environments of
a batch run one after another (each its own generation calls), so a step takes about the sum of its
environments' rollout times for their shares of the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from posttrain.algorithms.metrics import pass_at_k, scored_reward_metrics
from posttrain.config.common import DatasetConfig
from posttrain.config.multienv import TASK_NAME, TaskSourceConfig, source_counts, task_sources
from posttrain.config.rollout import EnvironmentConfig
from posttrain.data.batching import MixtureSampler
from posttrain.data.sources import DataError, Row, load_rows
from posttrain.data.tasks import Task, check_required_fields, row_task, tasks_within, without_held_out
from posttrain.data.trajectory import Trajectory
from posttrain.environments.interface import EpisodeStart, resolve_environment
from posttrain.rollout.rollout import Rollouts, episode_metrics
from posttrain.rollout.tasks import load_tasks


class SourceTasks(NamedTuple):
    """The tasks of a run over several environments: `train`, every source's training tasks laid end
    to end in source order (`sizes[i]` of source i, `names[i]`), without the held-out problems;
    `validation`, every source's held-out tasks; `dropped`, how many training tasks were held-out
    problems (data.exclude_validation_from_train). Every task has its environment in `task_name`."""

    train: list[Task]
    validation: list[Task]
    dropped: int
    sizes: list[int]
    names: list[str]


def source_tasks(
    data: Any, environments: dict[str, EnvironmentConfig], *, tokenizer: Any, max_prompt_len: int
) -> SourceTasks:
    """The tasks of an RL config's `data` section over its named `environments` (`task_sources`:
    data.sources, or data.train whose rows name their environments), prompts over `max_prompt_len`
    tokens dropped and, with data.exclude_validation_from_train, no training task whose prompt is any
    source's validation task's."""
    sources = task_sources(data)

    def load(source: TaskSourceConfig, split: DatasetConfig) -> list[Task]:
        return source_split_tasks(
            source, split, environments, tokenizer=tokenizer, max_prompt_len=max_prompt_len
        )

    validation = [t for s in sources.values() if s.validation is not None for t in load(s, s.validation)]
    train, dropped = [], 0
    for source in sources.values():
        tasks = load(source, source.train)
        if data.exclude_validation_from_train and validation:
            tasks, n = without_held_out(tasks, validation)
            dropped += n
        train.append(tasks)
    return SourceTasks(
        [t for ts in train for t in ts], validation, dropped, [len(ts) for ts in train], list(sources)
    )


def source_split_tasks(
    source: TaskSourceConfig,
    split: DatasetConfig,
    environments: dict[str, EnvironmentConfig],
    *,
    tokenizer: Any,
    max_prompt_len: int,
) -> list[Task]:
    """One split of a source as tasks, each with its environment's name in `task_name`: generated
    splits (environment_tasks, reasoning_gym) belong to the source's environment; a file's rows to the
    one their `task_name` names, else the source's (`row_environment`)."""
    prompt = {
        "prompt_template": source.prompt_template,
        "system_prompt": source.system_prompt,
        "tokenizer": tokenizer,
        "max_prompt_len": max_prompt_len,
    }
    if split.path is None:
        assert source.environment is not None  # checked with the config (check_source)
        tasks = load_tasks(
            split, environments[source.environment], example_turns=source.example_turns, **prompt
        )
        return [{**t, TASK_NAME: source.environment} for t in tasks]
    examples = [turn.model_dump() for turn in source.example_turns]
    tasks = []
    for row in load_rows(split):
        task = row_task(row, split, source.prompt_template, source.system_prompt, examples)
        name = row_environment(row, task, source.environment, environments)
        fields = tuple(getattr(resolve_environment(environments[name].name), "required_fields", ()))
        if fields:
            check_required_fields(task, row, split, (environments[name].name, fields))
        tasks.append({**task, TASK_NAME: name})
    if not tasks:
        raise DataError(f"no rows in {split.path}")
    return tasks_within(tasks, tokenizer, max_prompt_len)


def batch_sampler(tasks: SourceTasks, data: Any, prompts_per_step: int, *, seed: int) -> MixtureSampler:
    """Every batch's prompts from the sources, `source_counts` of their weights each."""
    weights = [s.weight for s in task_sources(data).values()]
    counts = source_counts(weights, prompts_per_step)
    names = [f"data.sources.{name}" for name in tasks.names]
    return MixtureSampler(tasks.sizes, counts, seed=seed, names=names)


class EnvironmentSet:
    """The worker groups of a run's named environments (`groups[name]`): `reset` starts each task's
    episode with the environment its `task_name` names (results in input order); `shutdown` closes
    them all."""

    def __init__(self, groups: dict[str, Any]) -> None:
        self.groups = groups

    def reset(self, tasks: list[Task], seeds: list[int]) -> list[EpisodeStart]:
        starts: list[Any] = [None] * len(tasks)
        for name, group in self.groups.items():
            where = [i for i, t in enumerate(tasks) if t.get(TASK_NAME) == name]
            if where:
                own = group.reset([tasks[i] for i in where], [seeds[i] for i in where])
                for i, start in zip(where, own, strict=True):
                    starts[i] = start
        missing = [i for i, s in enumerate(starts) if s is None]
        if missing:
            raise ValueError(f"tasks {missing} name no environment of {sorted(self.groups)} in {TASK_NAME!r}")
        return starts

    def shutdown(self) -> None:
        for group in self.groups.values():
            group.shutdown()


def row_environment(row: Row, task: Task, default: str | None, environments: dict[str, Any]) -> str:
    """The environment of a row's task: its `task_name` field, else `default` (the source's); a
    `DataError` naming the file and row when it names none or one that is not in `environments`."""
    name = task.get(TASK_NAME)
    if name is None:
        name = default
    if name is None:
        raise DataError(
            f"{row.where}: no {TASK_NAME!r} field, and its source names no environment: give each row "
            f"the name of its environment (one of {sorted(environments)}) in {TASK_NAME!r}, or set "
            "data.sources.<name>.environment"
        )
    if name not in environments:
        raise DataError(
            f"{row.where}: {TASK_NAME}={name!r} is not one of the run's environments {sorted(environments)}; "
            "name one of them, or add it to `environments`"
        )
    return str(name)


def mixed_rollouts(
    tasks: list[Task],
    run: Callable[[str, list[Task]], Rollouts],
    *,
    names: Sequence[str],
    first_group_id: int,
) -> Rollouts:
    """The rollouts of a batch of tasks of several environments: `run(name, tasks)` rolls out each
    environment's tasks (in `names` order; numbering groups from `first_group_id`, G trajectories per
    task, as `run_rollouts`); the result holds every task's trajectories in input order, task i's
    under group id first_group_id + i, each with its environment in `task_name`. Metrics: each
    environment's own as `<name>/<key>` and the episode metrics of the whole batch."""
    positions: dict[str, list[int]] = {name: [] for name in names}
    for i, task in enumerate(tasks):
        name = task.get(TASK_NAME)
        if name not in positions:
            raise ValueError(f"task {i} has {TASK_NAME}={name!r}, not one of the environments {list(names)}")
        positions[name].append(i)
    per_task: list[list[Trajectory]] = [[] for _ in tasks]
    metrics: dict[str, float] = {}
    for name, where in positions.items():
        if not where:
            continue
        out = run(name, [tasks[i] for i in where])
        for t in out.trajectories:
            i = where[t.group_id - first_group_id]
            t.group_id, t.task_name = first_group_id + i, name
            per_task[i].append(t)
        metrics.update({f"{name}/{k}": v for k, v in out.env_metrics.items()})
    trajectories = [t for ts in per_task for t in ts]
    return Rollouts(trajectories, {**metrics, **episode_metrics(trajectories)})


def environment_batch_metrics(rollouts: Rollouts, names: Sequence[str]) -> dict[str, float]:
    """Per environment of a training batch: `<name>/share`, its part of the batch's trajectories, and
    `<name>/reward/mean` and `/reward/std` over its scored episodes (the environment's reward, before
    any shaping); an environment with no episode in the batch: share 0 and nothing else."""
    n = max(len(rollouts.trajectories), 1)
    metrics = {}
    for name in names:
        keep = [i for i, t in enumerate(rollouts.trajectories) if t.task_name == name]
        metrics[f"{name}/share"] = len(keep) / n
        if keep:
            own = rollouts.select(keep)
            metrics.update(
                {f"{name}/{k}": v for k, v in scored_reward_metrics(own.rewards, own.scored).items()}
            )
    return metrics


def held_out_metrics(rollouts: Rollouts, n: int) -> dict[str, float]:
    """accuracy (an episode's info["correct"], else reward >= 1), reward (the scored episodes' mean),
    response_length, and pass@n for n > 1, of validation rollouts with n samples per task in a row."""
    correct = [bool(t.info.get("correct", t.reward >= 1.0)) for t in rollouts.trajectories]
    metrics = {
        "accuracy": sum(correct) / len(correct),
        "reward": scored_reward_metrics(rollouts.rewards, rollouts.scored)["reward/mean"],
        "response_length": float(rollouts.response_lengths.mean()),
    }
    if n > 1:
        per_task = [sum(correct[i : i + n]) for i in range(0, len(correct), n)]
        metrics[f"pass@{n}"] = sum(pass_at_k(n, c, n) for c in per_task) / len(per_task)
    return metrics


def environment_validation_metrics(rollouts: Rollouts, n: int, names: Sequence[str]) -> dict[str, float]:
    """`val/<name>/...` for each environment with held-out tasks: its `held_out_metrics` and its own
    environment metrics (`<name>/env/...` of `mixed_rollouts`)."""
    metrics = {}
    for name in names:
        keep = [i for i, t in enumerate(rollouts.trajectories) if t.task_name == name]
        if keep:
            own = held_out_metrics(rollouts.select(keep), n)
            metrics.update({f"val/{name}/{k}": v for k, v in own.items()})
    prefixes = tuple(f"{name}/env/" for name in names)
    metrics.update({f"val/{k}": v for k, v in rollouts.env_metrics.items() if k.startswith(prefixes)})
    return metrics
