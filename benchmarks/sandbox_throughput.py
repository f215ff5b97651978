"""Sandbox throughput: trivial executions per second through SandboxPool (target >= 20/s on 2 cores).

Usage:

    python benchmarks/sandbox_throughput.py                        # backend auto, 2 workers, 200 runs
    python benchmarks/sandbox_throughput.py --backend unshare --workers 2 --runs 200 --rounds 3

Each run is a fresh sandboxed `python -I -S` (new namespaces, allowlisted root, rlimits, seccomp)
executing `print(sum(range(100)))`; the pool keeps `--workers` interpreters pre-started. Reported
per round: runs/s of `run_many` over `--runs` programs (wall clock, including the process starts
the pool overlaps with the runs) and the CPU time per run, two ways:

- cgroup: the script moves itself into a fresh cgroup (cgroup v2, where it can: root, a cgroup2
  mount) before the pool starts; its `cpu.stat` usage counts this process and every process
  under it, reaped or not. This is the figure to use.
- getrusage: RUSAGE_SELF + RUSAGE_CHILDREN around the round. It misses processes their parent
  never reaped: bubblewrap's outer process gets the exit code over an eventfd and can exit
  before its pid 1 is reaped, so the interpreter's CPU is lost (bwrap shows ~2 ms, unshare ~30).

CPU per run is what bounds throughput on a busy machine: N cores give at most N / (CPU per run)
runs/s. Then the median wall time of a single
`run` when the pool is idle. The protections in force are printed first. Other processes on the
machine affect the wall-clock figures (the load average is printed before and after).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_model  # benchmarks/machine.py (the script's folder is on sys.path)

from posttrain.sandbox import SandboxPool

CODE = "print(sum(range(100)))"


def cpu_s() -> tuple[float, float]:
    """(this process's, its reaped children's) user + system CPU seconds so far."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@contextlib.contextmanager
def own_cgroup():
    """Move this process into a fresh cgroup v2 child of its own; yield a function giving the CPU
    seconds used in it so far (every descendant counts), or None where that is not possible."""
    mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    root = next((m[1] for m in mounts if m[2] == "cgroup2"), None)
    here = next(
        (x[3:] for x in Path("/proc/self/cgroup").read_text().splitlines() if x.startswith("0::")), None
    )
    if root is None or here is None:
        yield None
        return
    home = Path(root + here)
    mine = home / f"posttrain-sandbox-bench-{os.getpid()}"
    try:
        mine.mkdir()
        (mine / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as err:
        print(f"no cgroup of its own ({err}): CPU per run from getrusage only")
        yield None
        return

    def used() -> float:
        stat = dict(line.split() for line in (mine / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6

    try:
        yield used
    finally:
        (home / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(50):  # the last sandboxes may still be exiting
            try:
                mine.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def main() -> None:
    """Parse arguments, print the protections, then each round's rate and the best/median."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="auto", choices=["auto", "bwrap", "unshare"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {cpu_model()}; {os.cpu_count()} logical CPUs; load average {os.getloadavg()}")
    with own_cgroup() as cgroup_cpu:
        measure(args, cgroup_cpu)


def measure(args: argparse.Namespace, cgroup_cpu) -> None:
    """The rounds and the idle-pool latency; ``cgroup_cpu``: see ``own_cgroup``."""
    with SandboxPool(backend=args.backend, workers=args.workers) as pool:
        print(pool.describe())
        pool.run_many([CODE] * (2 * args.workers))  # warm up
        rates, cpu_ms, rusage_ms = [], [], []
        for i in range(args.rounds):
            self0, kids0 = cpu_s()
            group0 = cgroup_cpu() if cgroup_cpu else 0.0
            start = time.perf_counter()
            results = pool.run_many([CODE] * args.runs)
            elapsed = time.perf_counter() - start
            self1, kids1 = cpu_s()
            group1 = cgroup_cpu() if cgroup_cpu else 0.0
            bad = [r for r in results if not r.ok or r.stdout != "4950\n"]
            if bad:
                raise SystemExit(f"{len(bad)} runs failed, e.g. {bad[0]}")
            rates.append(args.runs / elapsed)
            parent, children = 1000 * (self1 - self0) / args.runs, 1000 * (kids1 - kids0) / args.runs
            rusage_ms.append(parent + children)
            cpu_ms.append(1000 * (group1 - group0) / args.runs if cgroup_cpu else rusage_ms[-1])
            group = f"cgroup {cpu_ms[-1]:.1f} ms, " if cgroup_cpu else ""
            print(
                f"round {i + 1}: {args.runs} runs in {elapsed:.2f} s = {rates[-1]:.1f} runs/s; CPU per run: "
                f"{group}getrusage {rusage_ms[-1]:.1f} ms (pool process {parent:.1f}, reaped children "
                f"{children:.1f})"
            )
        latency = []
        for _ in range(20):
            time.sleep(0.05)  # let the spare start: this is the latency of a call to an idle pool
            latency.append(pool.run(CODE).wall_s)
    cpu = statistics.median(cpu_ms)
    print(
        f"throughput ({args.workers} workers): best {max(rates):.1f} runs/s, median "
        f"{statistics.median(rates):.1f} runs/s; CPU per run median {cpu:.1f} ms "
        f"({'cgroup' if cgroup_cpu else 'getrusage'}; at most "
        f"{1000 * (os.cpu_count() or 1) / cpu:.0f} runs/s on {os.cpu_count()} idle CPUs); idle-pool "
        f"run latency median {1000 * statistics.median(latency):.1f} ms; load average {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
