"""Running the real command line as a separate process, and reading back what a run left on disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import sft_overrides

FAULTS = Path(__file__).parent
ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def cli(args: list[str], *, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """`python -m posttrain.cli ARGS` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "posttrain.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**ENV, **env},
    )


def start(args: list[str], *, runner: list[str] | None = None, **env: str) -> subprocess.Popen:
    """Start `python -m posttrain.cli ARGS` (or `runner ARGS`) without waiting; output in pipes."""
    command = runner or [sys.executable, "-m", "posttrain.cli"]
    return subprocess.Popen(
        [*command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**ENV, **env}
    )


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    """Wait for the process; its exit status and its stdout + stderr."""
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out + err


def wait_for(condition, process: subprocess.Popen, *, timeout: float = 300, what: str = "") -> None:
    """Poll `condition()` every 20 ms until true; fail if the process exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            rc, output = finish(process)
            raise AssertionError(f"the run exited ({rc}) before {what}:\n{output[-4000:]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"timed out waiting for {what}:\n{finish(process)[1][-4000:]}")
        time.sleep(0.02)


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc/<pid>/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def complete_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints (with a COMPLETE file) in a run directory."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.glob("step_*") if (p / "COMPLETE").is_file())


def kill_tree_leftovers(process: subprocess.Popen) -> None:
    """SIGKILL the process if a failed test left it running (stopped processes too)."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def remove_shared_files(pid: int) -> None:
    """Delete the shared-memory weight files of a SIGKILLed posttrain process (it could not)."""
    from posttrain.weights.refit import stale_shared_files

    for path in stale_shared_files():
        if Path(path).name.split("-")[2] == str(pid):
            Path(path).unlink(missing_ok=True)


def sft_args(model_dir, data, run_dir, **extra) -> list[str]:
    """A 3-step SFT run on the tiny model that saves after every step (no validation, no plots)."""
    settings = {
        "sft.max_steps": 3,
        "checkpoint.save_every": 1,
        "sft.val_every": 100,
        "sft.val_at_start": False,
        "logging.plots": False,
        **extra,
    }
    return ["sft", *sft_overrides(model_dir, data, run_dir, **settings)]


def losses(run_dir) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [(row["step"], row["loss"]) for row in rows if "loss" in row]


def descendants(root: int) -> list[int]:
    """Every process below `root` in the process tree (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def ray_actor_pids(root: int) -> dict[str, list[int]]:
    """The Ray actor processes below `root` (a run, or a raylet) by class: Ray titles an actor's
    process `ray::<Class>` or, while it runs a method, `ray::<Class>.<method>`."""
    found: dict[str, list[int]] = {}
    for pid in descendants(root):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if title.startswith("ray::") and title != "ray::IDLE":
            found.setdefault(title.removeprefix("ray::").split(".")[0], []).append(pid)
    return found
