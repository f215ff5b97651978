"""Atomic checkpoint directories: `<root>/step_000042/`.

A checkpoint is written into a hidden temporary folder, marked complete with a `COMPLETE`
file, and only then renamed into place, so an interrupted save (Ctrl-C, SIGTERM, a crash)
never leaves a folder that a resume would pick up. Temporary leftovers are removed at start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE = "COMPLETE"


class Checkpointer:
    def __init__(self, root: str | Path, *, keep_last: int = 2) -> None:
        self.root = Path(root)
        self.keep_last = keep_last

    def complete(self) -> list[Path]:
        """Finished checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = [
            (int(m.group(1)), p)
            for p in self.root.iterdir()
            if (m := STEP_DIR.match(p.name)) and (p / COMPLETE).is_file()
        ]
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def remove_partial(self) -> list[Path]:
        """Delete temporary folders left by interrupted saves; return what was removed."""
        if not self.root.is_dir():
            return []
        partial = [p for p in self.root.iterdir() if p.name.startswith(".tmp-")]
        partial += [p for p in self.root.iterdir() if STEP_DIR.match(p.name) and not (p / COMPLETE).exists()]
        for p in partial:
            shutil.rmtree(p, ignore_errors=True)
        return partial

    def save(self, step: int, write: Callable[[Path], None], meta: dict | None = None) -> Path:
        """Call `write(tmp_dir)`, mark it complete, rename it to step_<step>, prune old ones."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            write(tmp)
            (tmp / COMPLETE).write_text(json.dumps({"step": step, **(meta or {})}))
            _fsync_dir(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.prune()
        return final

    def prune(self) -> None:
        for old in self.complete()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    for f in path.iterdir():
        if f.is_file():
            with open(f, "rb") as handle:
                os.fsync(handle.fileno())


def resolve_resume(resume: str, checkpointer: Checkpointer) -> Path | None:
    """`auto` -> latest complete checkpoint (or None); `none` -> None; else an explicit checkpoint path."""
    if resume == "none":
        return None
    if resume == "auto":
        return checkpointer.latest()
    path = Path(resume).expanduser()
    if not (path / COMPLETE).is_file():
        raise FileNotFoundError(
            f"checkpoint.resume={resume!r} is not a complete checkpoint folder (no {COMPLETE} file in it); "
            f"complete checkpoints in this run: {[str(p) for p in checkpointer.complete()] or 'none'}"
        )
    return path
