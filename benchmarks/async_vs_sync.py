"""Asynchronous GRPO against synchronous GRPO: steps per hour and held-out accuracy, one process.

Usage:

    python benchmarks/async_vs_sync.py                       # 20 steps, seeds 0 and 1, every arm
    python benchmarks/async_vs_sync.py --steps 2 --seeds 0 --val-size 8     # smoke run
    python benchmarks/async_vs_sync.py --arms sync_colocated async_age1 --set grpo.prompts_per_step=4

The task is the GRPO quickstart (examples/configs/grpo_math.yaml: SmolLM2-135M-Instruct in fp32,
reasoning-gym 1-digit sums, math-verify reward; 8 prompts x 4 generations, 32 new tokens). Arms:

- sync_colocated: the quickstart as it is (cluster.backend=local, generation with the training
  weights, every core for whichever phase runs);
- sync_split: generation on its own Ray actor (generation.cpus_per_worker cores), the policy on
  another (cluster.cpus_per_worker); each waits for the other;
- async_age1: the same split with grpo.async_mode=true and max_trajectory_age_steps=1: the
  generation actor makes batch k+1 while the policy actor trains on batch k;
- async_local: async with cluster.backend=local: generation in a thread of the trainer's process,
  both sides sharing torch's threads over every core (decoding is memory-bound, training
  compute-bound: what one leaves idle the other may use).

On a C-core machine the split arms give the policy C - 1 cores and the generator 1 (--gen-cpus).
Every arm runs its seeds one after the other in this process (Ray arms on one local Ray instance
started here with the machine's cores). A step's time is the trainer's `timing/step` (collect or
take, make the batch, train, refit or publish: waiting for data counts, validation and checkpoints
do not); steps per hour = 3600 x steps / sum of step times. Held-out accuracy is `val/accuracy`
after the last step (greedy, --val-size held-out problems). The ratios printed are steps/hour of
each async arm over the best synchronous arm, by medians over seeds.

On a shared machine other processes' load distorts every arm (the load average is printed at the
start and the end of each run); compare runs made on an idle machine.
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
ARMS = ("sync_colocated", "sync_split", "async_age1", "async_local")


def arm_overrides(arm: str, cores: int, gen_cpus: int) -> dict[str, object]:
    if arm == "sync_colocated":
        return {"cluster.backend": "local"}
    asynchronous = {"grpo.async_mode": True, "grpo.max_trajectory_age_steps": 1}
    if arm == "async_local":
        return {"cluster.backend": "local", "generation.placement": "split", **asynchronous}
    split = {
        "cluster.backend": "ray",
        "cluster.cpus_per_worker": max(1, cores - gen_cpus),
        "generation.placement": "split",
        "generation.cpus_per_worker": gen_cpus,
    }
    if arm == "sync_split":
        return split
    return {**split, **asynchronous}


def run_arm(arm: str, seed: int, args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    from posttrain.config import load_config
    from posttrain.config.rl import GRPOConfig
    from posttrain.trainers.grpo import GRPOTrainer

    cores = os.cpu_count() or 1
    overrides = {
        "grpo.max_steps": args.steps,
        "grpo.seed": seed,
        "grpo.val_at_start": False,
        "grpo.val_every": args.steps,
        "data.validation.reasoning_gym.size": args.val_size,
        "checkpoint.enabled": False,
        "logging.run_dir": str(run_dir),
        "logging.tensorboard": False,
        "logging.plots": False,
        **arm_overrides(arm, cores, args.gen_cpus),
    }
    dotted = [f"{k}={v}" for k, v in overrides.items()] + list(args.set)
    cfg = load_config(GRPOConfig, str(QUICKSTART), dotted)
    print(f"  {arm} seed {seed}: load {loadavg()}", flush=True)
    trainer = GRPOTrainer(cfg)
    try:
        result = trainer.runtime.fit()
    finally:
        trainer.runtime.shutdown()
    steps = [h for h in result.history if "timing/step" in h]
    times = [h["timing/step"] for h in steps]
    accuracy = [h["val/accuracy"] for h in result.history if "val/accuracy" in h][-1]
    out = {
        "steps_per_hour": 3600 * len(times) / sum(times),
        "median_step_s": statistics.median(times),
        "val_accuracy": accuracy,
    }
    if arm.startswith("async"):
        out["overlap"] = statistics.mean(h.get("async/overlap_fraction", 0.0) for h in steps)
        out["age_mean"] = statistics.mean(h.get("async/age_mean", 0.0) for h in steps)
    print(
        f"  {arm} seed {seed}: {out['steps_per_hour']:.0f} steps/h, median step {out['median_step_s']:.2f} s, "
        f"val/accuracy {accuracy:.3f}; load {loadavg()}",
        flush=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--val-size", type=int, default=64, help="held-out problems (greedy)")
    parser.add_argument("--gen-cpus", type=int, default=1, help="cores of the generation actor (split arms)")
    parser.add_argument("--set", nargs="*", default=[], help="posttrain overrides for every arm (key=value)")
    args = parser.parse_args()

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; python {sys.version.split()[0]}")
    print(
        f"task: {QUICKSTART.relative_to(ROOT)}; {args.steps} steps; seeds {args.seeds}; overrides {args.set}"
    )
    if any(arm in ("sync_split", "async_age1") for arm in args.arms):
        import ray

        ray.init(
            address="local",  # a Ray instance of this benchmark's own, with this machine's cores
            num_cpus=os.cpu_count(),
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
        )
    results: dict[str, list[dict[str, float]]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="posttrain-async-bench-") as tmp:
        for seed in args.seeds:
            for arm in args.arms:
                results.setdefault(arm, []).append(run_arm(arm, seed, args, Path(tmp) / f"{arm}-{seed}"))

    print(f"\n{'arm':16} {'steps/h':>9} {'median step s':>14} {'val/accuracy':>14}   per seed")
    medians = {}
    for arm, runs in results.items():
        medians[arm] = statistics.median(r["steps_per_hour"] for r in runs)
        step = statistics.median(r["median_step_s"] for r in runs)
        accuracy = statistics.median(r["val_accuracy"] for r in runs)
        per_seed = ", ".join(f"{r['steps_per_hour']:.0f}/h acc {r['val_accuracy']:.3f}" for r in runs)
        print(f"{arm:16} {medians[arm]:9.0f} {step:14.2f} {accuracy:14.3f}   {per_seed}")
    for arm in ("async_age1", "async_local"):
        for run in results.get(arm, []):
            print(f"{arm}: overlap fraction {run['overlap']:.2f}, mean trajectory age {run['age_mean']:.2f}")
    sync = {arm: v for arm, v in medians.items() if arm.startswith("sync")}
    if sync:
        best = max(sync, key=sync.get)
        for arm in ("async_age1", "async_local"):
            if arm in medians:
                print(f"\n{arm} / best synchronous ({best}): {medians[arm] / sync[best]:.2f}x steps per hour")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
