"""Read raw rows from a local file, a `datasets` name, or a reasoning-gym generator.

Every row is a dict; `Row.where` names its origin ("train.jsonl row 17") for error messages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.config.schema import DatasetConfig, ReasoningGymConfig

BOXED_INSTRUCTION = "Put your final answer within \\boxed{}."


class DataError(ValueError):
    """A dataset row or file that cannot be used; the message names the file and row."""


@dataclass(frozen=True)
class Row:
    data: dict[str, Any]
    where: str


def load_rows(cfg: DatasetConfig) -> list[Row]:
    """All rows of one dataset split, capped at `cfg.max_samples`."""
    if cfg.reasoning_gym is not None:
        rows = reasoning_gym_rows(cfg.reasoning_gym)
    else:
        assert cfg.path is not None
        path = Path(cfg.path).expanduser()
        rows = _file_rows(path) if path.suffix in {".jsonl", ".json", ".parquet"} else _hf_rows(cfg)
    return rows[: cfg.max_samples] if cfg.max_samples else rows


def _file_rows(path: Path) -> list[Row]:
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    if path.suffix == ".jsonl":
        rows = []
        with open(path) as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path} row {lineno}: invalid JSON ({e.msg})") from None
                if not isinstance(obj, dict):
                    raise DataError(f"{path} row {lineno}: expected a JSON object, got {type(obj).__name__}")
                rows.append(Row(obj, f"{path} row {lineno}"))
        return rows
    if path.suffix == ".json":
        with open(path) as f:
            objs = json.load(f)
        if not isinstance(objs, list):
            raise DataError(f"{path}: expected a JSON list of objects")
        return [Row(o, f"{path} row {i + 1}") for i, o in enumerate(objs)]
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return [Row(o, f"{path} row {i + 1}") for i, o in enumerate(table.to_pylist())]


def _hf_rows(cfg: DatasetConfig) -> list[Row]:
    import datasets

    try:
        ds = datasets.load_dataset(cfg.path, cfg.subset, split=cfg.split)
    except Exception as e:  # noqa: BLE001 - re-raised with the config key that names it
        raise DataError(
            f"could not load dataset {cfg.path!r} (subset={cfg.subset!r}, split={cfg.split!r}) with "
            f"datasets.load_dataset: {type(e).__name__}: {e}. Use a local .jsonl/.json/.parquet file "
            "or a dataset name reachable from this machine."
        ) from e
    if cfg.max_samples:
        ds = ds.select(range(min(cfg.max_samples, len(ds))))
    return [Row(o, f"{cfg.path}[{cfg.split}] row {i + 1}") for i, o in enumerate(ds)]


def reasoning_gym_rows(cfg: ReasoningGymConfig) -> list[Row]:
    """Generate problems offline. Each row has `prompt`, `response` (a worked answer) and `answer`."""
    import reasoning_gym

    try:
        ds = reasoning_gym.create_dataset(cfg.task, size=cfg.size, seed=cfg.seed, **cfg.kwargs)
    except Exception as e:  # noqa: BLE001
        raise DataError(f"reasoning-gym could not make task {cfg.task!r} with {cfg.kwargs}: {e}") from e
    rows = []
    for i, item in enumerate(ds):
        answer = str(item["answer"])
        rows.append(
            Row(
                {
                    "prompt": f"{item['question']}\n{BOXED_INSTRUCTION}",
                    "response": worked_answer(item.get("metadata", {}), answer),
                    "answer": answer,
                },
                f"reasoning_gym:{cfg.task}(seed={cfg.seed}) item {i}",
            )
        )
    return rows


def worked_answer(metadata: dict, answer: str) -> str:
    """A short solution ending in the \\boxed{} form that the math environment rewards."""
    expression = metadata.get("expression")
    if expression:
        expression = expression.strip()
        if expression.startswith("( ") and expression.endswith(" )"):
            expression = expression[2:-2]
        return f"{expression} = {answer}\n\nThe answer is \\boxed{{{answer}}}."
    return f"The answer is \\boxed{{{answer}}}."
