"""How much of the returns' variance a PPO checkpoint's critic explains, against the best any critic could.

    python benchmarks/critic_ceiling.py --checkpoint runs/ppo/checkpoints/step_000020
    python benchmarks/critic_ceiling.py --checkpoint DIR --config examples/configs/ppo_math.yaml \\
        --episodes 32 --k 16 [key=value ...]        (config overrides, as for `posttrain ppo`)

Samples one reply to each of `--episodes` training tasks with the checkpoint's policy (the config's
sampling), scores them with the config's environment, and reads the checkpoint critic's values V(s_t)
of every reply token. With γ = λ_critic = 1, one turn and no KL in the reward, every token's value
target is the episode's reward R. The best possible critic predicts V*(s_t) = E[R | s_t], the expected
reward of the policy continuing from the reply's first t tokens; the script estimates it by sampling
`--k` continuations of every prefix (same policy, temperature and token budget) and scoring them.

Prints the explained variance EV = 1 − Var(R − V) / Var(R) over the reply tokens (the trainer's
`critic/explained_variance`) of the critic and of the Monte-Carlo V* (the ceiling; the estimate's own
sampling noise is removed, `monte_carlo_explained_variance`), on all tokens, on each reply's last
token, and on its first (V* there: the prompt's success rate). The ratio critic/ceiling says how far
the critic is from what the task allows; a low ceiling says the task's returns are not predictable
before the answer is written, whatever the critic.

Single-turn environments without a response prefix only. Cost: episodes × reply tokens × k sampled
continuations (32 × ~12 × 16 ≈ 6 000 short generations of SmolLM2-135M: minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from posttrain.algorithms.value_loss import explained_variance, monte_carlo_explained_variance
from posttrain.config import load_config
from posttrain.config.ppo import PPOConfig
from posttrain.data.batching import collate
from posttrain.data.tokenize import TokenizedExample
from posttrain.environments.interface import make_environment
from posttrain.environments.tools import prompt_ids_of
from posttrain.generation.sampling import SamplingParams, hf_generate
from posttrain.modeling.tokenizer import load_tokenizer
from posttrain.models.critic import load_trained_value_model, token_values
from posttrain.rollout.episode import start_episodes
from posttrain.rollout.tasks import rl_tasks


def check_returns_are_rewards(cfg: PPOConfig) -> None:
    """The ceiling's targets are the episode's reward: refuse configs whose returns are not."""
    problems = []
    if cfg.advantage.gamma != 1.0 or cfg.advantage.lam_critic != 1.0:
        problems.append("advantage.gamma and advantage.lam_critic must be 1")
    if cfg.environment.max_turns != 1:
        problems.append("environment.max_turns must be 1")
    if cfg.loss.kl_in_reward and cfg.loss.kl_beta > 0:
        problems.append("loss.kl_in_reward must be off")
    if problems:
        raise SystemExit(
            "critic_ceiling: the value targets must be the episode's reward: " + "; ".join(problems)
        )


def parse_checkpoint_args(
    doc: str, options: Callable[[argparse.ArgumentParser], None], folders: tuple[str, ...] = ("model",)
) -> tuple[argparse.Namespace, PPOConfig, Path]:
    """The critic benchmarks' command line: --checkpoint (a step_* folder holding `folders`), --config,
    --seed, the script's own `options`, and config overrides (key=value, as for `posttrain ppo`).
    Returns (arguments, config, checkpoint); exits when the config's value targets are not the
    episode's reward or a folder is missing."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--checkpoint", required=True, help=f"a step_* folder of a run (with {', '.join(folders)})"
    )
    parser.add_argument("--config", default="examples/configs/ppo_math.yaml")
    parser.add_argument("--seed", type=int, default=0)
    options(parser)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = load_config(PPOConfig, args.config, args.overrides)
    check_returns_are_rewards(cfg)
    checkpoint = Path(args.checkpoint)
    for folder in folders:
        if not (checkpoint / folder).is_dir():
            raise SystemExit(
                f"{parser.prog}: {checkpoint} has no {folder}/ folder (a step_* folder of a run)"
            )
    return args, cfg, checkpoint


def score(environment, starts, replies: list[str]) -> list[float]:
    logs = [
        s.messages + [{"role": "assistant", "content": text}] for s, text in zip(starts, replies, strict=True)
    ]
    return list(environment.step(logs, [dict(s.metadata) for s in starts]).rewards)


def sample_episodes(cfg: PPOConfig, tokenizer, policy, environment, episodes: int, seed: int):
    """One reply of `policy` (the config's sampling) to each of `episodes` training tasks picked by
    `seed`, and its reward: (starts, prompt ids, reply ids, rewards, sampling params)."""
    tasks = rl_tasks(
        cfg.data,
        cfg.environment,
        tokenizer=tokenizer,
        max_prompt_len=cfg.policy.max_seq_len - cfg.generation.max_new_tokens,
    ).train
    pick = torch.randperm(len(tasks), generator=torch.Generator().manual_seed(seed))[:episodes]
    starts = start_episodes(environment, [tasks[i] for i in pick.tolist()], [seed] * len(pick))
    if any(s.response_prefix or s.tools for s in starts):
        raise SystemExit("environments with a response prefix or tools are not supported")
    prompts = [prompt_ids_of(tokenizer, s) for s in starts]
    g = cfg.generation
    params = SamplingParams(
        temperature=g.temperature, top_p=g.top_p, top_k=g.top_k, max_new_tokens=g.max_new_tokens, seed=seed
    )
    replies = hf_generate(policy, tokenizer, prompts, params).token_ids
    rewards = score(environment, starts, [tokenizer.decode(r, skip_special_tokens=True) for r in replies])
    return starts, prompts, replies, rewards, params


def monte_carlo_values(policy, tokenizer, environment, starts, prompts, replies, params, k: int):
    """Per reply, per token t: (mean, variance of the mean) of k rewards of continuations of reply[:t]."""
    means = [[0.0] * len(r) for r in replies]
    noise = [[0.0] * len(r) for r in replies]
    for t in range(max(len(r) for r in replies)):
        rows = [i for i, r in enumerate(replies) if len(r) > t]
        budget = dataclasses.replace(params, max_new_tokens=params.max_new_tokens - t, seed=1000 + t)
        prefixes = [prompts[i] + replies[i][:t] for i in rows for _ in range(k)]
        out = hf_generate(policy, tokenizer, prefixes, budget, batch_size=16 * k)
        texts = [
            tokenizer.decode(replies[i][:t] + out.token_ids[n * k + j], skip_special_tokens=True)
            for n, i in enumerate(rows)
            for j in range(k)
        ]
        rewards = score(environment, [starts[i] for i in rows for _ in range(k)], texts)
        for n, i in enumerate(rows):
            draws = torch.tensor(rewards[n * k : (n + 1) * k], dtype=torch.float64)
            means[i][t] = float(draws.mean())
            noise[i][t] = float(draws.var(unbiased=True)) / k
    return means, noise


def critic_values(
    critic, prompts: list[list[int]], replies: list[list[int]], pad_id: int
) -> list[list[float]]:
    """V(s_t) of every reply token (the value head read at the token before it)."""
    rows = [p + r for p, r in zip(prompts, replies, strict=True)]
    batch = collate([TokenizedExample(row, [1] * len(row)) for row in rows], pad_id)
    with torch.no_grad():
        values = token_values(critic, batch.input_ids, batch.attention_mask, packed=False)
    return [
        values[i, len(p) : len(p) + len(r)].tolist()
        for i, (p, r) in enumerate(zip(prompts, replies, strict=True))
    ]


def report(name: str, r: list[float], v: list[float], noise: list[float] | None = None) -> str:
    rt, vt = torch.tensor(r, dtype=torch.float64), torch.tensor(v, dtype=torch.float64)
    if noise is None:
        return f"{name} {explained_variance(vt, rt, torch.ones_like(rt)):+.3f}"
    return f"{name} {monte_carlo_explained_variance(rt, vt, torch.tensor(noise, dtype=torch.float64)):+.3f}"


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--episodes", type=int, default=32)
        parser.add_argument("--k", type=int, default=16, help="continuations per prefix")

    args, cfg, checkpoint = parse_checkpoint_args(__doc__, options, folders=("model", "critic"))
    began = time.perf_counter()

    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(str(checkpoint / "model"))
    policy = AutoModelForCausalLM.from_pretrained(checkpoint / "model", dtype=torch.float32).eval()
    critic = load_trained_value_model(checkpoint / "critic")
    environment = make_environment(cfg.environment.name, **cfg.environment.kwargs)
    try:
        starts, prompts, replies, rewards, params = sample_episodes(
            cfg, tokenizer, policy, environment, args.episodes, args.seed
        )
        values = critic_values(critic, prompts, replies, tokenizer.pad_token_id)
        v_star, noise = monte_carlo_values(
            policy, tokenizer, environment, starts, prompts, replies, params, args.k
        )
    finally:
        getattr(environment, "close", lambda: None)()

    kept = [i for i, r in enumerate(replies) if r]
    flat = lambda per_reply, which: [x for i in kept for x in which(per_reply[i])]  # noqa: E731
    every, last, first = (lambda xs: xs), (lambda xs: xs[-1:]), (lambda xs: xs[:1])
    returns = [rewards[i] for i in kept]
    targets = {name: [returns[n] for n, i in enumerate(kept) for _ in which(replies[i])] for name, which in
               (("all", every), ("last", last), ("first", first))}  # fmt: skip
    lengths = [len(replies[i]) for i in kept]
    print(
        f"checkpoint {checkpoint}: {len(kept)} replies, {sum(lengths)} tokens (median {statistics.median(lengths)})"
    )
    print(
        f"reward mean {statistics.mean(returns):.3f}, Var(R) over tokens {statistics.pvariance(targets['all']):.4f}"
    )
    for name, which in (("all", every), ("last", last), ("first", first)):
        critic_line = report("critic EV", targets[name], flat(values, which))
        ceiling_line = report("ceiling EV", targets[name], flat(v_star, which), flat(noise, which))
        print(f"{name:>5} tokens: {critic_line}   {ceiling_line}")
    print(f"{args.k} continuations per prefix, {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
