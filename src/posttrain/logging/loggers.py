"""One `MetricsLogger` fans metrics out to the console, a JSONL file and TensorBoard."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from posttrain.config.schema import LoggingConfig

CONSOLE_KEYS = ("loss", "val/loss", "reward/mean", "val/accuracy", "grad_norm", "lr", "tokens_per_s")


class MetricsLogger:
    def __init__(self, cfg: LoggingConfig, run_dir: Path, *, total_steps: int, start_step: int = 0) -> None:
        self.cfg, self.run_dir, self.total_steps = cfg, run_dir, total_steps
        self.jsonl = open(run_dir / "metrics.jsonl", "a") if cfg.jsonl else None  # noqa: SIM115
        self.tb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        self.progress = _Progress(total_steps, start_step) if cfg.progress else None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        metrics = {k: float(v) for k, v in metrics.items()}
        if self.jsonl:
            self.jsonl.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
            self.jsonl.flush()
        if self.tb:
            for key, value in metrics.items():
                if math.isfinite(value):
                    self.tb.add_scalar(key, value, step)
        if self.progress and (step % self.cfg.log_every == 0 or step == self.total_steps):
            self.progress.update(step, metrics)

    def info(self, message: str) -> None:
        if self.progress:
            self.progress.print(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self.jsonl:
            self.jsonl.close()
        if self.tb:
            self.tb.close()
        if self.progress:
            self.progress.close()


def format_metrics(metrics: dict[str, float]) -> str:
    shown = [(k, metrics[k]) for k in CONSOLE_KEYS if k in metrics]
    return "  ".join(f"{k}={_fmt(v)}" for k, v in shown)


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.4f}".rstrip("0").rstrip(".")


class _Progress:
    """A rich progress bar on a terminal; one plain line per logged step otherwise (CI, files)."""

    def __init__(self, total: int, start: int) -> None:
        self.total = total
        self.start_time = time.perf_counter()
        self.interactive = sys.stdout.isatty()
        self.bar: Any = None
        if self.interactive:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("[bold]step"),
                MofNCompleteColumn(),
                BarColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[metrics]}"),
            )
            self.task = self.bar.add_task("train", total=total, completed=start, metrics="")
            self.bar.start()

    def update(self, step: int, metrics: dict[str, float]) -> None:
        text = format_metrics(metrics)
        if self.bar is not None:
            self.bar.update(self.task, completed=step, metrics=text)
        else:
            elapsed = time.perf_counter() - self.start_time
            print(f"step {step}/{self.total} [{elapsed:.0f}s] {text}", flush=True)

    def print(self, message: str) -> None:
        if self.bar is not None:
            self.bar.console.print(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
