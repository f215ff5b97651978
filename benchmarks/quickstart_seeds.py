"""The GRPO quickstart as a spread over seeds: held-out accuracy per seed, cold starts, unseen families.

Usage:

    python benchmarks/quickstart_seeds.py 0 1 2 3 4                     # 5 seeds of `posttrain grpo`
    python benchmarks/quickstart_seeds.py 0 1 --out /tmp/qs_smoke --set grpo.max_steps=2   # smoke run
    python benchmarks/quickstart_seeds.py 0 1 2 --out runs/gdpo_seeds --config examples/configs/grpo_gdpo.yaml \\
        --plot docs/img/gdpo_val_accuracy.png --compare runs/quickstart_seeds   # GDPO beside the quickstart

Each seed S runs the quickstart recipe (examples/configs/grpo_math.yaml, i.e. `posttrain grpo` with no
arguments) with `grpo.seed=S policy.seed=S` (grpo.seed picks the order of the training problems and
seeds every sampled rollout; policy.seed seeds torch in the policy workers) and any `--set KEY=VALUE`
overrides, one seed after the other, each in its own process and run directory <out>/seed_S. A seed
whose run directory holds its final checkpoint (checkpoints/step_<max_steps>) is skipped; an
unfinished one is run again with the same command, which resumes from its latest checkpoint, so a
session that stops can run the same command line to continue.

Then the base model and each seed's final checkpoint are scored, greedy, on two families the
quickstart never trains on (examples/configs/eval_quickstart_unseen.yaml: 64 two-digit sums;
eval_quickstart_unseen_products.yaml: 64 one-digit products) with the training run's own prompt
(system prompt, worked example turns, template and max_new_tokens passed to `posttrain eval`).
Scores already in <out>/eval/<model>/<family>/summary.json are reused (<model>: base, or
seed_S/step_N).

The table: per seed, held-out `val/accuracy` at each validation step (greedy, the quickstart's 64
validation problems, disjoint from its training problems), the first step with a non-zero mean
reward, the number of steps after step 3 whose `reward/mean` is exactly 0 (a cold start: no
gradient), the unseen families before -> after, and the wall time of the seed's `posttrain grpo`
invocations (a seed run in several invocations is marked `*`; an invocation that was killed is not
counted); then the mean over seeds and the worst seed (lowest final val/accuracy). The same numbers
go to <out>/summary.json. Run it on an otherwise idle machine: the wall times are the machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import cpu_model, loadavg  # benchmarks/machine.py (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "configs" / "grpo_math.yaml"
FAMILIES = {
    "2-digit sums": ROOT / "examples" / "configs" / "eval_quickstart_unseen.yaml",
    "1-digit products": ROOT / "examples" / "configs" / "eval_quickstart_unseen_products.yaml",
}
POSTTRAIN = [sys.executable, "-c", "import sys; from posttrain.cli import main; sys.exit(main(sys.argv[1:]))"]


def seed_overrides(args: argparse.Namespace, seed: int, run_dir: Path) -> list[str]:
    """The overrides of one seed's run: the user's, then the seed and the run directory."""
    return [*args.set, f"grpo.seed={seed}", f"policy.seed={seed}", f"logging.run_dir={run_dir}"]


def final_checkpoint(run_dir: Path, max_steps: int) -> Path | None:
    path = run_dir / "checkpoints" / f"step_{max_steps:06d}"
    return path if (path / "COMPLETE").is_file() else None


def run_logged(cmd: list[str], log: Path) -> int:
    """Run `cmd`, its output both on this console and appended to `log`; its exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
        return proc.wait()


def train_seed(args: argparse.Namespace, seed: int, max_steps: int) -> None:
    """Run (or resume) one seed's quickstart unless its final checkpoint exists; record its wall time."""
    run_dir = args.out / f"seed_{seed}"
    if final_checkpoint(run_dir, max_steps):
        print(f"seed {seed}: finished ({run_dir}), skipped", flush=True)
        return
    cmd = [*POSTTRAIN, "grpo", "--config", str(args.config), *seed_overrides(args, seed, run_dir)]
    print(f"seed {seed}: {' '.join(cmd[3:])}  (load {loadavg()})", flush=True)
    start = time.time()
    status = run_logged(cmd, args.out / f"seed_{seed}.log")
    wall = time.time() - start
    if status != 0:
        raise SystemExit(
            f"seed {seed}: posttrain grpo exited with {status}; see {args.out / f'seed_{seed}.log'}"
        )
    walls = args.out / f"seed_{seed}.wall.json"
    times = json.loads(walls.read_text()) if walls.is_file() else []
    walls.write_text(json.dumps([*times, wall]) + "\n")
    if not final_checkpoint(run_dir, max_steps):
        raise SystemExit(f"seed {seed}: the run ended without its final checkpoint step_{max_steps:06d}")


def eval_overrides(cfg: Any) -> list[str]:
    """`posttrain eval` overrides that give it the training run's prompt and reply length (JSON is YAML)."""
    data = cfg.data
    return [
        f"data.system_prompt={json.dumps(data.system_prompt)}",
        f"data.example_turns={json.dumps([t.model_dump() for t in data.example_turns])}",
        f"data.prompt_template={json.dumps(data.prompt_template)}",
        f"generation.max_new_tokens={cfg.generation.max_new_tokens}",
    ]


def evaluate(args: argparse.Namespace, cfg: Any, name: str, model: str) -> dict[str, float]:
    """Greedy accuracy of `model` on each unseen family (cached in <out>/eval/<name>/<family>)."""
    scores = {}
    for family, recipe in FAMILIES.items():
        out = args.out / "eval" / name / family.replace(" ", "_")
        summary = out / "summary.json"
        if not summary.is_file():
            cmd = [*POSTTRAIN, "eval", "--config", str(recipe), f"model={model}", f"output_dir={out}"]
            cmd += eval_overrides(cfg)
            if run_logged(cmd, args.out / "eval.log") != 0 or not summary.is_file():
                raise SystemExit(f"posttrain eval of {model} on {family} failed; see {args.out / 'eval.log'}")
        scores[family] = json.loads(summary.read_text())["accuracy"]
    return scores


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def seed_result(args: argparse.Namespace, seed: int, max_steps: int) -> dict[str, Any]:
    """What one finished seed measured: validation curve, cold start, wall time."""
    rows = read_jsonl(args.out / f"seed_{seed}" / "metrics.jsonl")
    val = {int(r["step"]): r["val/accuracy"] for r in rows if "val/accuracy" in r}
    rewards = {int(r["step"]): r["reward/mean"] for r in rows if "reward/mean" in r}
    walls_file = args.out / f"seed_{seed}.wall.json"
    walls = json.loads(walls_file.read_text()) if walls_file.is_file() else []
    return {
        "seed": seed,
        "val_accuracy": val,
        "final_val_accuracy": val.get(max_steps, val[max(val)] if val else None),
        "first_rewarded_step": min((s for s, r in rewards.items() if r > 0), default=None),
        "zero_reward_steps_after_3": sum(1 for s, r in rewards.items() if s > 3 and r == 0),
        "steps": len(rewards),
        "wall_s": sum(walls) if walls else None,
        "invocations": len(walls),
    }


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def fmt_wall(seconds: float | None) -> str:
    return "-" if seconds is None else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def print_table(results: list[dict], base: dict[str, float], val_steps: list[int]) -> None:
    head = ["seed", *[f"val@{s}" for s in val_steps], "1st r>0", "r=0 >3"]
    head += [f"{f} (base {fmt_pct(base[f])})" for f in FAMILIES] + ["wall"]
    lines = []
    for r in results:
        wall = fmt_wall(r["wall_s"]) + ("*" if r["invocations"] > 1 else "")
        lines.append(
            [
                str(r["seed"]),
                *[fmt_pct(r["val_accuracy"].get(s)) for s in val_steps],
                str(r["first_rewarded_step"]),
                str(r["zero_reward_steps_after_3"]),
                *[f"{fmt_pct(base[f])} -> {fmt_pct(r['unseen'][f])}" for f in FAMILIES],
                wall,
            ]
        )

    def mean(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    lines.append(
        [
            "mean",
            *[fmt_pct(mean([r["val_accuracy"].get(s) for r in results])) for s in val_steps],
            "-",
            f"{mean([r['zero_reward_steps_after_3'] for r in results]):.1f}",
            *[f"{fmt_pct(base[f])} -> {fmt_pct(mean([r['unseen'][f] for r in results]))}" for f in FAMILIES],
            fmt_wall(mean([r["wall_s"] for r in results])),
        ]
    )
    worst = min(results, key=lambda r: r["final_val_accuracy"] if r["final_val_accuracy"] is not None else -1)
    lines.append(["worst", *lines[results.index(worst)][1:]])
    lines[-1][0] = f"worst (seed {worst['seed']})"
    widths = [max(len(row[i]) for row in [head, *lines]) for i in range(len(head))]
    for row in [head, *lines]:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))


def plot_seeds(
    path: Path,
    runs: dict[str, list[dict]],
    title: str,
    baselines: dict[str, float] | None = None,
    ylabel: str = "held-out accuracy (%, greedy)",
) -> None:
    """Held-out accuracy against step: per recipe the mean over its seeds (line), the range between its
    worst and best seed (band) and each seed (thin lines); each of `baselines` (label: accuracy in
    [0, 1], e.g. a blind policy's) as a dashed horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for (label, results), color in zip(runs.items(), ["tab:blue", "tab:orange", "tab:green"], strict=False):
        steps = sorted({s for r in results for s in r["val_accuracy"]})
        table = [[100 * r["val_accuracy"][s] for r in results if s in r["val_accuracy"]] for s in steps]
        for r in results:
            curve = sorted(r["val_accuracy"].items())
            ax.plot([s for s, _ in curve], [100 * v for _, v in curve], color=color, lw=0.6, alpha=0.5)
        ax.fill_between(steps, [min(v) for v in table], [max(v) for v in table], color=color, alpha=0.15)
        mean_curve = [statistics.fmean(v) for v in table]
        ax.plot(steps, mean_curve, color=color, lw=2, marker="o", label=f"{label} ({len(results)} seeds)")
    for (label, value), style in zip((baselines or {}).items(), ["--", ":", "-."], strict=False):
        ax.axhline(100 * value, color="grey", ls=style, lw=1, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("seeds", nargs="+", type=int, help="grpo.seed values, run one after the other")
    parser.add_argument(
        "--out", type=Path, default=Path("runs/quickstart_seeds"), help="one run dir per seed"
    )
    parser.add_argument(
        "--config", type=Path, default=QUICKSTART, help="the recipe (default: the quickstart's)"
    )
    parser.add_argument(
        "--plot", type=Path, help="draw the seeds' held-out accuracy (mean, range, each seed) to this PNG"
    )
    parser.add_argument(
        "--compare",
        type=Path,
        action="append",
        default=[],
        metavar="OUT",
        help="with --plot: also draw the seeds of another run of this script (its --out folder)",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every seed's run"
    )
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    from posttrain.config import load_config
    from posttrain.config.rl import GRPOConfig

    cfg = load_config(GRPOConfig, args.config, [*args.set, "grpo.seed=0"])
    max_steps = cfg.grpo.max_steps
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; load {loadavg()}", flush=True)
    print(f"recipe: {args.config} {' '.join(args.set)}; seeds {args.seeds}; out {args.out}", flush=True)
    for seed in args.seeds:
        train_seed(args, seed, max_steps)

    base = evaluate(args, cfg, "base", cfg.policy.model_name)
    results = []
    for seed in args.seeds:
        result = seed_result(args, seed, max_steps)
        checkpoint = final_checkpoint(args.out / f"seed_{seed}", max_steps)
        assert checkpoint is not None
        result["unseen"] = evaluate(args, cfg, f"seed_{seed}/{checkpoint.name}", str(checkpoint))
        results.append(result)
    val_steps = sorted({s for r in results for s in r["val_accuracy"]})
    print(f"\nmachine: {cpu_model()}; load {loadavg()}; recipe {args.config.name} {' '.join(args.set)}")
    print(
        "val@N: held-out accuracy (%) at step N; 1st r>0: first step with reward/mean > 0; r=0 >3: steps after "
        "step 3 with reward/mean exactly 0; unseen families: greedy accuracy (%) base -> final checkpoint; "
        "wall: posttrain grpo time (* several invocations)"
    )
    print_table(results, base, val_steps)
    summary = {"machine": cpu_model(), "recipe": str(args.config), "overrides": args.set, "base_unseen": base}
    summary["seeds"] = results
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nwrote {args.out / 'summary.json'}")
    if args.plot:
        runs = {run_label(args.config, args.set, args.out): results}
        for other in args.compare:
            other_summary = json.loads((other / "summary.json").read_text())
            label = run_label(Path(other_summary["recipe"]), other_summary.get("overrides", []), other)
            runs[label if label not in runs else f"{label} ({other.name})"] = [
                {**r, "val_accuracy": {int(s): v for s, v in r["val_accuracy"].items()}}
                for r in other_summary["seeds"]
            ]
        plot_seeds(args.plot, runs, f"held-out accuracy, {cpu_model()}")


def run_label(recipe: Path, overrides: list[str], out: Path) -> str:
    """A run's name in the plot's legend: the recipe and its overrides, or its folder when it has
    none (two runs of one recipe then stay two series)."""
    return f"{recipe.stem} {' '.join(overrides)}" if overrides else f"{recipe.stem} ({out.name})"


if __name__ == "__main__":
    main()
