"""YAML loading with `defaults:` inheritance, dotted overrides, and validation errors a person can act on.

A recipe may start with `defaults: other.yaml` (or a list of files), resolved relative to the
recipe's own folder; later files and the recipe itself override earlier ones key by key.
Command-line overrides look like `policy.optimizer.lr=1e-5`; the value is parsed as YAML.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from posttrain.config.common import quickstart_keys_to_drop
from posttrain.config.multienv import drop_replaced_defaults
from posttrain.errors import UserError

T = TypeVar("T", bound=BaseModel)


class ConfigError(UserError, ValueError):
    """A config that cannot be used, with a message that says what to change."""


class OverrideError(ConfigError):
    """A recipe file that is valid on its own, made invalid by command-line overrides."""


SOURCE_KEYS = frozenset({"path", "reasoning_gym", "environment_tasks"})
"""Mutually exclusive keys of a dataset: a layer that names one replaces the layers' below others, at
every layer (the algorithm's defaults, a recipe's `defaults:` parents, the recipe, command-line overrides)."""


def deep_merge(base: dict, override: dict, exclusive: frozenset[str] = frozenset()) -> dict:
    """Return `base` updated by `override`; nested dicts merge, anything else replaces. A nested
    mapping of `override` that names one of the `exclusive` keys drops `base`'s others there."""
    merged = dict(base)
    for key, value in override.items():
        below = merged.get(key)
        if isinstance(value, dict) and isinstance(below, dict):
            if value.keys() & exclusive:
                below = {k: v for k, v in below.items() if k not in exclusive - value.keys()}
            merged[key] = deep_merge(below, value, exclusive)
        else:
            merged[key] = value
    return merged


def load_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict:
    """Read a recipe and everything it inherits through `defaults:`."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"`defaults:` cycle: {' -> '.join(str(p) for p in (*_seen, path))}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    parents = data.pop("defaults", None) or []
    if isinstance(parents, str):
        parents = [parents]
    merged: dict = {}
    for parent in parents:
        merged = deep_merge(merged, load_yaml(path.parent / parent, (*_seen, path)), SOURCE_KEYS)
    return deep_merge(merged, data, SOURCE_KEYS)


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `a.b.c=value` strings; `value` is parsed as YAML (`1e-5`, `true`, `[1, 2]`, `null`).

    An override that names a dataset source (`data.train.path=...`, `data.train.reasoning_gym.size=3`)
    replaces the recipe's other sources there (`SOURCE_KEYS`); two sources named by the overrides
    themselves stay, and validation reports the conflict."""
    data = dict(data)
    named: set[tuple[str, ...]] = set()  # source keys the overrides have named
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key.path=value")
        value = yaml.safe_load(raw) if raw != "" else ""
        *parents, leaf = key.split(".")
        node: dict = data
        for depth, part in enumerate(parents):
            if part in SOURCE_KEYS:
                _name_source(node, tuple(parents[:depth]), part, named)
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else {}
            node[part] = child
            node = child
        if leaf in SOURCE_KEYS and value is not None:
            _name_source(node, tuple(parents), leaf, named)
        node[leaf] = value
    return data


def _name_source(node: dict, at: tuple[str, ...], source: str, named: set[tuple[str, ...]]) -> None:
    """`source` is named by an override at `at`: drop the other sources there unless an override named them."""
    for other in SOURCE_KEYS - {source}:
        if (*at, other) not in named:
            node.pop(other, None)
    named.add((*at, source))


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """Valid keys of the model found by walking `loc` (minus its last element)."""
    current: Any = model
    for part in loc[:-1]:
        field = _fields_of(current).get(str(part))
        if field is None:
            return []
        current = _model_in(field.annotation)
    return list(_fields_of(current))


def _fields_of(model: Any) -> dict[str, Any]:
    """A BaseModel class's fields; {} for anything else."""
    return model.model_fields if isinstance(model, type) and issubclass(model, BaseModel) else {}


def _model_in(annotation: Any) -> Any:
    """The BaseModel class inside `X`, `X | None` or `Optional[X]`, else the annotation itself."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return annotation


def format_validation_error(model: type[BaseModel], err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-after")))
        key = ".".join(str(p) for p in loc) or "<top level>"
        if e["type"] == "extra_forbidden":
            valid = _fields_at(model, loc)
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
            hint = f" Did you mean `{'.'.join(str(p) for p in (*loc[:-1], close[0]))}`?" if close else ""
            lines.append(f"unknown key `{key}`.{hint} Valid keys here: {', '.join(valid)}.")
        else:
            given = e.get("input")
            given_text = "" if isinstance(given, dict) else f" (got {given!r})"
            message = e["msg"].removeprefix("Value error, ")  # our validators' own sentences
            text = f"{f'`{key}`: ' if loc else ''}{message}{given_text}"
            lines.append(text if text.endswith(".") else f"{text}.")
    if len(lines) == 1:
        return f"invalid config: {lines[0]}"
    return "invalid config:\n  " + "\n  ".join(lines)


def validate(model: type[T], data: dict) -> T:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(model, err)) from None


def load_config(model: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """The model's defaults, then the recipe file (optional), then dotted overrides -> validated config.

    Defaults are the algorithm config's own (e.g. `SFTConfig()`), so a recipe that sets one key
    of a section keeps the algorithm's other defaults for that section. When the recipe is valid on
    its own and the overrides make it invalid, the error says so (it blames the overrides, not the file).
    """
    recipe = load_yaml(path) if path is not None else {}
    try:
        return config_from_data(model, apply_overrides(recipe, overrides or []))
    except ConfigError as e:
        if not overrides or path is None:
            raise
        try:
            config_from_data(model, recipe)
        except ConfigError:
            raise e from None  # the recipe itself is invalid
        raise OverrideError(
            f"command-line override(s) {' '.join(overrides)} (not {path}, which is valid alone): {e}"
        ) from None


def config_from_data(model: type[T], data: dict) -> T:
    """The model's defaults updated by a user's nested mapping (a recipe after its overrides), validated.

    A `data` section that names data of its own drops the defaults that belong to the quickstart's
    task unless it sets them (`posttrain.config.common.quickstart_keys_to_drop`): no validation split,
    no worked example turns."""
    # the declared defaults, before validators resolve any ("auto" ones, e.g. loss.importance_correction):
    # the validators run once, on the merged data, where they can tell a default from a user's value
    defaults = model.model_construct().model_dump()
    drop_replaced_defaults(defaults, data)
    user_data = data.get("data")
    if isinstance(defaults.get("data"), dict) and isinstance(user_data, dict):
        defaults["data"].update(quickstart_keys_to_drop(user_data, defaults["data"]))
    return validate(model, deep_merge(defaults, data, SOURCE_KEYS))


def to_yaml(config: BaseModel) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
