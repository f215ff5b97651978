"""Episodes per second through the OpenAI-compatible endpoint against the in-process rollout, on the
same workload, in one process.

    python benchmarks/endpoint_overhead.py [--tasks 4] [--group 4] [--rounds 2] [--backend hf|vllm]

The workload is the calculator tool task (SmolLM2-135M-Instruct, its tool schema and one worked
example, temperature 1, up to 3 turns of 48 new tokens). Arms, alternated round by round:

- in_process: `run_rollouts` with the turn barrier (every episode generates, then every one is stepped);
- endpoint: `run_agent_rollouts`: one agent per episode (a thread) plays the same episode with the
  `openai` client over loopback HTTP (the environment's first messages and schema, its tool registry for
  the calls, the environment's verdict on the final transcript); the endpoint batches the running
  agents' requests into one generator call (`GenerationQueue`).

`--temperature 0` makes both arms play the same greedy episodes (the endpoint's are token for token
the in-process ones), so their ratio is the endpoint's overhead alone; sampled, the arms' episodes
differ in length and number of turns from round to round, and the ratio carries that noise.

Per round and arm: the generator calls and rows per call (the endpoint batches whatever requests are
pending; the turn barrier generates every live episode of a turn in one call). Printed per arm: the median over rounds of episodes/s and generated tokens/s (sampled episodes differ
in length from arm to arm, so tokens/s is the fairer rate), and endpoint / in_process for both; the
issue's target is >= 0.8. On a shared machine other processes' load distorts both arms (the load
average is printed); compare runs made on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from posttrain.rollout.calculator_replay import CALCULATOR_KWARGS, MAX_TOKENS, MAX_TURNS


def generator_calls(arm: str, out) -> tuple[int, float]:
    """(generator calls, rows per call) of one arm's rollout: the endpoint counts its batches; the turn
    barrier makes one call per turn for every episode still running."""
    if arm == "endpoint":
        return int(out.env_metrics["agent/generator_calls"]), out.env_metrics["agent/rows_per_call"]
    turns = [t.num_turns for t in out.trajectories]
    return max(turns), sum(turns) / max(turns)


def main() -> None:
    import torch

    from posttrain.config.rollout import AgentConfig
    from posttrain.environments.calculator import CalculatorEnvironment
    from posttrain.generation.sampling import SamplingParams
    from posttrain.generation.text_generation import LocalGenerator
    from posttrain.modeling.tokenizer import load_tokenizer
    from posttrain.models.hub import resolve_model
    from posttrain.rollout.agent import run_agent_rollouts
    from posttrain.rollout.rollout import run_rollouts

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4, help="G")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="0: greedy, so both arms play the same episodes and the ratio is the endpoint's overhead alone",
    )
    parser.add_argument("--batch-wait-s", type=float, default=None, help="environment.agent.batch_wait_s")
    parser.add_argument("--batch-max-wait-s", type=float, default=None, help="...agent.batch_max_wait_s")
    args = parser.parse_args()

    path = resolve_model(args.model)
    tokenizer = load_tokenizer(path)
    generator = LocalGenerator(path, tokenizer, backend=args.backend, device="cpu", max_model_len=2048)
    env = CalculatorEnvironment(**CALCULATOR_KWARGS)
    tasks = env.generate_tasks(args.tasks, seed=0)
    waits = {"batch_wait_s": args.batch_wait_s, "batch_max_wait_s": args.batch_max_wait_s}
    agent = AgentConfig(
        function="posttrain.rollout.calculator_replay:replay_calculator_agent",
        **{k: v for k, v in waits.items() if v is not None},
    )
    common = dict(
        generations_per_prompt=args.group,
        generator=generator,
        environment=env,
        tokenizer=tokenizer,
        batch_size=args.tasks * args.group,
        max_turns=MAX_TURNS,
        max_seq_len=1024,
    )
    print(
        f"{args.backend}; torch threads {torch.get_num_threads()}; {args.tasks} tasks x {args.group}; "
        f"temperature {args.temperature}; "
        f"endpoint batch wait {agent.batch_wait_s} s quiet, {agent.batch_max_wait_s} s at most; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    rates: dict[str, list[tuple[float, float]]] = {"in_process": [], "endpoint": []}
    for r in range(args.rounds):
        params = SamplingParams(temperature=args.temperature, max_new_tokens=MAX_TOKENS, seed=r)
        for arm in rates:
            start = time.perf_counter()
            if arm == "in_process":
                out = run_rollouts(tasks, params=params, turn_barrier=True, **common)
            else:
                out = run_agent_rollouts(tasks, agent=agent, params=params, **common)
            seconds = time.perf_counter() - start
            episodes, tokens = len(out.trajectories), sum(t.response_length for t in out.trajectories)
            rates[arm].append((episodes / seconds, tokens / seconds))
            calls, rows = generator_calls(arm, out)
            print(
                f"round {r} {arm:10s} {seconds:7.1f} s  {episodes / seconds:6.3f} episodes/s  "
                f"{tokens / seconds:7.1f} tokens/s  turns {out.env_metrics['episode/turns_mean']:.2f}  "
                f"generator calls {calls} ({rows:.1f} rows each)"
            )
    med = {arm: [statistics.median(x[i] for x in v) for i in (0, 1)] for arm, v in rates.items()}
    for arm, (eps, tps) in med.items():
        print(f"{arm:10s} median {eps:6.3f} episodes/s  {tps:7.1f} tokens/s")
    ratio_e, ratio_t = (med["endpoint"][i] / med["in_process"][i] for i in (0, 1))
    print(
        f"endpoint / in_process: episodes/s {ratio_e:.2f}, tokens/s {ratio_t:.2f}; load average {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
