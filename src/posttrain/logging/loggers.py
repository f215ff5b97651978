"""One `MetricsLogger` fans metrics out to sinks: console, JSONL, TensorBoard, W&B and MLflow.

Every sink has the same three methods: `log(step, metrics)`, `log_config(config)` (the resolved
hyper-parameters, once, at start) and `close()`. W&B and MLflow are imported only when enabled.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from posttrain.config.common import LoggingConfig, MlflowConfig, WandbConfig

CONSOLE_KEYS = ("loss", "val/loss", "reward/mean", "val/accuracy", "grad_norm", "lr", "tokens_per_s")


class Sink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_config(self, config: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> one level with dotted keys: {"a": {"b": 1}} -> {"a.b": 1}."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


class JsonlSink:
    """<run_dir>/metrics.jsonl: one {"step", "time", **metrics} object per call."""

    def __init__(self, run_dir: Path) -> None:
        self.file = open(run_dir / "metrics.jsonl", "a")  # noqa: SIM115

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        self.file.flush()

    def log_config(self, config: dict[str, Any]) -> None:
        """The config is already in <run_dir>/config.yaml; metrics.jsonl stays one row per step."""

    def close(self) -> None:
        self.file.close()


class TensorBoardSink:
    """<run_dir>/tensorboard: scalars, and the config as text and as hparams.

    A run resumed from step k (`start_step`) purges the earlier run's events of steps after k (they
    were logged after the checkpoint it resumes from), as metrics.jsonl is trimmed: TensorBoard drops
    them when it reads the new writer's start marker (`purge_step`)."""

    def __init__(self, run_dir: Path, start_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge_step = start_step + 1 if start_step else None
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if math.isfinite(value):
                self.writer.add_scalar(key, value, step)

    def log_config(self, config: dict[str, Any]) -> None:
        text = json.dumps(config, indent=2, default=str)
        self.writer.add_text("config", f"```\n{text}\n```", 0)
        scalars = {
            k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in flatten(config).items()
        }
        self.writer.add_hparams(scalars, {}, run_name=".")

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A Weights & Biases run whose files live in <run_dir>/wandb (WANDB_MODE=offline works without a network)."""

    def __init__(self, cfg: WandbConfig, run_dir: Path) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError("logging.wandb.enabled=true needs wandb: pip install 'posttrain[wandb]'") from e
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=cfg.name or run_dir.resolve().name,
            dir=str(run_dir),
            mode=cfg.mode,
            tags=cfg.tags or None,
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)

    def close(self) -> None:
        self.run.finish()


_MLFLOW_BAD = re.compile(r"[^0-9A-Za-z_\-. /]")


def mlflow_key(key: str) -> str:
    """MLflow allows letters, digits, _ - . space and /: `val/pass@4` -> `val/pass_at_4`."""
    return _MLFLOW_BAD.sub("_", key.replace("@", "_at_"))


class MlflowSink:
    """An MLflow run, by default in the local file store file:<run_dir>/mlruns."""

    def __init__(self, cfg: MlflowConfig, run_dir: Path) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise ImportError(
                "logging.mlflow.enabled=true needs mlflow: pip install 'posttrain[mlflow]'"
            ) from e
        uri = cfg.tracking_uri or (run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow >= 3.7 refuses the file store unless opted in; a local file store is what was asked for
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(cfg.experiment)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(cfg.experiment)
        )
        run = self.client.create_run(experiment_id, run_name=cfg.run_name or run_dir.resolve().name)
        self.run_id = run.info.run_id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_key(k), v, now, step) for k, v in metrics.items() if math.isfinite(v)]
        for start in range(0, len(batch), 1000):  # MLflow's per-request limit
            self.client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def log_config(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(mlflow_key(k), str(v)[:6000]) for k, v in flatten(config).items()]
        for start in range(0, len(params), 100):  # MLflow's per-request limit for params
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class ConsoleSink:
    """A progress bar on a terminal, plain lines otherwise, every `log_every` steps."""

    def __init__(self, cfg: LoggingConfig, total_steps: int, start_step: int) -> None:
        self.log_every, self.total_steps = cfg.log_every, total_steps
        self.progress = _Progress(total_steps, start_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.log_every == 0 or step == self.total_steps:
            self.progress.update(step, metrics)

    def log_config(self, config: dict[str, Any]) -> None:
        """The console shows metrics only; the config is in <run_dir>/config.yaml."""

    def close(self) -> None:
        self.progress.close()


def build_sinks(cfg: LoggingConfig, run_dir: Path, *, total_steps: int, start_step: int) -> list[Sink]:
    sinks: list[Sink] = []
    if cfg.jsonl:
        sinks.append(JsonlSink(run_dir))
    if cfg.tensorboard:
        sinks.append(TensorBoardSink(run_dir, start_step))
    if cfg.wandb.enabled:
        sinks.append(WandbSink(cfg.wandb, run_dir))
    if cfg.mlflow.enabled:
        sinks.append(MlflowSink(cfg.mlflow, run_dir))
    if cfg.progress:
        sinks.append(ConsoleSink(cfg, total_steps, start_step))
    return sinks


STEP_CALLBACKS: list[Callable[[int, dict[str, float]], Any]] = []
"""Called with (step, metrics) on every row any `MetricsLogger` of this process logs (training metrics,
then validation metrics as their own row); the Python API's `callbacks=` (`step_callbacks`)."""


@contextlib.contextmanager
def step_callbacks(callbacks: Iterable[Callable[[int, dict[str, float]], Any]]) -> Iterator[None]:
    """Within the block, every logged row also goes to each callback (an exception from one stops the run)."""
    added = list(callbacks)
    STEP_CALLBACKS.extend(added)
    try:
        yield
    finally:
        for callback in added:
            STEP_CALLBACKS.remove(callback)


class MetricsLogger:
    """Fans each step's metrics (plus sampled system metrics) out to every enabled sink."""

    def __init__(
        self,
        cfg: LoggingConfig,
        run_dir: Path,
        *,
        total_steps: int,
        start_step: int = 0,
        config: Any = None,
    ) -> None:
        self.cfg, self.run_dir, self.total_steps = cfg, run_dir, total_steps
        self.sinks = build_sinks(cfg, run_dir, total_steps=total_steps, start_step=start_step)
        self.console = next((s for s in self.sinks if isinstance(s, ConsoleSink)), None)
        self.system = None
        if cfg.system_metrics:
            from posttrain.logging.system import SystemMonitor

            self.system = SystemMonitor()
        self._sampled_step: int | None = None
        if config is not None:
            as_dict = config.model_dump(mode="json") if hasattr(config, "model_dump") else dict(config)
            for sink in self.sinks:
                sink.log_config(as_dict)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        metrics = {k: float(v) for k, v in metrics.items()}
        if self.system is not None and step != self._sampled_step:  # once per step
            metrics.update(self.system.sample())
            self._sampled_step = step
        for sink in self.sinks:
            sink.log(step, metrics)
        for callback in STEP_CALLBACKS:
            callback(step, dict(metrics))

    def info(self, message: str) -> None:
        if self.console:
            self.console.progress.print(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def format_metrics(metrics: dict[str, float]) -> str:
    shown = [(k, metrics[k]) for k in CONSOLE_KEYS if k in metrics]
    return "  ".join(f"{k}={_fmt(v)}" for k, v in shown)


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.4f}".rstrip("0").rstrip(".")


class _Progress:
    """The console of a run: one line per logged step (and per validation row), which stays on
    screen, on a terminal and off it; on a terminal also a live step bar under those lines with the
    time left and the stage the run is in (`posttrain.logging.progress.current_stage`)."""

    def __init__(self, total: int, start: int, console: Any = None) -> None:
        """`console`: a rich Console to draw the bar on (default: stdout, when it is a terminal)."""
        self.total = total
        self.start_time = time.perf_counter()
        self.interactive = console is not None or sys.stdout.isatty()
        self.bar: Any = None
        self.stages: contextlib.ExitStack | None = None
        if self.interactive:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            from posttrain.logging.progress import current_stage, on_stage_change

            self.bar = Progress(
                TextColumn("[bold]step"),
                MofNCompleteColumn(),
                BarColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[stage]}"),
                console=console,
            )
            self.task = self.bar.add_task("train", total=total, completed=start, stage=current_stage())
            self.stages = contextlib.ExitStack()
            self.stages.enter_context(on_stage_change(self.show_stage))
            self.bar.start()

    def show_stage(self, stage: str) -> None:
        """Draw the new stage at once: a stage shorter than the bar's refresh interval is still seen."""
        self.bar.update(self.task, stage=stage, refresh=True)

    def update(self, step: int, metrics: dict[str, float]) -> None:
        elapsed = time.perf_counter() - self.start_time
        self.print(f"step {step}/{self.total} [{elapsed:.0f}s] {format_metrics(metrics)}")
        if self.bar is not None:
            self.bar.update(self.task, completed=step)

    def print(self, message: str) -> None:
        if self.bar is not None:
            self.bar.console.print(message, highlight=False, markup=False)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.stages.close()
            self.bar.update(self.task, stage="")
            self.bar.stop()
