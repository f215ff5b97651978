"""GRPO with and without the rows whose gradient is 0 in the backward: time per phase, one process.

Usage:

    python benchmarks/skip_zero_advantage.py                    # the quickstart, 10 steps, seed 0
    python benchmarks/skip_zero_advantage.py --steps 2           # smoke run
    python benchmarks/skip_zero_advantage.py --config examples/configs/grpo_calculator.yaml

`loss.skip_zero_advantage_rows` (docs/algorithms.md, "Rows that cannot move the policy") leaves out
of the policy's forward and backward every row whose advantage is 0 on all its tokens (a GRPO group
whose rewards are all equal) when the loss is the advantage term alone: the same update, less
compute. Two arms run the same recipe, seed and steps one after the other in this process, with the
flag off (every row trained, the baseline) and on. Both arms draw the same prompts; their
rollouts agree while their weights do (the updates are equal up to fp32 rounding). Per arm: the
median of `timing/training` (the policy's update, refit included) and of `timing/step`, the mean
`skipped_row_fraction` and `reward/zero_variance_fraction`; then the ratios off / on. No validation,
no checkpoints (a recipe with one dataset: `data.validation` is set to null). On a shared machine other processes' load distorts both arms (the load average is
printed); compare runs made on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_model, loadavg  # benchmarks/machine.py (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "configs" / "grpo_math.yaml"


def run_arm(skip: bool, args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    from posttrain.config import load_config
    from posttrain.config.rl import GRPOConfig
    from posttrain.trainers.grpo import GRPOTrainer

    overrides = {
        "grpo.max_steps": args.steps,
        "grpo.seed": args.seed,
        "grpo.val_at_start": False,
        "grpo.val_every": args.steps + 1000,
        "data.validation": "null",
        "loss.skip_zero_advantage_rows": skip,
        "checkpoint.enabled": False,
        "logging.run_dir": str(run_dir),
        "logging.tensorboard": False,
        "logging.plots": False,
    }
    dotted = [f"{k}={v}" for k, v in overrides.items()] + list(args.set)
    cfg = load_config(GRPOConfig, args.config, dotted)
    print(f"  skip={skip}: load {loadavg()}", flush=True)
    trainer = GRPOTrainer(cfg)
    try:
        result = trainer.runtime.fit()
    finally:
        trainer.runtime.shutdown()
    steps = [h for h in result.history if "timing/step" in h]
    out = {
        "training_s": statistics.median(h["timing/training"] for h in steps),
        "step_s": statistics.median(h["timing/step"] for h in steps),
        "skipped": statistics.mean(h.get("skipped_row_fraction", 0.0) for h in steps),
        "zero_variance": statistics.mean(h["reward/zero_variance_fraction"] for h in steps),
        "reward": statistics.mean(h["reward/mean"] for h in steps),
    }
    print(
        f"  skip={skip}: median training {out['training_s']:.2f} s, median step {out['step_s']:.2f} s, "
        f"rows skipped {out['skipped']:.2f}, zero-variance groups {out['zero_variance']:.2f}, "
        f"reward {out['reward']:.3f}; load {loadavg()}",
        flush=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(QUICKSTART), help="a GRPO recipe")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], help="posttrain overrides for both arms (key=value)")
    args = parser.parse_args()

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; python {sys.version.split()[0]}")
    print(f"task: {args.config}; {args.steps} steps; seed {args.seed}; overrides {args.set}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="posttrain-skip-bench-") as tmp:
        off = run_arm(False, args, Path(tmp) / "off")
        on = run_arm(True, args, Path(tmp) / "on")
    print(f"\n{'arm':22} {'training s':>11} {'step s':>8} {'rows skipped':>13} {'reward':>8}")
    for name, r in (("every row (baseline)", off), ("skip zero-advantage", on)):
        print(f"{name:22} {r['training_s']:11.2f} {r['step_s']:8.2f} {r['skipped']:13.2f} {r['reward']:8.3f}")
    print(
        f"\ntraining phase: {off['training_s'] / on['training_s']:.2f}x faster; "
        f"whole step: {off['step_s'] / on['step_s']:.2f}x faster"
    )
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
