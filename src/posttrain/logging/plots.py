"""PNG plots of a run's main curves (loss, reward, accuracy, KL, logprob error, step time), read back
from its metrics.jsonl into <run_dir>/plots."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    if not path.is_file():
        return series
    for line in path.read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key not in ("step", "time") and isinstance(value, int | float):
                series.setdefault(key, []).append((row["step"], float(value)))
    return series


def plot_curves(run_dir: Path, keys: list[str]) -> list[Path]:
    """One PNG per metric in `keys` that the run logged; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = read_metrics(run_dir / "metrics.jsonl")
    written = []
    for key in keys:
        points = series.get(key)
        if not points:
            continue
        steps, values = zip(*points, strict=True)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(steps, values, marker="o" if len(points) < 30 else None)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_title(f"{key} ({run_dir.name})")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = _save(plt, fig, run_dir, f"{key.replace('/', '_')}.png")
        written.append(path)
    return written


def _pyplot():  # noqa: ANN202 - matplotlib.pyplot module
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_timing_breakdown(run_dir: Path) -> Path | None:
    """Stacked bars of seconds per phase (`timing/<phase>` except the total `timing/step`) per step."""
    series = read_metrics(run_dir / "metrics.jsonl")
    phases = sorted(k for k in series if k.startswith("timing/") and k != "timing/step")
    if not phases:
        return None
    plt = _pyplot()
    steps = sorted({s for k in phases for s, _ in series[k]})
    fig, ax = plt.subplots(figsize=(7, 3.8))
    bottom = [0.0] * len(steps)
    for key in phases:
        by_step = dict(series[key])
        values = [by_step.get(s, 0.0) for s in steps]
        ax.bar(steps, values, bottom=bottom, label=key.removeprefix("timing/"), width=0.8)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title(f"step-time breakdown ({run_dir.name})")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return _save(plt, fig, run_dir, "timing_breakdown.png")


def plot_summary(run_dir: Path, keys: list[str]) -> Path | None:
    """One figure with a panel per logged metric of `keys`: the run at a glance."""
    series = read_metrics(run_dir / "metrics.jsonl")
    present = [k for k in keys if series.get(k)]
    if not present:
        return None
    plt = _pyplot()
    cols = min(3, len(present))
    rows = (len(present) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3 * rows), squeeze=False)
    for ax, key in zip(axes.flat, present, strict=False):
        steps, values = zip(*series[key], strict=True)
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3)
        ax.set_title(key, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    return _save(plt, fig, run_dir, "summary.png")


def _save(plt, fig, run_dir: Path, name: str) -> Path:
    """Write `fig` to <run_dir>/plots/<name> and free it."""
    path = run_dir / "plots" / name
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_run(run_dir: Path, keys: list[str]) -> list[Path]:
    """End-of-run plots: one PNG per metric of `keys`, a summary grid and the step-time breakdown."""
    written = plot_curves(run_dir, keys)
    extra = [plot_summary(run_dir, keys), plot_timing_breakdown(run_dir)]
    return written + [p for p in extra if p is not None]
