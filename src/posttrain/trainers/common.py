"""Pieces every trainer shares: the run directory, seeding, controller state, signals."""

from __future__ import annotations

import contextlib
import json
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

from posttrain.checkpoint import Checkpointer
from posttrain.config.loader import to_yaml
from posttrain.config.schema import CheckpointConfig


def prepare_run_dir(run_dir: str | None, algorithm: str, config: BaseModel) -> Path:
    """Create the run directory and write the resolved config into it."""
    path = Path(run_dir or f"runs/{algorithm}")
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(to_yaml(config))
    return path


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so that a kill unwinds like Ctrl-C (partial saves are discarded)."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
