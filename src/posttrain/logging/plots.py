"""PNG plots of a run's main curves, read back from its metrics.jsonl."""

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
        path = run_dir / "plots" / f"{key.replace('/', '_')}.png"
        path.parent.mkdir(exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
