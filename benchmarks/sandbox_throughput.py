"""Sandbox throughput: trivial executions per second through SandboxPool (target >= 20/s on 2 cores).

Usage:

    python benchmarks/sandbox_throughput.py                        # backend auto, 2 workers, 200 runs
    python benchmarks/sandbox_throughput.py --backend unshare --workers 2 --runs 200 --rounds 3

Each run is a fresh sandboxed `python -I -S` (new namespaces, allowlisted root, rlimits) executing
`print(sum(range(100)))`; the pool keeps `--workers` interpreters pre-started. Reported per round:
runs/s of `run_many` over `--runs` programs (wall clock, including the process starts the pool
overlaps with the runs), and the median wall time of a single `run` when the pool is idle.
The protections in force are printed first. Other processes on the machine affect the figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_model  # benchmarks/machine.py (the script's folder is on sys.path)

from posttrain.sandbox import SandboxPool

CODE = "print(sum(range(100)))"


def main() -> None:
    """Parse arguments, print the protections, then each round's rate and the best/median."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="auto", choices=["auto", "bwrap", "unshare"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {cpu_model()}; {os.cpu_count()} logical CPUs; load average {os.getloadavg()}")
    with SandboxPool(backend=args.backend, workers=args.workers) as pool:
        print(pool.describe())
        pool.run_many([CODE] * (2 * args.workers))  # warm up
        rates = []
        for i in range(args.rounds):
            start = time.perf_counter()
            results = pool.run_many([CODE] * args.runs)
            elapsed = time.perf_counter() - start
            bad = [r for r in results if not r.ok or r.stdout != "4950\n"]
            if bad:
                raise SystemExit(f"{len(bad)} runs failed, e.g. {bad[0]}")
            rates.append(args.runs / elapsed)
            print(f"round {i + 1}: {args.runs} runs in {elapsed:.2f} s = {rates[-1]:.1f} runs/s")
        latency = []
        for _ in range(20):
            time.sleep(0.05)  # let the spare start: this is the latency of a call to an idle pool
            latency.append(pool.run(CODE).wall_s)
    print(
        f"throughput ({args.workers} workers): best {max(rates):.1f} runs/s, median "
        f"{statistics.median(rates):.1f} runs/s; idle-pool run latency median "
        f"{1000 * statistics.median(latency):.1f} ms"
    )


if __name__ == "__main__":
    main()
