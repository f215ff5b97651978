"""GRPO step time: posttrain's `GRPOTrainer` against TRL's `GRPOTrainer` on the same configuration.

Usage:

    pip install trl                                  # once; the benchmark needs it, posttrain does not
    python benchmarks/grpo_vs_trl.py                 # 1 warmup + 4 timed steps each, interleaved
    python benchmarks/grpo_vs_trl.py --steps 1       # quick check
    python benchmarks/grpo_vs_trl.py --backend ray   # posttrain's workers as Ray actors
    python benchmarks/grpo_vs_trl.py --set policy.train_micro_batch_size=8   # any posttrain override

The configuration (both sides): SmolLM2-135M-Instruct in fp32 on CPU, 4 prompts x 4 generations =
16 completions per step, temperature 1, at most 32 new tokens, beta = 0 (no reference model), one
optimizer update per rollout batch (exactly on-policy, so neither side recomputes pi_old),
AdamW with a constant learning rate (--lr) and gradient clipping at 1.0, the token-level loss
normalised by the number of completion tokens (TRL `loss_type="dapo"`, posttrain
`loss.aggregation=token`), group-normalised advantages, clip epsilon 0.2. All 16 sequences go
through one forward/backward on both sides (TRL `per_device_train_batch_size=16`, posttrain
`policy.train_micro_batch_size=16`). No validation, checkpoints or logging on either side.

Prompts and reward are the same code on both sides: posttrain's default GRPO data (the quickstart's
reasoning-gym 1-digit sums and system prompt, `posttrain.data.math.build_math_problems`) in the
order posttrain's sampler draws them (TRL gets the same chat messages as a conversational dataset,
unshuffled, so step k of each side sees the same 4 prompts), and the reward is the environment of
posttrain's config (`math`: `MathEnvironment` with its configured kwargs, the last \\boxed{}
checked by math-verify in a subprocess), wrapped as a TRL reward function.

TRL settings that differ from its defaults, and why: `bf16=False` (fp32, like posttrain),
`gradient_checkpointing=False` (posttrain does not checkpoint activations; --trl-gradient-checkpointing
turns TRL's default back on), `lr_scheduler_type="constant"`, `shuffle_dataset=False` (same
prompts), `logging_strategy/save_strategy="no"`. TRL keeps its default optimizer
(`adamw_torch_fused`); posttrain's (from `posttrain.models.optim`) is printed at the start.

Timing. A step is wall clock over one complete step:
- posttrain: `collect` -> `make_batch` -> `train_on` (rollout generation, math-verify rewards,
  advantages and batch, forward/backward/clip/AdamW);
- TRL: `on_step_begin` -> `on_step_end` of a `TrainerCallback` (generation, rewards, advantages,
  forward/backward, clipping, optimizer step; the data loader's fetch of the 16 prompt rows is
  outside the window, and it is negligible).
The first --warmup steps of each side are not timed. With `--order interleaved` (default) the
sides take turns step by step (TRL step k, then posttrain step k, run from TRL's `on_step_end`),
so load from other processes hits both alike. The ratio printed is median(TRL) / median(posttrain).
Both sides run in this one process with torch's thread count (`--threads` to change it); with
`--backend ray` posttrain's policy and environment are Ray actors (the policy gets all cores, or
`--threads` of them).

On a shared machine: when other jobs hold the cores, torch's OpenMP threads wait for each other
and a step can take 10x longer than on an idle machine (seen on 2 cores: 8 s -> 85 s), on both
sides and not evenly, so medians mean little. The load average is printed before, after and at
every step; compare minima, or run with `--threads 1`, which degrades smoothly under load (there,
same-run step times varied by a few percent at a load average of 4 on 2 cores).

`--posttrain-async` runs posttrain's fastest configuration, asynchronous GRPO allowed, against TRL's
default GRPO: the split Ray placement with `grpo.async_mode=true` and `max_trajectory_age_steps=1`,
the overrides of `benchmarks/async_vs_sync.py`'s async_age1 arm (imported, not copied). posttrain
then runs all its steps first in one `fit` (generation overlaps training, so its steps cannot be
driven one by one or interleaved with TRL's), and its step time is `timing/step` from the run's
history: one trainer cycle, from taking a batch to taking the next. TRL runs after it.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from async_vs_sync import arm_overrides  # benchmarks/async_vs_sync.py: the async_age1 arm's overrides
from machine import cpu_model, loadavg  # benchmarks/machine.py (the script's folder is on sys.path)

MODEL_ALIAS = "smollm2-135m-instruct"


# ----------------------------------------------------------------------------- machine
def versions() -> str:
    import transformers

    out = [f"python {platform.python_version()}", f"torch {torch.__version__}"]
    out.append(f"transformers {transformers.__version__}")
    try:
        import trl

        out.append(f"trl {trl.__version__}")
    except ImportError:
        out.append("trl (not installed)")
    return ", ".join(out)


# ----------------------------------------------------------------------------- stats
def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt_times(xs: list[float]) -> str:
    return " ".join(f"{x:6.2f}" for x in xs)


# ----------------------------------------------------------------------------- posttrain
def posttrain_overrides(args: argparse.Namespace, model_path: str, run_dir: str) -> list[str]:
    total = args.warmup + args.steps
    overrides = {
        "policy.model_name": model_path,
        "policy.dtype": "float32",
        "policy.max_seq_len": 128,
        "policy.train_micro_batch_size": 16,
        "policy.optimizer.lr": args.lr,
        "policy.optimizer.max_grad_norm": 1.0,
        "policy.scheduler.name": "constant",
        "policy.scheduler.warmup_steps": 0,
        "generation.backend": "hf",
        "generation.placement": "colocated",
        "generation.temperature": 1.0,
        "generation.top_p": 1.0,
        "generation.max_new_tokens": args.max_new_tokens,
        "environment.name": "math",
        "advantage.estimator": "grpo",
        "loss.kl_beta": 0.0,
        "loss.clip_low": 0.2,
        "loss.clip_high": 0.2,
        "loss.aggregation": "token",
        "grpo.prompts_per_step": args.prompts,
        "grpo.generations_per_prompt": args.generations,
        "grpo.updates_per_batch": 1,
        "grpo.max_steps": total,
        "grpo.val_at_start": False,
        "grpo.val_every": total + 1000,
        "grpo.seed": args.seed,
        "data.validation": "null",
        "checkpoint.enabled": False,
        "logging.run_dir": run_dir,
        "logging.tensorboard": False,
        "logging.progress": False,
        "logging.jsonl": True,
        "cluster.backend": args.backend,
    }
    if args.threads:  # Ray workers set their own torch threads from cpus_per_worker
        overrides["cluster.cpus_per_worker"] = args.threads
    if args.posttrain_async:  # split Ray placement, async_mode, max_trajectory_age_steps=1
        overrides.update(arm_overrides("async_age1", os.cpu_count() or 1, args.gen_cpus))
    return [f"{k}={v}" for k, v in overrides.items()] + list(args.set)


class PosttrainSide:
    """posttrain's GRPOTrainer driven phase by phase, one timed step at a time."""

    def __init__(self, args: argparse.Namespace, model_path: str, run_dir: str) -> None:
        from posttrain.config import load_config
        from posttrain.config.rl import GRPOConfig
        from posttrain.trainers.grpo import GRPOTrainer

        self.cfg = load_config(GRPOConfig, None, posttrain_overrides(args, model_path, run_dir))
        start = time.perf_counter()
        self.trainer = GRPOTrainer(self.cfg)
        self.init_s = time.perf_counter() - start
        self.step = 0
        self.records: list[dict[str, float]] = []

    def upcoming_problems(self, n_steps: int) -> list[Any]:
        """The problems the next `n_steps` steps will draw, in order (a copy of the sampler is advanced)."""
        sampler = copy.deepcopy(self.trainer.runtime.sampler)
        return [self.trainer.runtime.train_problems[i] for _ in range(n_steps) for i in sampler.next_batch()]

    def run_step(self) -> dict[str, float]:
        t = self.trainer
        t.runtime.timer.pop()
        cpu_start, start = time.process_time(), time.perf_counter()
        rollouts, _ = t.collect(self.step)
        t_collect = time.perf_counter()
        batch, batch_metrics = t.make_batch(rollouts)
        t_batch = time.perf_counter()
        train_metrics = t.train_on(batch)
        end, cpu_end = time.perf_counter(), time.process_time()
        self.step += 1
        phases = t.runtime.timer.pop()
        record = {
            "step": end - start,
            "cpu": cpu_end - cpu_start,
            "collect": t_collect - start,
            "make_batch": t_batch - t_collect,
            "train_on": end - t_batch,
            **{k.removeprefix("timing/"): v for k, v in phases.items()},
            "completions": float(len(rollouts.trajectories)),
            "sequences_trained": float(len(batch)),
            "response_length": batch_metrics["response_length"],
            "reward": batch_metrics["reward/mean"],
            "grad_norm": train_metrics.get("grad_norm", float("nan")),
            "load1": os.getloadavg()[0],
        }
        self.records.append(record)
        return record

    def run_all_async(self) -> None:
        """--posttrain-async: every step in one `fit` (generation runs in the background); one record
        per step from the history, its phases as the trainer logged them. No per-step load average or
        CPU time (the generation actor is another process): the load at the end stands for them."""
        result = self.trainer.runtime.fit()
        load1 = os.getloadavg()[0]
        for h in result.history:
            if "timing/step" not in h:
                continue
            self.step += 1
            record = {k.removeprefix("timing/"): v for k, v in h.items() if k.startswith("timing/")}
            record.update(
                response_length=h.get("response_length", float("nan")),
                reward=h.get("reward/mean", float("nan")),
                age_mean=h.get("async/age_mean", float("nan")),
                load1=load1,
            )
            self.records.append(record)
            print(
                f"  posttrain step {self.step} (async): {record['step']:6.2f} s  (trajectory age "
                f"{record['age_mean']:.2f}, mean length {record['response_length']:.1f}, reward "
                f"{record['reward']:.2f})",
                flush=True,
            )

    def shutdown(self) -> None:
        self.trainer.runtime.shutdown()


# ----------------------------------------------------------------------------- TRL
class MathReward:
    """TRL reward function `f(prompts, completions, answer, **kw) -> list[float]` over the environment of
    posttrain's config (`math`: the same extraction, math-verify check, subprocess and format reward as
    posttrain's rollouts)."""

    def __init__(self, name: str, kwargs: dict[str, Any]) -> None:
        from posttrain.environments.interface import resolve_environment

        self.env = resolve_environment(name)(**kwargs)
        self.__name__ = "math_reward"
        self.calls: list[int] = []  # completions per call

    def __call__(self, prompts: list, completions: list, answer: list[str], **_: Any) -> list[float]:
        self.calls.append(len(completions))
        logs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
        return list(self.env.step(logs, [{"answer": a} for a in answer]).rewards)

    def close(self) -> None:
        self.env.close()


def timed_method(obj: Any, name: str, sink: dict[str, float]) -> None:
    """Wrap the bound method `obj.name` so that its wall time is added to `sink[name]`."""
    inner = getattr(obj, name)

    def wrapper(*a: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            sink[name] = sink.get(name, 0.0) + time.perf_counter() - start

    setattr(obj, name, wrapper)


def build_trl(
    args: argparse.Namespace, model_path: str, problems: list[Any], env: Any, out_dir: str
) -> tuple[Any, MathReward, dict[str, float]]:
    """TRL's GRPOTrainer on `problems` (in this order) with the reward of `env` (posttrain's EnvironmentConfig)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    dataset = Dataset.from_list([{"prompt": p["messages"], "answer": p["answer"]} for p in problems])
    config = GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=args.seed,
        max_steps=args.warmup + args.steps,
        per_device_train_batch_size=args.prompts * args.generations,
        gradient_accumulation_steps=1,  # -> steps_per_generation=1: one generation batch per optimizer step
        num_generations=args.generations,
        num_iterations=1,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        gradient_checkpointing=args.trl_gradient_checkpointing,
        shuffle_dataset=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_pin_memory=False,
        log_completions=False,
    )
    n = args.prompts * args.generations
    if (config.generation_batch_size, config.steps_per_generation, config.num_iterations) != (n, 1, 1):
        raise RuntimeError(
            f"TRL config gives generation_batch_size={config.generation_batch_size}, "
            f"steps_per_generation={config.steps_per_generation}, num_iterations={config.num_iterations}; "
            f"expected {n}, 1, 1 (one generation of {n} completions per optimizer step)"
        )
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    reward = MathReward(env.name, env.kwargs)
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tokenizer
    )
    from transformers import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)  # the end-of-training metrics dict; we print our own
    trainer.remove_callback(ProgressCallback)
    phases: dict[str, float] = {}
    for name in ("_generate", "_calculate_rewards", "_generate_and_score_completions"):
        timed_method(trainer, name, phases)
    return trainer, reward, phases


def make_step_callback(
    trainer: Any,
    phases: dict[str, float],
    records: list[dict[str, float]],
    after_step: Callable[[], None] | None,
) -> Any:
    from transformers import TrainerCallback

    def last(key: str) -> float:
        values = trainer._metrics["train"].get(key) or [float("nan")]
        return float(values[-1])

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            phases.clear()
            self.cpu_start, self.start = time.process_time(), time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            step, cpu = time.perf_counter() - self.start, time.process_time() - self.cpu_start
            rollout = phases.get("_generate_and_score_completions", float("nan"))
            records.append(
                {
                    "step": step,
                    "cpu": cpu,
                    "generation": phases.get("_generate", float("nan")),
                    "rewards": phases.get("_calculate_rewards", float("nan")),
                    "rollout": rollout,
                    "training": step - rollout,
                    "response_length": last("completions/mean_length"),
                    "reward": last("reward"),
                    "load1": os.getloadavg()[0],
                }
            )
            if after_step is not None:
                after_step()

    return StepTimer()


# ----------------------------------------------------------------------------- report
def phase_table(name: str, records: list[dict[str, float]], keys: list[str]) -> None:
    step = median([r["step"] for r in records])
    print(f"{name} phases (median over timed steps; share of the median step):")
    for k in keys:
        values = [r[k] for r in records if k in r]
        if not values:
            continue
        m = median(values)
        print(f"  {k:<22} {m:7.2f} s  {100 * m / step:5.1f}%   [{fmt_times(values)}]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per side, before the timed ones")
    parser.add_argument(
        "--backend", choices=["local", "ray"], default="local", help="posttrain cluster.backend"
    )
    parser.add_argument(
        "--order",
        choices=["interleaved", "trl-first", "posttrain-first"],
        default="interleaved",
        help="interleaved: TRL step, posttrain step, ...; otherwise all steps of one side, then the other",
    )
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument(
        "--trl-gradient-checkpointing",
        action="store_true",
        help="TRL's default (gradient_checkpointing=True); off by default to match posttrain",
    )
    parser.add_argument(
        "--posttrain-async",
        action="store_true",
        help="posttrain's fastest configuration with async allowed (async_vs_sync.py's async_age1 "
        "overrides: Ray, split placement, async_mode, age 1); posttrain runs all its steps first",
    )
    parser.add_argument(
        "--gen-cpus", type=int, default=1, help="--posttrain-async: cores of the generation actor"
    )
    parser.add_argument("--model", default=None, help=f"HF folder; default: the {MODEL_ALIAS} alias")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra posttrain config override"
    )
    args = parser.parse_args()
    if args.posttrain_async:  # fit() runs every posttrain step: no interleaving; the policy is a Ray actor
        args.order, args.backend = "posttrain-first", "ray"
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from posttrain.models.hub import resolve_model

    model_path = args.model or str(resolve_model(MODEL_ALIAS))
    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(f"machine: {cpu_model()}; {os.cpu_count()} logical CPUs; torch threads {torch.get_num_threads()}")
    print(f"versions: {versions()}")
    print(f"model: {model_path} (fp32)")
    print(
        f"config: {args.prompts} prompts x {args.generations} generations, {args.max_new_tokens} new tokens, "
        f"beta=0, 1 update per batch, lr {args.lr:g}; {args.warmup} warmup + {args.steps} timed steps each; "
        f"order {args.order}; posttrain backend {args.backend}"
        f"{' (async: split placement, async_mode, age 1)' if args.posttrain_async else ''}; "
        f"TRL gradient checkpointing {'on' if args.trl_gradient_checkpointing else 'off'}"
    )
    load_before = loadavg()
    print(f"load average before (1/5/15 min): {load_before}", flush=True)

    tmp = tempfile.TemporaryDirectory(prefix="grpo_vs_trl_")
    total = args.warmup + args.steps
    pt = PosttrainSide(args, model_path, str(Path(tmp.name) / "posttrain"))
    problems = pt.upcoming_problems(total)
    print(f"posttrain: trainer built in {pt.init_s:.1f} s", flush=True)
    if args.backend == "local":
        optimizer = pt.trainer.runtime.policy.workers.instances[0].optimizer
        kind = (
            "fused"
            if optimizer.defaults.get("fused")
            else "foreach"
            if optimizer.defaults.get("foreach")
            else "for-loop"
        )
        print(f"posttrain optimizer: {type(optimizer).__name__} ({kind})")
    system = pt.cfg.data.system_prompt
    print(
        f"prompts (both sides): {len(pt.trainer.runtime.train_problems)} problems, system prompt {system!r}, e.g. "
        f"{problems[0]['messages'][-1]['content']!r}; reward (both sides): {pt.cfg.environment.name} "
        f"environment {pt.cfg.environment.kwargs}",
        flush=True,
    )

    trl_records: list[dict[str, float]] = []

    def posttrain_step() -> None:
        r = pt.run_step()
        tag = "warmup" if pt.step <= args.warmup else "timed"
        print(
            f"  posttrain step {pt.step} ({tag}): {r['step']:6.2f} s  (generation {r.get('generation', 0):.2f}, "
            f"rewards {r.get('rewards', 0):.2f}, training {r.get('training', 0):.2f}; "
            f"{int(r['completions'])} completions, mean length {r['response_length']:.1f}, "
            f"reward {r['reward']:.2f}; load {r['load1']:.2f})",
            flush=True,
        )

    def after_trl_step() -> None:
        r = trl_records[-1]
        k = len(trl_records)
        tag = "warmup" if k <= args.warmup else "timed"
        print(
            f"  TRL       step {k} ({tag}): {r['step']:6.2f} s  (generation {r['generation']:.2f}, "
            f"rewards {r['rewards']:.2f}, training {r['training']:.2f}; mean length {r['response_length']:.1f}, "
            f"reward {r['reward']:.2f}; load {r['load1']:.2f})",
            flush=True,
        )
        if args.order == "interleaved":
            posttrain_step()

    start = time.perf_counter()
    trl_trainer, reward, trl_phases = build_trl(
        args, model_path, problems, pt.cfg.environment, str(Path(tmp.name) / "trl")
    )
    print(
        f"TRL: trainer built in {time.perf_counter() - start:.1f} s; generation_batch_size "
        f"{trl_trainer.args.generation_batch_size}, steps_per_generation {trl_trainer.args.steps_per_generation}, "
        f"per_device_train_batch_size {trl_trainer.args.per_device_train_batch_size}, optimizer "
        f"{trl_trainer.args.optim}",
        flush=True,
    )
    # start both verifiers (math-verify subprocesses start lazily, at the first boxed answer) before any step
    boxed = [[{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "\\boxed{2}"}]]
    pt.trainer.runtime.environment.step(boxed, [{"answer": "2"}])
    reward([boxed[0][:1]], [boxed[0][1:]], ["2"])
    reward.calls.clear()
    trl_trainer.add_callback(make_step_callback(trl_trainer, trl_phases, trl_records, after_trl_step))

    try:
        if args.posttrain_async:
            pt.run_all_async()
        elif args.order == "posttrain-first":
            for _ in range(total):
                posttrain_step()
        trl_trainer.train()
        if args.order == "trl-first":
            for _ in range(total):
                posttrain_step()
    finally:
        reward.close()
        pt.shutdown()
    load_after = loadavg()

    # -------------------------------------------------------------- checks
    n = args.prompts * args.generations
    problems_found = []
    if trl_trainer.state.global_step != total or len(trl_records) != total:
        problems_found.append(f"TRL ran {trl_trainer.state.global_step} optimizer steps, expected {total}")
    if reward.calls != [n] * total:
        problems_found.append(f"TRL reward calls saw {reward.calls} completions, expected {[n] * total}")
    if len(pt.records) != total:
        problems_found.append(f"posttrain ran {len(pt.records)} steps, expected {total}")
    if any(r["completions"] != n or r["sequences_trained"] != n for r in pt.records if "completions" in r):
        problems_found.append("posttrain did not train on exactly the step's completions")

    # -------------------------------------------------------------- report
    trl_timed = trl_records[args.warmup :]
    pt_timed = pt.records[args.warmup :]
    trl_steps = [r["step"] for r in trl_timed]
    pt_steps = [r["step"] for r in pt_timed]
    trl_med, pt_med = median(trl_steps), median(pt_steps)
    print()
    print("=" * 78)
    print(f"step times over {args.steps} timed steps (after {args.warmup} warmup), seconds:")
    print(f"  TRL       [{fmt_times(trl_steps)}]  median {trl_med:6.2f}  min {min(trl_steps):6.2f}")
    print(f"  posttrain [{fmt_times(pt_steps)}]  median {pt_med:6.2f}  min {min(pt_steps):6.2f}")
    arm = "posttrain async (age 1, split)" if args.posttrain_async else "posttrain"
    print(
        f"  ratio TRL / {arm}: {trl_med / pt_med:.2f}x (medians), "
        f"{min(trl_steps) / min(pt_steps):.2f}x (minima); target >= 2x"
    )
    if args.backend == "local":
        trl_cpu, pt_cpu = [r["cpu"] for r in trl_timed], [r["cpu"] for r in pt_timed]
        print(
            f"  process CPU time per step (all threads): TRL median {median(trl_cpu):.2f} s, posttrain median "
            f"{median(pt_cpu):.2f} s, ratio {median(trl_cpu) / median(pt_cpu):.2f}x (less sensitive to waiting "
            "for cores held by other jobs, but OpenMP spinning under contention inflates it too)"
        )
    print(
        "  mean completion length (tokens, timed steps): TRL "
        f"{statistics.mean(r['response_length'] for r in trl_timed):.1f}, "
        f"posttrain {statistics.mean(r['response_length'] for r in pt_timed):.1f}"
    )
    print()
    phase_table(
        "posttrain",
        pt_timed,
        ["step", "collect", "generation", "rewards", "make_batch", "train_on", "training"],
    )
    others = [
        r["step"] - r.get("generation", 0) - r.get("rewards", 0) - r.get("training", 0) for r in pt_timed
    ]
    print(f"  {'other (step - phases)':<22} {median(others):7.2f} s")
    phase_table("TRL", trl_timed, ["step", "rollout", "generation", "rewards", "training"])
    print(
        "  (TRL rollout = _generate_and_score_completions: generation, rewards, advantages; training = rest)"
    )
    print()
    print(f"load average (1/5/15 min): before {load_before}; after {load_after}")
    load_steps = [r["load1"] for r in trl_timed + pt_timed]
    print(
        f"1-min load average at timed steps: min {min(load_steps):.2f}, max {max(load_steps):.2f} "
        f"on {os.cpu_count()} CPUs (above {os.cpu_count()}: other jobs shared the cores; "
        f"{'interleaved steps share that noise' if args.order == 'interleaved' else 'sides ran at different times'})"
    )
    for p in problems_found:
        print(f"WARNING: {p}")
    tmp.cleanup()
    return 1 if problems_found else 0


if __name__ == "__main__":
    sys.exit(main())
