"""The Python API: every command of the CLI as a function, for notebooks and scripts.

    import posttrain

    result = posttrain.grpo(
        {"policy": {"model_name": "smollm2-135m-instruct"}, "grpo": {"max_steps": 10}},
        train_data=[{"prompt": "What is 2 + 3?", "answer": "5"}, ...],
        reward_funcs=[my_reward],                 # TRL's shape: fn(prompts, completions, **fields)
        callbacks=[lambda step, metrics: print(step, metrics.get("env/reward_mean"))],
    )

What holds (docs/python_api.md names the test of each):
- `config` is a config object (`posttrain.GRPOConfig(...)`), a nested dict, the path of a YAML
  recipe, or None (the command's defaults); `overrides` are the CLI's dotted `key=value` strings.
  A dict, a recipe and overrides are validated exactly as `posttrain <command>` validates them
  (`posttrain.config.loader.config_from_data`): errors raise `ConfigError` with the CLI's message.
- `train_data` / `validation_data` (eval: `data`) may be a list of dicts or a `datasets.Dataset`.
  The rows are written to `<run_dir>/data/<split>-<hash>.jsonl` (`posttrain.data.memory`) and read
  by the same loaders as a file, so they are validated and reported as a file's rows are.
  `train_data` without `validation_data` (and no validation split in `config`) validates on nothing.
- `reward_funcs` (RL commands and eval): TRL-style reward functions, run by the `reward_funcs`
  environment (`posttrain.environments.reward_funcs`), summed with `reward_weights`.
- `callbacks`: each is called as `callback(step, metrics)` for every row the run logs (training
  metrics at step N; validation metrics at step N as a row of their own). An exception stops the run.
- The functions return the trainer's result (run_dir, step, history, last_checkpoint; eval: the
  summary and samples). A run directory with checkpoints resumes, as the CLI does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from posttrain.config.commands import COMMANDS
from posttrain.config.loader import SOURCE_KEYS, apply_overrides, config_from_data, load_yaml, validate

ConfigLike = BaseModel | Mapping[str, Any] | str | Path | None
Callback = Callable[[int, dict[str, float]], Any]


def make_config(
    command: str,
    config: ConfigLike = None,
    overrides: Sequence[str] = (),
    *,
    data: Mapping[str, Any] | None = None,
    reward_funcs: Sequence[Callable | str] | None = None,
    reward_weights: Sequence[float] | None = None,
) -> BaseModel:
    """The validated config of `command` (see the module docstring). `data` maps a split of the
    `data` section ("train", "validation"; eval: "dataset") to in-memory rows, written as JSONL
    into the run directory once the rest of the config is valid."""
    model = COMMANDS[command].config
    user, complete = _user_mapping(model, config)
    user = apply_overrides(user, list(overrides))
    if reward_funcs is not None:
        kwargs: dict[str, Any] = {"reward_funcs": list(reward_funcs)}
        if reward_weights is not None:
            kwargs["weights"] = list(reward_weights)
        user["environment"] = {**user.get("environment", {}), "name": "reward_funcs", "kwargs": kwargs}
    build = (lambda d: validate(model, d)) if complete else (lambda d: config_from_data(model, d))
    cfg = build(user)
    given = {split: rows for split, rows in (data or {}).items() if rows is not None}
    if not given:
        return cfg
    folder = _run_dir(command, cfg, user) / "data"
    from posttrain.data.memory import write_rows

    sections = dict(user.get("data") or {})
    for split, rows in given.items():
        kept = {k: v for k, v in (sections.get(split) or {}).items() if k not in SOURCE_KEYS}
        sections[split] = {**kept, "path": str(write_rows(rows, folder, split))}
    if complete and "train" in given:
        # as for a recipe: own training data, no foreign validation split or worked example
        if "validation" not in given and not _data_key_given(config, "validation"):
            sections["validation"] = None
        if "example_turns" in type(cfg.data).model_fields and not _data_key_given(config, "example_turns"):
            sections["example_turns"] = []
    return build({**user, "data": sections})


def _user_mapping(model: type[BaseModel], config: ConfigLike) -> tuple[dict, bool]:
    """(the user's nested mapping, whether it is complete): a config object is complete (its own
    defaults stand); a dict or recipe is merged onto the command's defaults, as the CLI does."""
    if config is None:
        return {}, False
    if isinstance(config, BaseModel):
        if not isinstance(config, model):
            raise TypeError(
                f"expected a {model.__name__} (or a dict or a recipe path), got {type(config).__name__}"
            )
        return config.model_dump(), True
    if isinstance(config, (str, Path)):
        return load_yaml(config), False
    if isinstance(config, Mapping):
        import copy

        return copy.deepcopy(dict(config)), False
    raise TypeError(f"config must be a config object, a dict or a recipe path, not {type(config).__name__}")


def _data_key_given(config: ConfigLike, key: str) -> bool:
    """Whether a config object set `data.<key>` itself (not the default's)."""
    data = getattr(config, "data", None)
    return (
        isinstance(config, BaseModel) and "data" in config.model_fields_set and key in data.model_fields_set
    )


def _run_dir(command: str, cfg: Any, user: dict) -> Path:
    """The run directory (eval: output directory) the trainer will use; when the config leaves it to
    the default, it is written into `user` so that the data folder and the run agree."""
    if command == "eval":
        chosen = cfg.output_dir or "runs/eval"
        user["output_dir"] = chosen
    else:
        chosen = cfg.logging.run_dir or f"runs/{command}"
        user["logging"] = {**user.get("logging", {}), "run_dir": chosen}
    return Path(chosen).expanduser()


@contextlib.contextmanager
def _callbacks(callbacks: Sequence[Callback]) -> Iterator[None]:
    from posttrain.logging.loggers import step_callbacks

    with step_callbacks(callbacks):
        yield


def _train(command: str, cfg: BaseModel, callbacks: Sequence[Callback] = ()) -> Any:
    """Run `command`'s entry point (`posttrain.config.commands.COMMANDS`) on `cfg`, step callbacks on."""
    with _callbacks(callbacks):
        return COMMANDS[command].run_function()(cfg)


def sft(
    config: ConfigLike = None,
    *,
    train_data: Any = None,
    validation_data: Any = None,
    callbacks: Sequence[Callback] = (),
    overrides: Sequence[str] = (),
) -> Any:
    """`posttrain sft`: rows in `messages` or prompt/response form. Returns a `RunResult`."""
    data = {"train": train_data, "validation": validation_data}
    return _train("sft", make_config("sft", config, overrides, data=data), callbacks)


def dpo(
    config: ConfigLike = None,
    *,
    train_data: Any = None,
    validation_data: Any = None,
    callbacks: Sequence[Callback] = (),
    overrides: Sequence[str] = (),
) -> Any:
    """`posttrain dpo`: rows with prompt, chosen, rejected. Returns a `RunResult`."""
    data = {"train": train_data, "validation": validation_data}
    return _train("dpo", make_config("dpo", config, overrides, data=data), callbacks)


def rm(
    config: ConfigLike = None,
    *,
    train_data: Any = None,
    validation_data: Any = None,
    callbacks: Sequence[Callback] = (),
    overrides: Sequence[str] = (),
) -> Any:
    """`posttrain rm`: a reward model on rows with prompt, chosen, rejected. Returns a `RunResult`."""
    data = {"train": train_data, "validation": validation_data}
    return _train("rm", make_config("rm", config, overrides, data=data), callbacks)


def _rl(
    command: str,
    config: ConfigLike,
    train_data: Any,
    validation_data: Any,
    reward_funcs: Sequence[Callable | str] | None,
    reward_weights: Sequence[float] | None,
    callbacks: Sequence[Callback],
    overrides: Sequence[str],
) -> Any:
    cfg = make_config(
        command,
        config,
        overrides,
        data={"train": train_data, "validation": validation_data},
        reward_funcs=reward_funcs,
        reward_weights=reward_weights,
    )
    return _train(command, cfg, callbacks)


def grpo(
    config: ConfigLike = None,
    *,
    train_data: Any = None,
    validation_data: Any = None,
    reward_funcs: Sequence[Callable | str] | None = None,
    reward_weights: Sequence[float] | None = None,
    callbacks: Sequence[Callback] = (),
    overrides: Sequence[str] = (),
) -> Any:
    """`posttrain grpo`: rows are tasks (a `prompt` or `messages`, plus the fields the reward reads).
    Returns a `RunResult`."""
    args = (train_data, validation_data, reward_funcs, reward_weights, callbacks, overrides)
    return _rl("grpo", config, *args)


def ppo(
    config: ConfigLike = None,
    *,
    train_data: Any = None,
    validation_data: Any = None,
    reward_funcs: Sequence[Callable | str] | None = None,
    reward_weights: Sequence[float] | None = None,
    callbacks: Sequence[Callback] = (),
    overrides: Sequence[str] = (),
) -> Any:
    """`posttrain ppo`, with the same arguments as `grpo`."""
    args = (train_data, validation_data, reward_funcs, reward_weights, callbacks, overrides)
    return _rl("ppo", config, *args)


def distill(
    config: ConfigLike = None,
    *,
    train_data: Any = None,
    validation_data: Any = None,
    callbacks: Sequence[Callback] = (),
    overrides: Sequence[str] = (),
) -> Any:
    """`posttrain distill`: the student samples the tasks' prompts, the teacher scores its tokens."""
    return _rl("distill", config, train_data, validation_data, None, None, callbacks, overrides)


def evaluate(
    config: ConfigLike = None,
    *,
    data: Any = None,
    reward_funcs: Sequence[Callable | str] | None = None,
    reward_weights: Sequence[float] | None = None,
    overrides: Sequence[str] = (),
) -> Any:
    """`posttrain eval`: any environment's reward (or `metric: loss` on SFT rows). Returns an `EvalResult`."""
    cfg = make_config(
        "eval",
        config,
        overrides,
        data={"dataset": data},
        reward_funcs=reward_funcs,
        reward_weights=reward_weights,
    )
    return _train("eval", cfg)
