"""Can a CPU rollout decode from cheaper copies of the weights? Speed against train/sample mismatch
(issue #34, item 3).

    python benchmarks/rollout_precision.py [--rows 16] [--new-tokens 64] [--threads 2]

Two tables, both against fp32 in the same process:

1. One projection `y = x W^T` at 16 rows (a decode step of 16 sequences) for SmolLM2-135M's three
   linear shapes: fp32, bf16 (`F.linear` on bf16 tensors), int8 weight-only
   (`aten._weight_int8pack_mm`, per-channel scales) and fbgemm's dynamic int8 (`quantize_dynamic`:
   int8 weights per tensor, activations quantised per tensor at run time). Median of repeats.
2. Sampling with posttrain's HF sampler (`hf_generate`, 16 rows, temperature 1) from copies of the
   model: bf16, and dynamic int8 over several sets of linear layers. Per variant: generated tokens/s
   relative to fp32, and the mismatch a trainer in fp32 would see on the variant's own samples:
   mean and 95th percentile of |log pi_fp32(t) - log pi_variant(t)| over the sampled tokens, and
   the share of tokens whose ratio pi_fp32 / pi_variant lies in [0.5, 2] (inside a truncated
   importance weight's usual bounds).

A rollout precision is worth using when it is faster and its mismatch is small enough that importance
correction (TIS / ICE-POP) keeps most tokens; the table shows whether any variant is both on this CPU.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from machine import cpu_model  # benchmarks/machine.py (the script's folder is on sys.path)

SHAPES = ((1536, 576), (576, 1536), (576, 576))
"""(out, in) of SmolLM2-135M's MLP up/gate, MLP down and attention projections."""

LINEAR_SETS = {
    "int8 all linears": lambda name: True,
    "int8 all but lm_head": lambda name: "lm_head" not in name,
    "int8 attention + MLP gate/up": lambda name: (
        "self_attn" in name or "gate_proj" in name or "up_proj" in name
    ),
    "int8 attention only": lambda name: "self_attn" in name,
}


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def projection_arms(out_features: int, in_features: int, rows: int) -> dict:
    """The four ways of computing one projection, as callables on the same random x and W."""
    x, w = torch.randn(rows, in_features), torch.randn(out_features, in_features)
    scales = w.abs().amax(1) / 127
    w_int8 = torch.round(w / scales[:, None]).to(torch.int8)
    xb, wb = x.bfloat16(), w.bfloat16()
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    linear.weight.data.copy_(w)
    dynamic = torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(linear), {torch.nn.Linear}, dtype=torch.qint8
    )
    return {
        "fp32": lambda: F.linear(x, w),
        "bf16": lambda: F.linear(xb, wb),
        "int8 weight-only": lambda: torch.ops.aten._weight_int8pack_mm(x, w_int8, scales),
        "dynamic int8": lambda: dynamic(x),
    }


def projection_table(rows: int, repeats: int) -> None:
    print(f"\n1. one projection, {rows} rows: median ms (ratio to fp32; > 1 is slower)")
    print(f"{'out x in':>12} {'fp32':>8} {'bf16':>14} {'int8 weight-only':>18} {'dynamic int8':>16}")
    for out_features, in_features in SHAPES:
        arms = projection_arms(out_features, in_features, rows)
        ms = {k: median_ms(fn, repeats) for k, fn in arms.items()}
        cells = [f"{ms[k]:7.3f} ({ms[k] / ms['fp32']:4.1f}x)" for k in list(arms)[1:]]
        print(
            f"{out_features:>5} x {in_features:<5} {ms['fp32']:8.3f} {cells[0]:>14} {cells[1]:>18} {cells[2]:>16}"
        )


def sampled_logprobs(model, prompt: list[int], samples: list[list[int]]) -> torch.Tensor:
    """log pi(t) of every sampled token under `model`, teacher-forced in fp32 logits."""
    out = []
    with torch.no_grad():
        for ids in samples:
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
            out.append(torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0])
    return torch.cat(out)


def sampling_table(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    from posttrain.generation.sampling import SamplingParams, hf_generate
    from posttrain.modeling.loading import load_causal_lm
    from posttrain.modeling.tokenizer import load_tokenizer
    from posttrain.models.hub import resolve_model

    path = resolve_model(args.model)
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path, torch.float32).eval()
    messages = [{"role": "user", "content": "What is 3 + 4? Explain your answer."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=0)

    def rate(m) -> tuple[float, list[list[int]]]:
        hf_generate(m, tokenizer, [prompt] * 2, params, batch_size=2)  # warm-up
        start = time.perf_counter()
        out = hf_generate(m, tokenizer, [prompt] * args.rows, params, batch_size=args.rows)
        return sum(map(len, out.token_ids)) / (time.perf_counter() - start), out.token_ids

    # the fp32 copy checks the measurement itself: its mismatch must be exactly 0
    variants = {"fp32 (a copy)": copy.deepcopy(model), "bf16": copy.deepcopy(model).bfloat16()}
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    for label, pick in LINEAR_SETS.items():
        spec = {n for n in linears if pick(n)}
        variants[label] = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model), spec, dtype=torch.qint8
        )
    fp32_rate, _ = rate(model)
    print(f"\n2. sampling {args.rows} rows x {args.new_tokens} new tokens; fp32: {fp32_rate:.1f} tokens/s")
    print(
        f"{'variant':>30} {'tokens/s vs fp32':>17} {'mean |dlogp|':>13} {'p95 |dlogp|':>12} {'ratio in [0.5, 2]':>18}"
    )
    results = {}
    for label, variant in variants.items():
        variant_rate, samples = rate(variant)
        diff = (sampled_logprobs(model, prompt, samples) - sampled_logprobs(variant, prompt, samples)).abs()
        inside = (diff <= torch.log(torch.tensor(2.0))).float().mean().item()
        results[label] = {
            "speed_vs_fp32": variant_rate / fp32_rate,
            "mean_abs_dlogp": diff.mean().item(),
            "p95_abs_dlogp": diff.quantile(0.95).item(),
            "ratio_in_bounds": inside,
        }
        print(
            f"{label:>30} {variant_rate / fp32_rate:16.2f}x {diff.mean().item():13.3f} "
            f"{diff.quantile(0.95).item():12.3f} {inside:17.1%}"
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument(
        "--json", help="also write table 2 here, {variant: {speed_vs_fp32, mean_abs_dlogp, ...}}"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # torch.ao.quantization's notice
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"{cpu_model()}; torch {torch.__version__}, {args.threads} threads; load average {os.getloadavg()[0]:.2f}"
    )
    projection_table(args.rows, args.repeats)
    results = sampling_table(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"\nload average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
