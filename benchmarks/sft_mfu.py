"""SFT training throughput on SmolLM2-135M (fp32, CPU) as model FLOPs utilisation (MFU).

Usage:

    python benchmarks/sft_mfu.py                      # 16 sequences x 128 tokens, defaults below
    python benchmarks/sft_mfu.py --steps 5 --rounds 4 --arm compiled:compile=true
    python benchmarks/sft_mfu.py --device cuda --dtype bfloat16 --batch-size 32 --seq-len 512

On CUDA (--device cuda) every arm runs on the GPU, the peak is torch.mm in --dtype on the GPU
(default sizes 4096 and 8192), and each timed step ends with torch.cuda.synchronize().

What it measures, all in one process with torch's default thread count (unless --threads):

1. Peak: `torch.mm` in --dtype (default fp32) on square n x n matrices (n in --matmul-sizes), FLOPs = 2 n^3, the best
   of several repeats over all sizes. It is measured before, between and after the training
   rounds and the best value is used, so the peak is not underestimated when other processes
   share the machine.
2. HF baseline: a plain Hugging Face loop on the same batch: `model(input_ids, labels=input_ids)`,
   `loss.backward()`, `torch.optim.AdamW(model.parameters(), lr)` step (torch defaults, no
   gradient clipping), `zero_grad(set_to_none=True)`. The whole batch goes through one forward
   and backward (no gradient accumulation) unless --hf-micro-batch-size is set.
3. posttrain: `posttrain.models.policy.Policy` in-process, `Policy.train(batch, sft_loss, N)` with
   every token after the first a target (the same targets as `labels=input_ids`), so one step
   runs the decoder, the lm_head/log-softmax path, backward, gradient clipping and AdamW.
   The `PolicyConfig` is the schema default except `train_micro_batch_size` (= the whole batch
   unless --micro-batch-size) and any `--arm NAME:key=value,...` overrides.

Each arm (HF and each posttrain arm) runs --warmup untimed steps, then the arms take turns:
--rounds rounds of --steps timed steps each, interleaved, so that noise from other processes
hits all arms alike. Step time is reported as the median and the best over all timed steps;
MFU uses the best step (like the best-of peak) and, in brackets, the median.

Model FLOPs per token (forward + backward, the PaLM appendix B convention):

    F = 6 * N + 12 * L * d * T

where N is the number of parameters that take part in matrix multiplications (the weights of
every nn.Linear, including the lm_head; with tied embeddings the shared matrix is counted once,
and the embedding lookup itself is not a matmul), L the number of layers, d the hidden size and T
the sequence length (the attention score and value matmuls). For SmolLM2-135M at T = 128:
N = 134.5M, F = 6 * 134.5M + 12 * 30 * 576 * 128 = 0.834 GFLOP per token.
MFU = tokens/s * F / peak FLOP/s. Both loops are charged the same F per token, although
posttrain skips the lm_head for the last position of each sequence (no target there).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable

import torch
from machine import cpu_model  # benchmarks/machine.py (the script's folder is on sys.path)

from posttrain.models.hub import model_dir

DEFAULT_MODEL = model_dir("smollm2-135m-instruct")  # honours POSTTRAIN_CACHE


# ----------------------------------------------------------------------------- machine
def sync(device: str) -> None:
    """Wait for the device's queued work (a no-op on CPU), so that a wall-clock time covers it."""
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_peak(
    sizes: list[int], repeats: int, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[float, dict[int, float]]:
    """Best torch.mm FLOP/s in `dtype` on `device` over `sizes` (each the best of `repeats`), and the
    per-size bests."""
    per_size = {}
    for n in sizes:
        gen = torch.Generator().manual_seed(n)
        a = torch.randn(n, n, generator=gen).to(device, dtype)
        b = torch.randn(n, n, generator=gen).to(device, dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        for _ in range(2):
            torch.mm(a, b, out=out)
        sync(device)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            sync(device)
            best = min(best, time.perf_counter() - start)
        per_size[n] = 2 * n**3 / best
    return max(per_size.values()), per_size


# ----------------------------------------------------------------------------- model FLOPs
def model_flops_per_token(model: torch.nn.Module, seq_len: int) -> tuple[float, int]:
    """(6 N + 12 L d T, N) with N the distinct nn.Linear weights (a tied lm_head counted once)."""
    seen: set[int] = set()
    n = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            n += module.weight.numel()
    cfg = model.config
    return 6 * n + 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len, n


def compile_seconds() -> float:
    """Seconds torch.compile has spent in this process so far (dynamo + inductor, forward and backward)."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(
        sum(compilation_time_metrics.get(key, []))
        for key in ("_compile.compile_inner", "backward._backward_impl")
    )


# ----------------------------------------------------------------------------- arms
def hf_arm(
    model_path: str,
    input_ids: torch.Tensor,
    micro: int,
    lr: float,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Callable[[], None]:
    """A plain HF loop: forward with labels, backward, AdamW (torch defaults) step. In bfloat16 the
    weights stay fp32 and the forward runs under torch.autocast, like posttrain's policy.dtype."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
    autocast = torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32)
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    chunks = input_ids.to(device).split(micro)

    def step() -> None:
        for ids in chunks:
            with autocast:
                loss = model(input_ids=ids, labels=ids).loss * (ids.shape[0] / input_ids.shape[0])
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step.model = model  # type: ignore[attr-defined]
    return step


def parse_overrides(text: str) -> dict[str, object]:
    """'compile=true,logprob_chunk_size=1024' -> {'compile': True, 'logprob_chunk_size': 1024}."""
    import yaml

    out: dict[str, object] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        node = out
        *parents, leaf = key.strip().split(".")
        for parent in parents:
            node = node.setdefault(parent, {})  # type: ignore[assignment]
        node[leaf] = yaml.safe_load(value)
    return out


def posttrain_arm(
    model_path: str, input_ids: torch.Tensor, micro: int, overrides: dict[str, object], gpus: int = 0
) -> Callable[[], None]:
    from posttrain.config.common import PolicyConfig
    from posttrain.data.batching import TokenBatch
    from posttrain.models.policy import Policy
    from posttrain.trainers.sft import sft_loss

    cfg = PolicyConfig.model_validate({"train_micro_batch_size": micro, **overrides})
    policy = Policy(cfg, model_path=model_path, total_steps=10_000, gpus=gpus)
    loss_mask = torch.ones(input_ids.shape, dtype=torch.float32)
    loss_mask[:, 0] = 0.0
    batch = TokenBatch(input_ids, torch.ones_like(input_ids), loss_mask)
    normalizer = batch.num_target_tokens

    def step() -> None:
        policy.train(batch, sft_loss, normalizer)

    step.model = policy.model  # type: ignore[attr-defined]
    step.policy = policy  # type: ignore[attr-defined]
    step.config = cfg  # type: ignore[attr-defined]
    return step


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(DEFAULT_MODEL), help="HF folder of SmolLM2-135M(-Instruct).")
    p.add_argument("--batch-size", type=int, default=16, help="Sequences per optimizer step.")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--micro-batch-size", type=int, default=None, help="posttrain; default: the batch.")
    p.add_argument("--hf-micro-batch-size", type=int, default=None, help="HF loop; default: the batch.")
    p.add_argument("--warmup", type=int, default=2, help="Untimed steps per arm (compilation happens here).")
    p.add_argument("--steps", type=int, default=3, help="Timed steps per arm per round.")
    p.add_argument("--rounds", type=int, default=3, help="Interleaved rounds over the arms.")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads; default: torch's.")
    p.add_argument(
        "--matmul-sizes", type=int, nargs="+", default=None, help="default: 1024 1536 2048; on CUDA 4096 8192"
    )
    p.add_argument("--matmul-repeats", type=int, default=10)
    p.add_argument("--lr", type=float, default=2e-5, help="HF loop lr (posttrain: its config).")
    p.add_argument("--no-hf", action="store_true", help="Skip the HF baseline.")
    p.add_argument(
        "--arm",
        action="append",
        default=None,
        metavar="NAME:key=value,...",
        help="A posttrain arm with PolicyConfig overrides (repeatable); default: one arm 'posttrain:' "
        "with the schema defaults.",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="the peak's matmul, the HF model and posttrain's policy.dtype (an arm may override it)",
    )
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.matmul_sizes is None:
        args.matmul_sizes = [4096, 8192] if args.device == "cuda" else [1024, 1536, 2048]

    if args.threads:
        torch.set_num_threads(args.threads)
    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(
        f"machine: {cpu_model()}; {os.cpu_count()} logical CPUs; torch {torch.__version__} "
        f"with {torch.get_num_threads()} threads; python {platform.python_version()}"
    )
    micro = args.micro_batch_size or args.batch_size
    hf_micro = args.hf_micro_batch_size or args.batch_size
    print(
        f"batch: {args.batch_size} sequences x {args.seq_len} tokens (random ids), {args.dtype} on "
        f"{args.device}" + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "") + "; "
        f"posttrain micro-batch {micro}, HF micro-batch {hf_micro}"
    )

    peaks = [matmul_peak(args.matmul_sizes, args.matmul_repeats, args.device, dtype)]

    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 49152, (args.batch_size, args.seq_len), generator=gen)

    arms: dict[str, Callable[[], None]] = {}
    if not args.no_hf:
        arms["hf"] = hf_arm(args.model, input_ids, hf_micro, args.lr, args.device, dtype)
    for spec in args.arm or ["posttrain:"]:
        name, _, text = spec.partition(":")
        overrides = {"dtype": args.dtype, **parse_overrides(text)}
        arms[name] = posttrain_arm(args.model, input_ids, micro, overrides, int(args.device == "cuda"))
        if text:
            print(f"arm {name}: {text}")

    some_model = next(iter(arms.values())).model  # type: ignore[attr-defined]
    flops_per_token, n_matmul = model_flops_per_token(some_model, args.seq_len)
    layers, hidden = some_model.config.num_hidden_layers, some_model.config.hidden_size
    tokens = args.batch_size * args.seq_len

    first_step_s, compile_s = {}, {}
    for name, step in arms.items():
        before = compile_seconds()
        for i in range(args.warmup):
            start = time.perf_counter()
            step()
            sync(args.device)
            if i == 0:
                first_step_s[name] = time.perf_counter() - start
        compile_s[name] = compile_seconds() - before

    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, step in arms.items():
            for _ in range(args.steps):
                start = time.perf_counter()
                step()
                sync(args.device)
                times[name].append(time.perf_counter() - start)
        peaks.append(matmul_peak(args.matmul_sizes, args.matmul_repeats, args.device, dtype))

    peak, per_size = max(peaks, key=lambda x: x[0])
    print(
        f"{args.dtype} matmul peak: "
        + ", ".join(f"n={n}: {f / 1e9:.1f}" for n, f in per_size.items())
        + f" GFLOP/s -> peak {peak / 1e9:.1f} GFLOP/s (best of {len(peaks)} measurements)"
    )
    print(
        f"model FLOPs/token = 6*N + 12*L*d*T = 6*{n_matmul / 1e6:.2f}M + 12*{layers}*{hidden}*{args.seq_len} "
        f"= {flops_per_token / 1e9:.4f} GFLOP; {tokens} tokens/step"
    )
    print(
        f"{'arm':<14}{'compile s':>10}{'1st step s':>11}{'best s':>9}{'median s':>10}{'tok/s':>9}"
        f"{'MFU':>8}{'(median)':>10}"
    )
    mfu = {}
    for name, ts in times.items():
        best, median = min(ts), statistics.median(ts)
        mfu[name] = tokens / best * flops_per_token / peak
        mfu_median = tokens / median * flops_per_token / peak
        print(
            f"{name:<14}{compile_s.get(name, 0.0):>10.1f}{first_step_s.get(name, float('nan')):>11.1f}{best:>9.3f}{median:>10.3f}{tokens / best:>9.0f}"
            f"{mfu[name]:>8.1%}{mfu_median:>10.1%}"
        )
    print(
        "(compile s: time torch.compile spent during the arm's warmup, by torch._dynamo's own metrics; "
        "1st step s: the first warmup step, which includes it. A warm inductor cache "
        "(TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_$USER) makes compiling much cheaper.)"
    )
    if "hf" in mfu:
        for name in mfu:
            if name != "hf":
                print(f"{name} / hf throughput: {mfu[name] / mfu['hf']:.2f}x")


if __name__ == "__main__":
    main()
