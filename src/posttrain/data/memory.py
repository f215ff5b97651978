"""In-memory datasets (a list of dicts, a `datasets.Dataset`) as JSONL files of the run.

The Python API writes the rows to `<run_dir>/data/<split>-<sha256[:12]>.jsonl` and points the
split's `path` at that file, so in-memory rows are read, validated and reported exactly as a file's
(`posttrain.data.sources.load_rows`: "... row 3" is the third row, list index 2). The name holds a
hash of the contents: a run resumed with other rows records another path in its config.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from posttrain.data.sources import DataError


def rows_of(data: Any, name: str) -> list[Mapping[str, Any]]:
    """The rows of a list/tuple of mappings or of a `datasets.Dataset` (anything with `to_list`)."""
    if isinstance(data, (str, bytes, Path, Mapping)):
        raise DataError(
            f"{name}: expected a list of dicts or a datasets.Dataset, got {type(data).__name__} "
            "(give a file as the config's data.<split>.path)"
        )
    rows = data.to_list() if hasattr(data, "to_list") else list(data) if isinstance(data, Iterable) else None
    if rows is None:
        raise DataError(f"{name}: expected a list of dicts or a datasets.Dataset, got {type(data).__name__}")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DataError(f"{name} row {i + 1}: expected a dict, got {type(row).__name__}")
    if not rows:
        raise DataError(f"{name} is empty")
    return rows


def write_rows(data: Any, folder: Path, split: str) -> Path:
    """Write the rows of `data` (see `rows_of`) as JSONL into `folder`; the file's path."""
    lines = []
    for i, row in enumerate(rows_of(data, f"{split}_data")):
        try:
            lines.append(json.dumps(dict(row), ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise DataError(
                f"{split}_data row {i + 1}: not JSON data ({e}); convert the field to str/number/list/dict"
            ) from None
    text = "\n".join(lines) + "\n"
    path = folder / f"{split}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.jsonl"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path
