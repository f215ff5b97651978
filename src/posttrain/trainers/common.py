"""Pieces every trainer shares: the run directory, seeding, controller state, signals, resuming."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import random
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from pydantic import BaseModel, ValidationError

from posttrain.checkpoint import Checkpointer
from posttrain.checkpoint.checkpointer import resolve_resume
from posttrain.config.common import CheckpointConfig
from posttrain.config.loader import ConfigError, to_yaml
from posttrain.config.rollout import EnvironmentConfig, GenerationConfig, turn_token_limit
from posttrain.errors import UserError
from posttrain.generation.sampling import SamplingParams

RESUMABLE_CHANGES = (
    "*.max_steps",
    "*.num_epochs",
    "*.val_every",
    "*.val_at_start",
    "*.val_batches",
    "*.val_samples_per_prompt",
    "*.val_temperature",
    "data.validation",
    "data.validation.*",
    "checkpoint.*",
    "logging.*",
    "environment.max_error_fraction",
    "environments.*.max_error_fraction",
)
"""Settings (dotted keys, fnmatch patterns) that a resumed run may change: how long it trains, how
often it validates, logs and saves, and what it validates on. Any other change refuses to resume."""


RUN_STARTED: dict[Path, float] = {}
"""When this process prepared each run directory (`time.monotonic()`): the start of the run's wall time."""


def prepare_run_dir(run_dir: str | None, algorithm: str, config: BaseModel) -> Path:
    """Create the run directory and write the resolved config into it.

    When the run resumes (`checkpoint.resume`), the config is first compared with the checkpoint's:
    a change outside `RESUMABLE_CHANGES` raises a `ConfigError` (one line, every changed key) before
    anything is written; allowed changes are printed and applied. So config.yaml is always the config
    the run uses. A folder that cannot be created or written is a `UserError` naming it.
    """
    path = Path(run_dir or f"runs/{algorithm}")
    RUN_STARTED[path.resolve()] = time.monotonic()
    checkpoint = _resume_checkpoint(path, config)
    if checkpoint is not None:
        changes = resume_changes(checkpoint, config)
        if changes:
            print(f"resuming from {checkpoint} with changed settings: {'; '.join(changes)}", flush=True)
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.yaml").write_text(to_yaml(config))
    except OSError as e:
        key = "logging.run_dir" if hasattr(config, "logging") else "output_dir"
        raise UserError(
            f"cannot write the run directory {path} ({e.strerror or e}); set {key} to a writable folder"
        ) from e
    return path


def _resume_checkpoint(run_dir: Path, config: BaseModel) -> Path | None:
    """The checkpoint a run with `config` in `run_dir` resumes from, or None (a fresh run, or a
    config without checkpoints)."""
    checkpoint = getattr(config, "checkpoint", None)
    if not isinstance(checkpoint, CheckpointConfig):
        return None
    return resolve_resume(checkpoint.resume, Checkpointer(run_dir / "checkpoints"))


def flat_items(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as {dotted key: leaf value}; lists and None are leaves, an empty mapping too."""
    if not isinstance(data, dict) or not data:
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flat_items(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def config_changes(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every leaf that differs, sorted by key; a key on one side
    only is compared with None (null and absent are both unset)."""
    a, b = flat_items(old), flat_items(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def resumable(key: str) -> bool:
    """Whether a resumed run may change this dotted key (`RESUMABLE_CHANGES`)."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in RESUMABLE_CHANGES)


def resume_changes(checkpoint: Path, config: BaseModel) -> list[str]:
    """The allowed changes ("key old -> new") of `config` against the config saved in `checkpoint`.

    The saved config is read through the current schema (new fields get their defaults) when it
    validates, else compared as saved. Raises `ConfigError` naming every change that is not allowed.
    """
    saved_path = checkpoint / "config.yaml"
    if not saved_path.is_file():
        return []
    saved = yaml.safe_load(saved_path.read_text()) or {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the config's own warnings were shown when it was loaded
            saved = type(config).model_validate(saved).model_dump(mode="json")
    except (ValidationError, UserError):
        pass
    changes = config_changes(saved, config.model_dump(mode="json"))
    shown = [f"{key} {old!r} -> {new!r}" for key, old, new in changes]
    refused = [text for (key, _, _), text in zip(changes, shown, strict=True) if not resumable(key)]
    if refused:
        raise ConfigError(
            f"cannot resume from {checkpoint} with changed settings: {'; '.join(refused)}. These cannot "
            "change mid-run: set them back, or start a new run (another logging.run_dir, or "
            "checkpoint.resume=none). Settings a resumed run may change: " + ", ".join(RESUMABLE_CHANGES)
        )
    return shown


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def sampling_params(
    generation: GenerationConfig,
    seed: int,
    temperature: float | None = None,
    environment: EnvironmentConfig | None = None,
) -> SamplingParams:
    """How `generation` samples (at `temperature` when given, else its own), with `seed`; a turn's
    limit is `environment`'s own max_new_tokens when it sets one (`turn_token_limit`)."""
    return SamplingParams(
        temperature=generation.temperature if temperature is None else temperature,
        top_p=generation.top_p,
        top_k=generation.top_k,
        max_new_tokens=generation.max_new_tokens
        if environment is None
        else turn_token_limit(generation, environment),
        stop_strings=tuple(generation.stop_strings),
        seed=seed,
    )


def save_controller_state(directory: Path, step: int, state: dict[str, Any], config: BaseModel) -> None:
    """Step, data position and anything else of the controller's, plus its RNG and config."""
    (directory / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    (directory / "config.yaml").write_text(to_yaml(config))
    torch.save(
        {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        directory / "rng_controller.pt",
    )


def load_controller_state(directory: Path) -> dict[str, Any]:
    rng = torch.load(directory / "rng_controller.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return json.loads((directory / "trainer_state.json").read_text())


class GracefulStop:
    """What SIGINT (Ctrl-C) and SIGTERM (a scheduler's preemption) do while a trainer's loop runs.

    The first signal only records itself (`requested` becomes true): the loop finishes the step it is
    in, leaves at the next step boundary, saves that last finished step (unless it is saved already)
    and then `raise_if_requested` raises KeyboardInterrupt (exit status 130). A second signal raises
    KeyboardInterrupt at once: a half-written checkpoint is discarded, the latest complete one stays.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt(f"second signal ({signal.Signals(signum).name})")
        self.signal_name = signal.Signals(signum).name
        # os.write: print() may be in the middle of writing to the same stream (a reentrant call)
        os.write(
            2,
            f"\n{self.signal_name}: stopping after the current step, which is saved first; "
            "send it again (Ctrl-C) to stop at once\n".encode(),
        )

    def raise_if_requested(self) -> None:
        """KeyboardInterrupt when a signal asked the run to stop (call it after the final save)."""
        if self.requested:
            raise KeyboardInterrupt(self.signal_name)


@contextlib.contextmanager
def graceful_stop() -> Iterator[GracefulStop]:
    """Install `GracefulStop`'s handler for SIGINT and SIGTERM inside the block (main thread only;
    elsewhere the signals keep their handlers and `requested` stays false)."""
    stop = GracefulStop()
    previous: dict[int, Any] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, stop.handle)
    except ValueError:  # not the main thread
        pass
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def truncate_step_log(path: Path, last_step: int | None) -> None:
    """Keep the JSONL rows of `path` with "step" <= `last_step` (rows without a step too): a resumed
    run redoes the steps after its checkpoint and must not log them twice. `last_step` None (a fresh
    start) removes the file; an unreadable row (a write cut by a kill) is dropped."""
    if not path.is_file():
        return
    if last_step is None:
        path.unlink()
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or row.get("step", -1) <= last_step:
            kept.append(line + "\n")
    path.write_text("".join(kept))


def epochs_notice(
    section: str, max_steps: int | None, num_epochs: int, batches_per_epoch: int, size: int
) -> str | None:
    """The line a run prints at start when `{section}.max_steps` asks for more steps than
    `num_epochs` epochs of `size` examples (`batches_per_epoch` steps each) hold: it trains those
    steps only. None when max_steps fits (or is unset)."""
    available = batches_per_epoch * num_epochs
    if not max_steps or max_steps <= available:
        return None
    return (
        f"note: {section}.max_steps={max_steps} is more than the {available} steps of "
        f"{section}.num_epochs={num_epochs} (an epoch: {size} examples, {batches_per_epoch} steps); "
        f"training {available} steps. Raise {section}.num_epochs to train longer"
    )


def make_checkpointer(root: Path, cfg: CheckpointConfig) -> Checkpointer:
    """The run's checkpointer with its retention policy; leftovers of interrupted saves removed."""
    checkpointer = Checkpointer(
        root, keep_last=cfg.keep_last, keep_best=cfg.keep_best, metric=cfg.metric, mode=cfg.mode
    )
    checkpointer.remove_partial()
    return checkpointer


def latest_values(history: list[dict[str, float]], step: int) -> dict[str, float]:
    """Each metric's latest value logged at or before `step` (history rows carry a "step" key)."""
    values: dict[str, float] = {}
    for row in history:
        if row.get("step", 0) <= step:
            values.update({k: v for k, v in row.items() if k != "step"})
    return values


def print_interrupted(latest_checkpoint: Path | None) -> None:
    """What a user reads after Ctrl-C or SIGTERM: where the run can resume from."""
    print(
        f"\ninterrupted; latest complete checkpoint: {latest_checkpoint or 'none'}. "
        "Run the same command to resume."
    )


def format_duration(seconds: float) -> str:
    """A wall time for people: 9.5s, 2m 05s, 1h 02m 03s."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def best_metric(history: list[dict[str, float]], metric: str, mode: str) -> tuple[float, int] | None:
    """(best value, its step) of `metric` over the history rows ("max" or "min" `mode`; the earliest
    step on a tie; NaN never best); None when no row has a finite value of it."""
    rows = [(row[metric], int(row.get("step", 0))) for row in history if metric in row]
    rows = [(value, step) for value, step in rows if value == value]
    if not rows:
        return None
    sign = -1.0 if mode == "max" else 1.0
    return min(rows, key=lambda vs: (sign * vs[0], vs[1]))


def run_summary(
    result: Any, total_steps: int, checkpoint: CheckpointConfig, *, wall_s: float | None = None
) -> str:
    """The lines a trainer prints when its run ends (finished, stopped or failed): steps done, the best
    value of `checkpoint.metric` (what keep_best ranks by, better as `checkpoint.mode`) and its step,
    the last checkpoint, the run directory and the wall time since `prepare_run_dir` (`RUN_STARTED`;
    or `wall_s`). `result`: a trainer's result (run_dir, step, history, last_checkpoint)."""
    metric, mode = checkpoint.metric, checkpoint.mode
    if wall_s is None:
        wall_s = time.monotonic() - RUN_STARTED.get(Path(result.run_dir).resolve(), time.monotonic())
    best = best_metric(result.history, metric, mode)
    best_text = f"{best[0]:.6g} at step {best[1]}" if best else "not logged"
    state = "finished" if result.step >= total_steps else "stopped"
    return "\n".join(
        [
            f"run {state}: {result.step}/{total_steps} steps, wall time {format_duration(wall_s)}",
            f"  best {metric} ({mode}): {best_text}",
            f"  last checkpoint: {result.last_checkpoint or 'none'}",
            f"  run dir: {result.run_dir}",
        ]
    )
