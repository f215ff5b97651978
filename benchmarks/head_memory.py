"""Peak memory and time of the vocabulary head's forward + backward (issue #34, item 2).

    python benchmarks/head_memory.py [--tokens 1024 4096 16384] [--arms plain kept recompute]
                                     [--chunk-size 2048] [--repeats 2] [--device cpu|cuda]

SmolLM2-135M's head shape (vocabulary 49,152, hidden 576, fp32, bias-free): hidden states [N, 576]
and the weight, both requiring gradients, and N random targets; one forward + backward of
Σ log p(target). Arms:

- plain: full logits, log_softmax, gather (autograd keeps the [N, V] log-softmax);
- kept: `chunked_logprobs(..., recompute=False)`, the chunked path before issue #34 (`LinearLogprobs`,
  every chunk's softmax kept for backward);
- recompute: `chunked_logprobs(..., recompute=True)` (`RecomputedLinearLogprobs`: only the per-row
  log-sum-exp kept, each chunk's logits recomputed in backward);
- entropy: `chunked_logprobs_and_entropy`, recomputed, with Σ (log p(target) + entropy) as the loss.

Each (arm, tokens) runs in a fresh subprocess so that peaks do not mix. Peak: on CPU the peak
resident set (VmHWM, reset through /proc/self/clear_refs after the inputs exist) minus the resident
set at that point; on CUDA `max_memory_allocated` minus the allocation at that point. Time: the
median over `--repeats` forward + backward passes (the first includes first-touch page faults).
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

import torch
from machine import cpu_model  # benchmarks/machine.py (the script's folder is on sys.path)

VOCAB, HIDDEN = 49_152, 576
ARMS = ("plain", "kept", "recompute", "entropy")


def _status_kb(field: str) -> int:
    """A `kB` field of /proc/self/status (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class PeakMeter:
    """Memory above the moment `start()` was called, at its peak since then, in MB."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.base = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            self.base = _status_kb("VmRSS") * 1024

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - self.base) / 2**20
        return (_status_kb("VmHWM") * 1024 - self.base) / 2**20


def _loss(arm: str, hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, chunk: int):
    from posttrain.models.logprobs import chunked_logprobs, chunked_logprobs_and_entropy, gather_logprobs

    if arm == "plain":
        return gather_logprobs(head(hidden), targets).sum()
    if arm == "entropy":
        lp, ent = chunked_logprobs_and_entropy(hidden, targets, head, chunk)
        return (lp + ent).sum()
    return chunked_logprobs(hidden, targets, head, chunk, recompute=arm == "recompute").sum()


def child(arm: str, tokens: int, chunk: int, repeats: int, device: torch.device) -> dict:
    """One configuration, in this process: {peak_mb, seconds (median), times}."""
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02)
    head = head.to(device)
    hidden = torch.randn(tokens, HIDDEN, generator=gen).to(device).requires_grad_()
    targets = torch.randint(0, VOCAB, (tokens,), generator=gen).to(device)
    head.weight.grad = torch.zeros_like(head.weight)  # the gradient buffers exist before the start,
    hidden.grad = torch.zeros_like(hidden)  # as they do in a training step after the first
    meter = PeakMeter(device)
    meter.start()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        _loss(arm, hidden, head, targets, chunk).backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    return {"peak_mb": meter.peak_mb(), "seconds": statistics.median(times), "times": times}


def run_child(arm: str, tokens: int, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", arm, str(tokens)]
    command += ["--chunk-size", str(args.chunk_size), "--repeats", str(args.repeats), "--device", args.device]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine_line(device: str) -> str:
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    gpu = f"; {torch.cuda.get_device_name()}" if device == "cuda" else ""
    return (
        f"machine: {cpu_model()}; {os.cpu_count()} logical CPUs; torch {torch.__version__} "
        f"({torch.get_num_threads()} threads){gpu}; load average {load}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=["plain", "kept", "recompute"])
    parser.add_argument("--chunk-size", type=int, default=2048, help="policy.logprob_chunk_size's default")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--child", nargs=2, metavar=("ARM", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available")
    if args.child:
        arm, tokens = args.child
        print(json.dumps(child(arm, int(tokens), args.chunk_size, args.repeats, torch.device(args.device))))
        return
    print(machine_line(args.device))
    print(f"head {VOCAB} x {HIDDEN} fp32, chunk {args.chunk_size}, {args.repeats} repeats, {args.device}")
    print("| tokens | arm | peak MB | s per fwd+bwd |\n|---|---|---|---|", flush=True)
    for tokens in args.tokens:
        for arm in args.arms:
            r = run_child(arm, tokens, args)
            if "error" in r:
                print(f"| {tokens} | {arm} | failed: {r['error']} | |", flush=True)
            else:
                print(f"| {tokens} | {arm} | {r['peak_mb']:,.0f} | {r['seconds']:.2f} |", flush=True)
    print(machine_line(args.device))


if __name__ == "__main__":
    main()
