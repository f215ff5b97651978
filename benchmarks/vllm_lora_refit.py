"""LoRA refits into vLLM: merged weights (W + s·BA for every adapted layer) against serving the adapter
with vLLM's LoRA support (generation.vllm.lora_adapter: only A and B travel), and what each costs
generation.

Usage:

    python benchmarks/vllm_lora_refit.py                            # SmolLM2-135M, r=16 all-linear
    python benchmarks/vllm_lora_refit.py --refits 2 --new-tokens 4 --prompts 2     # smoke run

Each arm is a child process (one vLLM engine per process) holding a colocated LoRA policy
(`ActorPolicy`, fp32 master weights, the engine in `--dtype`) built like `posttrain grpo --config
examples/configs/grpo_lora.yaml generation.backend=vllm`. It perturbs the adapters (as a training step
would), refits, and repeats `--refits` times after one warm-up refit; then times a greedy generate of
`--prompts` prompts x `--new-tokens` tokens with the refitted engine. Reported: median refit seconds,
median generate seconds. The refit of the adapter arm is: gather A and B, write them as a peft folder,
vLLM loads it as a new adapter and removes the previous one; the merged arm: compute W + s·BA for every
adapted layer and copy every weight into the engine.
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

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = Path.home() / ".cache/posttrain/models/smollm2-135m-instruct"
ARMS = ("merged", "adapter")


def run_arm(args: argparse.Namespace) -> dict[str, float]:
    """In the child: build the policy and its engine, time refits and one generate call."""
    import torch

    from posttrain.config.common import LoraConfig, PolicyConfig
    from posttrain.config.rollout import GenerationConfig, VLLMConfig
    from posttrain.distributed.actor import ActorPolicy
    from posttrain.generation.sampling import SamplingParams
    from posttrain.models.lora import adapted_layers

    adapter = args.arm == "adapter"
    policy = ActorPolicy(
        PolicyConfig(
            model_name=args.model, max_seq_len=256, lora=LoraConfig(rank=args.rank, alpha=2 * args.rank)
        ),
        model_path=args.model,
        total_steps=1,
        tokenizer_path=args.model,
        generation=GenerationConfig(
            backend="vllm", vllm=VLLMConfig(dtype=args.dtype, lora_adapter=adapter, cpu_kv_cache_gib=1)
        ),
        lora_adapter_refit=adapter,
    )
    generator = torch.Generator().manual_seed(0)
    layers = list(adapted_layers(policy.model).values())

    def perturb() -> None:
        with torch.no_grad():
            for layer in layers:
                b = layer.lora_B["default"].weight
                b.add_(torch.randn(b.shape, generator=generator) * 1e-3)

    times = []
    for i in range(args.refits + 1):
        perturb()
        start = time.perf_counter()
        policy.refit_engine()
        if i > 0:  # the first refit records vLLM's copy plan (merged) or loads the first adapter
            times.append(time.perf_counter() - start)
    tokenizer = policy.tokenizer
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Explain why {i} + {i + 7} = {2 * i + 7}."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(args.prompts)
    ]
    greedy = SamplingParams(temperature=0, max_new_tokens=args.new_tokens)
    policy.generate(prompts, greedy, args.prompts)  # warm-up
    start = time.perf_counter()
    out = policy.generate(prompts, greedy, args.prompts)
    generate_s = time.perf_counter() - start
    tokens = sum(len(t) for t in out.token_ids)
    return {"refit_s": statistics.median(times), "generate_s": generate_s, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--refits", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--arm", choices=ARMS, help="(internal) run one arm in this process")
    args = parser.parse_args()
    if args.arm:
        print("RESULT " + json.dumps(run_arm(args)), flush=True)
        return
    results = {}
    for arm in ARMS:
        print(f"{arm}: load average {os.getloadavg()[0]:.2f}", flush=True)
        argv = [*sys.argv[1:], "--arm", arm]
        done = subprocess.run(
            [sys.executable, __file__, *argv], check=True, cwd=ROOT, capture_output=True, text=True
        )
        [line] = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        results[arm] = json.loads(line.removeprefix("RESULT "))
        print(f"{arm}: {results[arm]}", flush=True)
    merged, adapter = results["merged"], results["adapter"]
    print(
        f"refit: merged {merged['refit_s']:.3f} s, adapter {adapter['refit_s']:.3f} s "
        f"({adapter['refit_s'] / merged['refit_s']:.2f}x); generate: merged {merged['generate_s']:.2f} s, "
        f"adapter {adapter['generate_s']:.2f} s ({adapter['generate_s'] / merged['generate_s']:.2f}x); "
        f"generated tokens {merged['tokens']} and {adapter['tokens']}"
    )


if __name__ == "__main__":
    main()
