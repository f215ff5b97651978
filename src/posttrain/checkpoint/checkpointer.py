"""Atomic checkpoint directories: `<root>/step_000042/`.

A checkpoint is written into a hidden temporary folder, marked complete with a `COMPLETE`
file, and only then renamed into place, so an interrupted save (Ctrl-C, SIGTERM, a crash)
never leaves a folder that a resume would pick up. Temporary leftovers are removed at start.

Retention: after each save the last `keep_last` checkpoints survive, plus, with `keep_best` > 0,
the `keep_best` best by a metric recorded in each checkpoint's `COMPLETE` file (see
`select_retained`). A checkpoint folder holds `model/` (a Hugging Face folder with the FULL,
consolidated weights, written by rank 0), optimizer state and RNG states; `posttrain export`
turns it into a standalone Hugging Face folder.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from posttrain.errors import DiskFullError, MissingFileError
from posttrain.logging.progress import stage

STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE = "COMPLETE"
DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "File too large")
DISK_FULL_BYTES = 1 << 20


@dataclass(frozen=True)
class CheckpointInfo:
    """One complete checkpoint: its step and the ranking metric's value when it was saved (None: unscored)."""

    step: int
    score: float | None = None


def select_retained(
    checkpoints: Sequence[CheckpointInfo], *, keep_last: int, keep_best: int = 0, mode: str = "max"
) -> set[int]:
    """Steps to keep: the `keep_last` latest, united with the `keep_best` best-scored.

    Best means highest score for mode "max", lowest for "min"; unscored checkpoints (no value of
    the metric yet, or NaN) never count as best. Equal scores: the later step ranks first.
    """
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    by_step = sorted(checkpoints, key=lambda c: c.step)
    keep = {c.step for c in by_step[-keep_last:]} if keep_last > 0 else set()
    scored = [c for c in by_step if c.score is not None and c.score == c.score]
    sign = 1.0 if mode == "max" else -1.0
    ranked = sorted(scored, key=lambda c: (sign * c.score, c.step), reverse=True)
    keep |= {c.step for c in ranked[:keep_best]}
    return keep


class Checkpointer:
    def __init__(
        self,
        root: str | Path,
        *,
        keep_last: int = 2,
        keep_best: int = 0,
        metric: str | None = None,
        mode: Literal["max", "min"] = "max",
    ) -> None:
        if keep_best > 0 and not metric:
            raise ValueError("keep_best > 0 needs the name of the metric that ranks checkpoints")
        self.root = Path(root)
        self.keep_last, self.keep_best, self.metric, self.mode = keep_last, keep_best, metric, mode

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

    def save(
        self,
        step: int,
        write: Callable[[Path], None],
        meta: dict | None = None,
        *,
        metrics: dict[str, float] | None = None,
    ) -> Path:
        """Call `write(tmp_dir)`, mark it complete, rename it to step_<step>, prune old ones.

        `metrics` (e.g. the latest validation numbers) are stored in COMPLETE and rank checkpoints.
        """
        if metrics is not None:
            meta = {**(meta or {}), "metrics": metrics}
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step_{step:06d}"
        with stage("checkpoint"), atomic_directory(final) as tmp:
            try:
                write(tmp)
                (tmp / COMPLETE).write_text(json.dumps({"step": step, **(meta or {})}))
            except Exception as e:
                if disk_full(e, tmp):  # raised before the partial folder is removed, to measure its disk
                    raise self.disk_full_error(final) from e
                raise
        self.prune()
        return final

    def disk_full_error(self, final: Path) -> DiskFullError:
        """What a user reads when a save ran out of space: the partial write is gone, the previous
        checkpoint is intact, and how to go on."""
        previous = self.latest()
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        return DiskFullError(
            f"no space left on device to write checkpoint {final.name} under {self.root}; the partial "
            f"write was removed and {kept}. Free space there "
            "(or lower checkpoint.keep_last) and run the same command to resume."
        )

    def info(self, path: Path) -> CheckpointInfo:
        """Step and ranking score read back from a checkpoint's COMPLETE file."""
        meta = json.loads((path / COMPLETE).read_text() or "{}")
        value = meta.get("metrics", {}).get(self.metric) if self.metric else None
        return CheckpointInfo(int(meta.get("step", STEP_DIR.match(path.name).group(1))), value)

    def best(self) -> Path | None:
        """The best-scored complete checkpoint by `metric` and `mode` (None if none is scored)."""
        paths = {self.info(p).step: p for p in self.complete()}
        keep = select_retained(
            [self.info(p) for p in paths.values()], keep_last=0, keep_best=1, mode=self.mode
        )
        return paths[keep.pop()] if keep else None

    def prune(self) -> list[Path]:
        """Delete complete checkpoints outside the retained set; return what was deleted."""
        done = self.complete()
        infos = [self.info(p) for p in done]
        keep = select_retained(infos, keep_last=self.keep_last, keep_best=self.keep_best, mode=self.mode)
        removed = [p for p, i in zip(done, infos, strict=True) if i.step not in keep]
        for old in removed:
            shutil.rmtree(old, ignore_errors=True)
        return removed


class Deadline:
    """A wall-clock budget for one invocation: stop (after a final save) while there is still time to save.

    `should_stop()` is true when the time used, plus the longest step seen and the longest save
    seen (the cost of one more step and its final checkpoint), would exceed the budget.
    """

    def __init__(self, budget_s: float | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_s, self.clock = budget_s, clock
        self.start = clock()
        self.longest_step = 0.0
        self.longest_save = 0.0

    def record_step(self, seconds: float) -> None:
        self.longest_step = max(self.longest_step, seconds)

    def record_save(self, seconds: float) -> None:
        self.longest_save = max(self.longest_save, seconds)

    def should_stop(self) -> bool:
        if self.budget_s is None:
            return False
        used = self.clock() - self.start
        return used + self.longest_step + self.longest_save > self.budget_s


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a new hidden sibling folder of `final` (`.tmp-<name>-<random>`) to write into; when the
    block succeeds, its files are synced and it replaces `final` by a rename, so readers see the old
    folder or the complete new one, never a mix. On an error the temporary folder is removed."""
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        yield tmp
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def disk_full(error: BaseException, directory: Path) -> bool:
    """Whether a write into `directory` failed for lack of space: `error` (or an exception it wraps:
    `__cause__`, or a worker's exception in `.cause`) is ENOSPC / EDQUOT / EFBIG or says so, or the
    disk has less than `DISK_FULL_BYTES` left (torch.save reports a full disk as a bare
    "unexpected pos" RuntimeError)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in DISK_FULL_ERRNOS:
            return True
        if any(text in str(seen) for text in DISK_FULL_TEXTS):
            return True
        seen = getattr(seen, "cause", None) or seen.__cause__
    try:
        return shutil.disk_usage(directory).free < DISK_FULL_BYTES
    except OSError:
        return False


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
        raise MissingFileError(
            f"checkpoint.resume={resume!r} is not a complete checkpoint folder (no {COMPLETE} file in it); "
            f"complete checkpoints in this run: {[str(p) for p in checkpointer.complete()] or 'none'}"
        )
    return path
