"""Rollouts and GRPO steps when the environment waits: turn barrier, continuous, asynchronous GRPO.

    python benchmarks/env_latency.py                       # the full table (sized for <= 15 min, 2 cores)
    python benchmarks/env_latency.py --latencies 200 --episodes 8 --rounds 1 --steps 2 \\
        --grpo-arms sync_continuous                         # a smoke run

The environment is the sliding puzzle (2x2 boards, at most 3 moves, one move a turn: multi-turn
episodes) behind the `latency` wrapper (posttrain.environments.latency): every step call waits
`latency_ms` (--distribution fixed, or a heavy tail with that median: lognormal, pareto) before the
puzzle scores it. The model is SmolLM2-135M-Instruct (fp32, HF sampler), temperature 1.

Part 1, rollouts (`run_rollouts`, one process, environment in process, --concurrency calls in
flight; one untimed warm-up round of each loop first): episodes per second of
  - barrier:    the turn-by-turn loop (every episode generates its turn, then one step call for all);
  - continuous: the continuous loop (episodes join and leave one decode batch of --batch-size rows;
                environment calls run on threads while the others decode).
Part 2, GRPO (`GRPOTrainer` on examples/configs/grpo_sliding_puzzle.yaml, cluster.backend=local,
no validation, no checkpoints): steps per hour of
  - sync_barrier:    environment.turn_barrier=true;
  - sync_continuous: environment.turn_barrier=false;
  - async:           sync_continuous with generation.placement=split and grpo.async_mode=true
                     (max_trajectory_age_steps=1, truncated importance correction): generation and
                     its environment calls run in a thread of the trainer's process while it trains.
Steps per hour = 3600 x (steps - 1) / (sum of `timing/step` after the first): the first step of
every arm (model warm-up; async: nothing to overlap yet) is left out. Each arm runs in a process of
its own.

Targets (issue #34) on 2 cores: continuous keeps >= 90% of its zero-latency episodes/s at 200 ms;
async >= 1.4x the best synchronous arm's steps per hour at 200 ms. Both ratios are printed.
The machine (CPU model, cores) and the load average (start, end, and per arm) are printed: on a
shared machine other processes' load distorts every arm; compare runs made on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_model, loadavg  # benchmarks/machine.py (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "configs" / "grpo_sliding_puzzle.yaml"
PUZZLE = {"min_size": 2, "max_size": 2, "max_shuffle_moves": 3, "max_moves": 3, "action_prefix": True}
GRPO_ARMS = ("sync_barrier", "sync_continuous", "async")


def latency_kwargs(latency_ms: float, args: argparse.Namespace) -> dict:
    """The `latency` environment's kwargs: the puzzle behind `latency_ms` of the chosen distribution."""
    return {
        "inner": "sliding_puzzle",
        "inner_kwargs": PUZZLE,
        "latency_ms": latency_ms,
        "distribution": args.distribution,
        "seed": 0,
    }


def rollout_rates(latency_ms: float, args: argparse.Namespace, model: tuple) -> dict[str, float]:
    """Episodes per second (median over rounds) of the barrier and continuous loops at `latency_ms`."""
    from posttrain.environments.group import EnvironmentGroup
    from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment
    from posttrain.generation.sampling import SamplingParams
    from posttrain.rollout.rollout import run_rollouts

    generator, tokenizer = model
    tasks = SlidingPuzzleEnvironment(**PUZZLE).generate_tasks(args.episodes // args.group, seed=0)
    rates: dict[str, list[float]] = {"barrier": [], "continuous": []}
    with EnvironmentGroup(
        "latency",
        latency_kwargs(latency_ms, args),
        backend="local",
        max_concurrent_steps=args.concurrency,
    ) as env:
        for r in range(args.rounds):
            for arm in rates:
                start = time.perf_counter()
                out = run_rollouts(
                    tasks,
                    generations_per_prompt=args.group,
                    generator=generator,
                    environment=env,
                    tokenizer=tokenizer,
                    params=SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=r),
                    batch_size=args.batch_size,
                    max_turns=PUZZLE["max_moves"],
                    max_seq_len=512,
                    turn_barrier=arm == "barrier",
                )
                rates[arm].append(len(out.trajectories) / (time.perf_counter() - start))
                print(
                    f"  rollouts {latency_ms:6.0f} ms {arm:10} round {r}: {rates[arm][-1]:6.2f} episodes/s, "
                    f"{out.env_metrics['episode/turns_mean']:.2f} turns/episode; load {loadavg()}",
                    flush=True,
                )
    return {arm: statistics.median(v) for arm, v in rates.items()}


def grpo_overrides(arm: str, latency_ms: float, args: argparse.Namespace, run_dir: Path) -> list[str]:
    """The dotted overrides of one GRPO arm at `latency_ms` on the sliding-puzzle recipe."""
    overrides = {
        "policy.model_name": args.model,
        "environment.name": "latency",
        "environment.kwargs": json.dumps(latency_kwargs(latency_ms, args)),
        "environment.max_turns": PUZZLE["max_moves"],
        "environment.max_concurrent_steps": args.concurrency,
        "environment.turn_barrier": arm == "sync_barrier",
        "generation.batch_size": args.batch_size,
        "generation.max_new_tokens": args.max_new_tokens,
        "grpo.max_steps": args.steps,
        "grpo.prompts_per_step": args.episodes // args.group,
        "grpo.generations_per_prompt": args.group,
        "grpo.seed": 0,
        "grpo.val_at_start": False,
        "grpo.val_every": 10 * args.steps,
        "data.validation": "null",
        "checkpoint.enabled": False,
        "cluster.backend": "local",
        "logging.run_dir": str(run_dir),
        "logging.tensorboard": False,
        "logging.plots": False,
    }
    if arm == "async":
        overrides.update(
            {
                "generation.placement": "split",
                "grpo.async_mode": True,
                "grpo.max_trajectory_age_steps": 1,
                "loss.importance_correction": "truncated",
            }
        )
    return [f"{k}={v}" for k, v in overrides.items()]


def grpo_step_times(arm: str, latency_ms: float, args: argparse.Namespace, run_dir: Path) -> list[float]:
    """`timing/step` of every step of one GRPO arm at `latency_ms` (run in this process)."""
    from posttrain.config import load_config
    from posttrain.config.rl import GRPOConfig
    from posttrain.trainers.grpo import GRPOTrainer

    cfg = load_config(GRPOConfig, str(RECIPE), grpo_overrides(arm, latency_ms, args, run_dir))
    trainer = GRPOTrainer(cfg)
    try:
        result = trainer.runtime.fit()
    finally:
        trainer.runtime.shutdown()
    return [h["timing/step"] for h in result.history if "timing/step" in h]


def grpo_rate(arm: str, latency_ms: float, args: argparse.Namespace, run_dir: Path) -> float:
    """Steps per hour of one GRPO arm at `latency_ms`, its first step left out. Each arm runs in a
    fresh process: nothing one arm leaves behind (threads, memory, caches) reaches the next."""
    child = {"arm": arm, "latency_ms": latency_ms, "run_dir": str(run_dir), "args": vars(args)}
    proc = subprocess.run(
        [sys.executable, __file__, "--grpo-child", json.dumps(child)], stdout=subprocess.PIPE, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"GRPO arm {arm} at {latency_ms} ms exited with {proc.returncode}")
    times = json.loads(proc.stdout.strip().splitlines()[-1])[1:]
    rate = 3600 * len(times) / sum(times)
    print(
        f"  grpo {latency_ms:6.0f} ms {arm:15}: {rate:6.0f} steps/h (steps {[round(t, 1) for t in times]} s); "
        f"load {loadavg()}",
        flush=True,
    )
    return rate


def print_tables(
    latencies: list[float], rollouts: dict[float, dict[str, float]], grpo: dict[float, dict[str, float]]
) -> None:
    """The two tables and the issue's two ratios where their numbers were measured."""
    if rollouts:
        print(f"\n{'latency ms':>10} {'barrier ep/s':>13} {'continuous ep/s':>16} {'continuous vs 0 ms':>19}")
        base = rollouts.get(0.0, {}).get("continuous")
        for ms in latencies:
            row = rollouts[ms]
            kept = f"{row['continuous'] / base:.0%}" if base else "n/a"
            print(f"{ms:10.0f} {row['barrier']:13.2f} {row['continuous']:16.2f} {kept:>19}")
    if grpo:
        arms = list(next(iter(grpo.values())))
        print(
            f"\n{'latency ms':>10} "
            + " ".join(f"{a + ' steps/h':>22}" for a in arms)
            + f" {'async / best sync':>18}"
        )
        for ms in latencies:
            row = grpo[ms]
            sync = [v for a, v in row.items() if a.startswith("sync")]
            ratio = f"{row['async'] / max(sync):.2f}x" if "async" in row and sync else "n/a"
            print(f"{ms:10.0f} " + " ".join(f"{row[a]:22.0f}" for a in arms) + f" {ratio:>18}")
    print("targets (2 cores): continuous >= 90% of its 0 ms episodes/s at 200 ms; async >= 1.4x at 200 ms")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--latencies", type=float, nargs="+", default=[0, 50, 200, 1000], help="ms")
    parser.add_argument("--distribution", choices=("fixed", "lognormal", "pareto"), default="fixed")
    parser.add_argument(
        "--episodes", type=int, default=16, help="episodes per rollout / GRPO step (tasks x G)"
    )
    parser.add_argument("--group", type=int, default=4, help="G")
    parser.add_argument(
        "--batch-size", type=int, default=8, help="decode rows (continuous) / prompts per call"
    )
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4, help="environment.max_concurrent_steps")
    parser.add_argument("--rounds", type=int, default=2, help="rollout rounds per latency and loop")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per arm (the first is not counted)")
    parser.add_argument("--grpo-arms", nargs="*", choices=GRPO_ARMS, default=list(GRPO_ARMS))
    parser.add_argument("--skip-rollouts", action="store_true")
    parser.add_argument("--grpo-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.grpo_child:  # one GRPO arm, in a process of its own (`grpo_rate`): its step times on stdout
        child = json.loads(args.grpo_child)
        arm_args = argparse.Namespace(**child["args"])
        times = grpo_step_times(child["arm"], child["latency_ms"], arm_args, Path(child["run_dir"]))
        print(json.dumps(times))
        return
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is not counted)")

    import torch

    from posttrain.generation.text_generation import LocalGenerator
    from posttrain.modeling.tokenizer import load_tokenizer
    from posttrain.models.hub import resolve_model

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}")
    print(f"python {sys.version.split()[0]}; load average at start {loadavg()}")
    print(
        f"model {args.model}; sliding puzzle {PUZZLE}; {args.episodes} episodes (G={args.group}); "
        f"batch {args.batch_size}; {args.max_new_tokens} new tokens/turn; latency {args.distribution}; "
        f"{args.concurrency} environment calls in flight"
    )
    started = time.perf_counter()
    rollouts: dict[float, dict[str, float]] = {}
    if not args.skip_rollouts:
        path = resolve_model(args.model)
        tokenizer = load_tokenizer(path)
        model = (LocalGenerator(path, tokenizer, backend="hf", device="cpu", max_model_len=512), tokenizer)
        print("warm-up (not counted):")
        rollout_rates(0.0, argparse.Namespace(**{**vars(args), "rounds": 1}), model)
        for ms in args.latencies:
            rollouts[ms] = rollout_rates(ms, args, model)
    grpo: dict[float, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="posttrain-env-latency-") as tmp:
        for ms in args.latencies if args.grpo_arms else []:
            grpo[ms] = {
                arm: grpo_rate(arm, ms, args, Path(tmp) / f"{arm}-{ms:.0f}") for arm in args.grpo_arms
            }
    print_tables(args.latencies, rollouts, grpo)
    print(f"total {time.perf_counter() - started:.0f} s; load average at the end {loadavg()}")


if __name__ == "__main__":
    main()
