"""Can a linear value head on a model's frozen hidden states predict a reply's reward?

    python benchmarks/critic_probe.py --checkpoint runs/ppo/checkpoints/step_000020 --episodes 512

Samples one reply to each of `--episodes` training tasks with the checkpoint's policy (the config's
sampling, as `critic_ceiling.py`) and scores it. For each model (the base model the config names and
the checkpoint's policy) and every third layer, it fits a ridge regression from the hidden state at
t − 1 (where the critic reads V(s_t)) to the episode's reward, on every reply token of the first 75%
of the episodes, and prints the explained variance on the other 25% (held out), over all reply
tokens and over each reply's last token.

A critic is such a head plus a backbone that trains; the probe shows how much of the reward the
backbone's features already carry in a linear reading, from as many episodes as a short PPO run
collects. Single-turn environments without a response prefix only.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from critic_ceiling import parse_checkpoint_args, sample_episodes

from posttrain.algorithms.value_loss import explained_variance
from posttrain.environments.interface import make_environment
from posttrain.modeling.tokenizer import load_tokenizer
from posttrain.models.hub import resolve_model


def reply_features(model_path: str | Path, prompts: list[list[int]], replies: list[list[int]]):
    """Per episode, [layers + 1, reply length, hidden]: every layer's hidden state at t − 1 for each reply token t."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt, reply in zip(prompts, replies, strict=True):
            states = model(input_ids=torch.tensor([prompt + reply]), output_hidden_states=True).hidden_states
            out.append(torch.stack([h[0, len(prompt) - 1 : len(prompt) + len(reply) - 1] for h in states]))
    return out


def probe(features, rewards: list[float], layer: int, ridge: float, cut: int) -> tuple[float, float]:
    """Held-out EV (all reply tokens, last token) of a ridge fit on episodes [0, cut)."""

    def rows(episodes, last_only: bool):
        x = [features[i][layer][-1:] if last_only else features[i][layer] for i in episodes]
        y = [rewards[i] for i, f in zip(episodes, x, strict=True) for _ in range(len(f))]
        return torch.cat(x).double(), torch.tensor(y, dtype=torch.float64)

    x, y = rows(range(cut), False)
    mean, std = x.mean(0), x.std(0) + 1e-6

    def design(x):
        return torch.cat([(x - mean) / std, torch.ones(len(x), 1, dtype=torch.float64)], 1)

    a = design(x)
    w = torch.linalg.solve(a.T @ a + ridge * torch.eye(a.shape[1], dtype=torch.float64), a.T @ y)
    held_out = range(cut, len(features))
    results = []
    for last_only in (False, True):
        xt, yt = rows(held_out, last_only)
        results.append(explained_variance(design(xt) @ w, yt, torch.ones_like(yt)))
    return results[0], results[1]


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--episodes", type=int, default=512)
        parser.add_argument("--ridge", type=float, nargs="+", default=[100.0, 1000.0])

    args, cfg, checkpoint = parse_checkpoint_args(__doc__, options)
    began = time.perf_counter()

    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(str(checkpoint / "model"))
    policy = AutoModelForCausalLM.from_pretrained(checkpoint / "model", dtype=torch.float32).eval()
    environment = make_environment(cfg.environment.name, **cfg.environment.kwargs)
    try:
        _, prompts, replies, rewards, _ = sample_episodes(
            cfg, tokenizer, policy, environment, args.episodes, args.seed
        )
    finally:
        getattr(environment, "close", lambda: None)()
    kept = [i for i, r in enumerate(replies) if r]
    prompts, replies, rewards = (
        [prompts[i] for i in kept],
        [replies[i] for i in kept],
        [rewards[i] for i in kept],
    )
    cut = int(0.75 * len(kept))
    counts = {r: rewards.count(r) for r in sorted(set(rewards))}
    print(f"{len(kept)} replies (fit on {cut}, held out {len(kept) - cut}); rewards {counts}", flush=True)
    for name, path in (("base", resolve_model(cfg.policy.model_name)), ("policy", checkpoint / "model")):
        features = reply_features(path, prompts, replies)
        for layer in range(0, features[0].shape[0], 3):
            for ridge in args.ridge:
                every, last = probe(features, rewards, layer, ridge, cut)
                print(
                    f"{name:>6} layer {layer:2d} ridge {ridge:g}: held-out EV all tokens {every:+.3f}, last {last:+.3f}"
                )
    print(f"{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
