"""SFT transcripts written by the examples' `*_transcripts.py` scripts: one JSON line per task,
`{"messages": [...], "task": {...}}`, read back by `posttrain sft` as `data.train.path`."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def transcripts_parser(doc: str, count: int, seed: int, pool: str) -> argparse.ArgumentParser:
    """The arguments every transcripts script takes: the output file, `--count` (one transcript
    each), `--seed` of the draw and `--split` ("train" or "heldout": which pool of `pool` to draw
    from). The description is `doc`'s first paragraph."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the JSONL file to write")
    parser.add_argument("--count", type=int, default=count, help="tasks (one transcript each)")
    parser.add_argument("--seed", type=int, default=seed, help="seed of the draw")
    parser.add_argument("--split", choices=["train", "heldout"], default="train", help=f"the pool of {pool}")
    return parser


def write_transcripts(out: Path, rows: Iterable[tuple[list[dict[str, Any]], dict[str, Any]]]) -> int:
    """Write (messages, task) rows to `out` as JSON lines (its folder made); returns how many."""
    out.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(out, "w") as f:
        for messages, task in rows:
            f.write(json.dumps({"messages": messages, "task": task}) + "\n")
            written += 1
    return written
