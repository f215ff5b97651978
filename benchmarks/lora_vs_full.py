"""LoRA against full fine-tuning: peak memory of the training process and seconds per step.

Usage:

    python benchmarks/lora_vs_full.py                     # GRPO 6 steps and SFT 20 steps, each arm
    python benchmarks/lora_vs_full.py --grpo-steps 2 --sft-steps 4     # smoke run

Each arm is a child process `python -m posttrain.cli <grpo|sft> --config <recipe> ...` with
cluster.backend=local, so the policy (model, optimizer, activations) lives in that process and its
peak resident memory (`ru_maxrss` of the finished child) is the policy worker's. Arms:

- grpo_full: examples/configs/grpo_math.yaml (the GRPO quickstart);
- grpo_lora: examples/configs/grpo_lora.yaml (the same with LoRA r=16 on all linear layers);
- sft_full / sft_lora: examples/configs/sft.yaml / sft_lora.yaml.

Validation, checkpoints and plots are off. Seconds per step: the median of `timing/step` (GRPO: its
`timing/training` too) over the steps after the first. The ratios LoRA / full are printed at the end.
Arms run one after the other; on a shared machine other processes distort the times (the load
average is printed before each arm).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {
    "grpo_full": ("grpo", "examples/configs/grpo_math.yaml"),
    "grpo_lora": ("grpo", "examples/configs/grpo_lora.yaml"),
    "sft_full": ("sft", "examples/configs/sft.yaml"),
    "sft_lora": ("sft", "examples/configs/sft_lora.yaml"),
}


def run_arm(name: str, steps: int, workdir: Path) -> dict[str, float]:
    command, recipe = RECIPES[name]
    run_dir = workdir / name
    overrides = [
        f"logging.run_dir={run_dir}",
        "logging.tensorboard=false",
        "logging.plots=false",
        "cluster.backend=local",
        "checkpoint.enabled=false",
        "data.validation=null",
        f"{command}.max_steps={steps}",
    ]
    print(f"{name}: load average {os.getloadavg()[0]:.2f}", flush=True)
    subprocess.run(
        [sys.executable, "-m", "posttrain.cli", command, "--config", str(ROOT / recipe), *overrides],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "timing/step" in r][1:]  # the first step warms up
    out = {
        "peak_gib": peak_kib / 2**20,
        "step_s": statistics.median(r["timing/step"] for r in steps_rows),
    }
    if steps_rows and "timing/training" in steps_rows[0]:
        out["training_s"] = statistics.median(r["timing/training"] for r in steps_rows)
    print(f"  {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in out.items()), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grpo-steps", type=int, default=6)
    parser.add_argument("--sft-steps", type=int, default=20)
    parser.add_argument("--arms", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--one", choices=list(RECIPES), help=argparse.SUPPRESS)  # internal: one arm
    args = parser.parse_args()
    if args.one:  # a process of its own per arm: ru_maxrss of RUSAGE_CHILDREN is then that arm's
        steps = args.grpo_steps if args.one.startswith("grpo") else args.sft_steps
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_arm(args.one, steps, Path(tmp))))
        return
    results = {}
    for name in args.arms:
        out = (
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    name,
                    "--grpo-steps",
                    str(args.grpo_steps),
                    "--sft-steps",
                    str(args.sft_steps),
                ],
                check=True,
                stdout=subprocess.PIPE,
                text=True,
            )
            .stdout.strip()
            .splitlines()
        )
        print("\n".join(out[:-1]), flush=True)
        results[name] = json.loads(out[-1])
    for kind in ("grpo", "sft"):
        full, lora = results.get(f"{kind}_full"), results.get(f"{kind}_lora")
        if full and lora:
            print(
                f"{kind}: LoRA / full  peak memory {lora['peak_gib']:.2f} / {full['peak_gib']:.2f} GiB "
                f"= {lora['peak_gib'] / full['peak_gib']:.2f}x;  s/step {lora['step_s']:.1f} / "
                f"{full['step_s']:.1f} = {lora['step_s'] / full['step_s']:.2f}x"
            )


if __name__ == "__main__":
    main()
