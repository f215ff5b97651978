"""Peak memory of one whole SFT and one whole GRPO training step, with the head's logits kept or
recomputed (issue #34, item 2, second part).

    python benchmarks/step_memory.py [--tokens 1024 4096 16384] [--kinds sft grpo]
                                     [--heads kept recompute none] [--row-tokens 2048]

One optimizer step of `Policy.train` (the trainers' own code: activation checkpointing on, fp32,
AdamW) on SmolLM2-135M-Instruct, all rows in one microbatch of `--tokens` tokens (rows of
`--row-tokens`, every token after the first a target), with the trainers' loss: `sft_loss` (mean
NLL) or `grpo_loss` (the clipped surrogate with the default loss knobs; advantages ±1, π_old = the
policy's own logprobs). Heads:

- kept: `chunked_logprobs(..., recompute=False)`, the head before issue #34 (every chunk's softmax
  kept for backward, [tokens x vocabulary] fp32);
- recompute: `chunked_logprobs(..., recompute=True)` (only each row's log-sum-exp kept, each chunk's
  logits recomputed in backward), what the trainers do now above one chunk;
- none: no vocabulary head at all (the loss is a linear function of the decoder's last hidden
  states), to split the peak into its parts.

Each (kind, head, tokens) runs in a fresh subprocess, with glibc's mmap threshold fixed at 64 KiB
(`MMAP_ENV`) so that the resident set follows the live tensors (which makes allocations slower: the
times are for comparing heads, not a training speed). Printed per run: the resident set after the
imports, after the model (fp32 weights), after one small step (+ AdamW's two fp32 moments), and the
step's peak resident set (VmHWM, reset through /proc/self/clear_refs) above the resident set before
it, with the step's time. Parts of the whole peak: weights and optimizer state (the resident set
before the step, above the imports), the step's gradients (4 bytes a parameter, allocated during
backward), the head (this head's step peak minus the `none` step's) and activations (the `none`
step's peak minus the gradients). On a shared machine the times are noisy, the peaks are not.
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

from machine import cpu_model, loadavg  # benchmarks/machine.py (the script's folder is on sys.path)

MB = 1024 * 1024
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
"""glibc serves every allocation of 64 KiB or more with its own mmap, returned to the system when
freed. By default the threshold grows with the sizes freed (up to 32 MiB), after which freed tensors
stay in the heap, resident: the resident set then counts memory no tensor holds (measured: 1,106 MB
resident after a checkpointed forward at 2,048 tokens that keeps 146 MB of tensors)."""
HEADS = ("kept", "recompute", "none")


def rss_mb(field: str = "VmRSS") -> float:
    """The process's resident set (VmRSS) or its peak (VmHWM) in MB, from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    """Reset VmHWM to the current resident set (Linux: writing 5 to clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def patch_head(head: str) -> None:
    """Make the policy's `token_logprobs` keep (`kept`), recompute (`recompute`) or skip (`none`)
    the vocabulary head. `none` returns a [K] linear function of the hidden states in place of the
    log-probabilities (the loss's gradient still reaches every decoder weight)."""
    import functools

    import posttrain.models.logprobs as logprobs

    if head in ("kept", "recompute"):
        logprobs.chunked_logprobs = functools.partial(
            logprobs.chunked_logprobs, recompute=head == "recompute"
        )
    else:

        def no_head(hidden, targets, head_module, chunk_size, **_):  # noqa: ARG001
            return hidden.float().mean(dim=-1)

        logprobs.chunked_logprobs = no_head


def make_batch(tokens: int, row_tokens: int, vocab: int, kind: str):
    """A batch of `tokens` tokens in rows of `row_tokens` (random ids, fixed seed), all targets."""
    import torch

    from posttrain.data.batching import TokenBatch
    from posttrain.rollout.rollout import RLBatch

    rows, length = max(1, tokens // row_tokens), min(tokens, row_tokens)
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab, (rows, length), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    loss_mask = torch.ones(rows, length)
    loss_mask[:, 0] = 0
    if kind == "sft":
        return TokenBatch(input_ids, attention_mask, loss_mask)
    advantages = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(rows)])
    return RLBatch(
        input_ids, attention_mask, loss_mask, advantages=advantages, rewards=(advantages > 0).float()
    )


def on_policy(policy, batch, kind: str) -> None:
    """GRPO: π_old and the sampler's logprobs are the policy's own (exactly on-policy, ratio 1), as the
    trainer's batch carries both."""
    if kind == "grpo":
        batch.old_logprobs = policy.logprobs(batch)
        batch.generation_logprobs = batch.old_logprobs.clone()


def loss_for(kind: str, batch, cfg):
    """The trainer's loss function and normaliser for `batch`."""
    import functools

    if kind == "sft":
        from posttrain.trainers.sft import sft_loss

        return sft_loss, batch.num_target_tokens
    from posttrain.algorithms.rl_loss import grpo_loss, loss_knobs, positive_tokens

    tokens = float(batch.loss_mask.sum())
    knobs = loss_knobs(cfg.loss)
    fn = functools.partial(
        grpo_loss, token_normalizer=tokens, positive_normalizer=positive_tokens(batch), **knobs
    )
    return fn, tokens


def child(spec: dict) -> dict:
    """One measurement in this process: the resident sets and the step's peak and time."""
    import torch

    from posttrain.config.rl import GRPOConfig
    from posttrain.config.supervised import SFTConfig
    from posttrain.models.hub import resolve_model
    from posttrain.models.policy import Policy

    patch_head(spec["head"])
    config_cls = SFTConfig if spec["kind"] == "sft" else GRPOConfig
    cfg = config_cls.model_validate(
        {
            "policy": {
                "model_name": spec["model"],
                "activation_checkpointing": True,
                "max_seq_len": spec["row_tokens"],
                "train_micro_batch_size": 10_000,
            }
        }
    )
    out: dict = {"imports_mb": rss_mb()}
    policy = Policy(cfg.policy, model_path=str(resolve_model(spec["model"])), total_steps=10)
    params = sum(p.numel() for p in policy.model.parameters())
    out["weights_mb"] = rss_mb()
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    small = make_batch(32, 16, vocab, spec["kind"])
    on_policy(policy, small, spec["kind"])
    policy.train(small, *loss_for(spec["kind"], small, cfg))  # allocates AdamW's moments
    policy.optimizer.zero_grad(set_to_none=True)  # the step allocates its gradients itself
    batch = make_batch(spec["tokens"], spec["row_tokens"], vocab, spec["kind"])
    fn, normalizer = loss_for(spec["kind"], batch, cfg)
    on_policy(policy, batch, spec["kind"])
    import gc

    gc.collect()
    out["before_step_mb"] = before = rss_mb()
    reset_peak()
    start = time.perf_counter()
    policy.train(batch, fn, normalizer)
    out["step_s"] = time.perf_counter() - start
    out["step_peak_mb"] = rss_mb("VmHWM") - before
    out["params"] = params
    out["torch_threads"] = torch.get_num_threads()
    return out


def run_child(spec: dict) -> dict:
    """One measurement in a fresh process whose allocator gives freed memory back (`MMAP_ENV`)."""
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **MMAP_ENV})
    if proc.returncode != 0:
        raise RuntimeError(f"{spec}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_table(results: dict[tuple[str, str, int], dict], args: argparse.Namespace) -> None:
    """Per kind and tokens: the whole peak of each head and its parts."""
    print(
        f"\n{'kind':>4} {'tokens':>7} {'head':>9} {'whole peak MB':>14} {'weights+optim MB':>17} "
        f"{'gradients MB':>13} {'activations MB':>15} {'head MB':>8} {'step s':>7}"
    )
    for kind in args.kinds:
        for tokens in args.tokens:
            none = results.get((kind, "none", tokens))
            for head in args.heads:
                r = results.get((kind, head, tokens))
                if r is None:
                    continue
                static = r["before_step_mb"] - r["imports_mb"]
                grads = r["params"] * 4 / MB
                acts = f"{none['step_peak_mb'] - grads:15.0f}" if none else f"{'n/a':>15}"
                head_mb = f"{r['step_peak_mb'] - none['step_peak_mb']:8.0f}" if none else f"{'n/a':>8}"
                print(
                    f"{kind:>4} {tokens:7d} {head:>9} {static + r['step_peak_mb']:14.0f} {static:17.0f} "
                    f"{grads:13.0f} {acts} {head_mb} {r['step_s']:7.1f}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--kinds", nargs="+", choices=("sft", "grpo"), default=["sft", "grpo"])
    parser.add_argument("--heads", nargs="+", choices=HEADS, default=list(HEADS))
    parser.add_argument("--row-tokens", type=int, default=2048, help="tokens per row (sequence length)")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; load average at start {loadavg()}")
    print(f"model {args.model}; rows of {args.row_tokens} tokens; activation checkpointing on; fp32; AdamW")
    results: dict[tuple[str, str, int], dict] = {}
    started = time.perf_counter()
    for kind in args.kinds:
        for tokens in args.tokens:
            for head in args.heads:
                spec = {
                    "model": args.model,
                    "kind": kind,
                    "head": head,
                    "tokens": tokens,
                    "row_tokens": args.row_tokens,
                }
                r = run_child(spec)
                results[(kind, head, tokens)] = r
                print(
                    f"  {kind} {tokens:6d} tokens {head:9}: step peak {r['step_peak_mb']:6.0f} MB above "
                    f"{r['before_step_mb']:6.0f} MB (weights {r['weights_mb'] - r['imports_mb']:.0f} MB), "
                    f"{r['step_s']:.1f} s; load {loadavg()}",
                    flush=True,
                )
    print_table(results, args)
    if args.json:
        args.json.write_text(json.dumps({"|".join(map(str, k)): v for k, v in results.items()}, indent=1))
    print(
        f"total {time.perf_counter() - started:.0f} s; load average at the end {loadavg()}; "
        f"median step time {statistics.median(r['step_s'] for r in results.values()):.1f} s"
    )


if __name__ == "__main__":
    main()
