"""How fast does a critic learn to predict fresh episodes' rewards, and what makes it learn faster?

    python benchmarks/critic_fit.py --checkpoint runs/ppo/checkpoints/step_000020 \\
        --setting base:5e-5:5e-5 --setting base:5e-5:1e-3

Samples `--train` + `--held-out` episodes with the checkpoint's policy (the config's sampling, as
`critic_ceiling.py`), once, and caches them next to `--cache`. Then, for each `--setting`
INIT:BACKBONE_LR:HEAD_LR (INIT: `base`, the config's model, as `posttrain ppo` starts the critic;
`policy`, the checkpoint's policy model), it trains a fresh critic (zero value head) as a PPO run
would see the data: batches of `--batch` episodes in a stream, each batch once, `--epochs` full-batch
AdamW steps on ½ (V − R)² per batch (R the episode's reward: γ = λ_critic = 1, one turn). It prints

- `fresh`: the explained variance of the critic's values on each new batch before it trains on it
  (the trainer's `critic/explained_variance`), averaged over the last `--window` batches;
- `held-out`: explained variance on the held-out episodes (all reply tokens, and the last token),
  every `--every` batches.

This isolates the critic from the policy's learning: the data come from one fixed policy, so the
numbers say how many episodes a critic setting needs, not what a PPO run will show step by step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from critic_ceiling import parse_checkpoint_args, sample_episodes

from posttrain.algorithms.value_loss import explained_variance, last_token_mask
from posttrain.config.ppo import PPOConfig
from posttrain.data.batching import collate
from posttrain.data.tokenize import TokenizedExample
from posttrain.environments.interface import make_environment
from posttrain.modeling.tokenizer import load_tokenizer
from posttrain.models.critic import load_value_model, token_values
from posttrain.models.hub import resolve_model


def episodes(cfg: PPOConfig, checkpoint: Path, count: int, seed: int, cache: Path):
    """(prompt ids, reply ids, rewards) of `count` episodes of the checkpoint's policy, cached."""
    if cache.exists():
        return torch.load(cache)
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(str(checkpoint / "model"))
    policy = AutoModelForCausalLM.from_pretrained(checkpoint / "model", dtype=torch.float32).eval()
    environment = make_environment(cfg.environment.name, **cfg.environment.kwargs)
    try:
        _, prompts, replies, rewards, _ = sample_episodes(cfg, tokenizer, policy, environment, count, seed)
    finally:
        getattr(environment, "close", lambda: None)()
    data = [(p, r, w) for p, r, w in zip(prompts, replies, rewards, strict=True) if r]
    torch.save(data, cache)
    return data


def tensors(data, pad_id: int):
    """A batch of episodes: input ids, attention mask, reply-token mask, per-token returns, each
    reply's last-token mask."""
    batch = collate([TokenizedExample(p + r, [1] * len(p + r)) for p, r, _ in data], pad_id)
    reply = torch.zeros(batch.input_ids.shape)
    returns = torch.zeros(batch.input_ids.shape)
    for i, (p, r, w) in enumerate(data):
        reply[i, len(p) : len(p) + len(r)] = 1
        returns[i, len(p) : len(p) + len(r)] = w
    return batch.input_ids, batch.attention_mask, reply, returns, last_token_mask(reply)


def held_out_ev(model, held, pad_id: int, size: int = 32) -> tuple[float, float]:
    model.eval()
    parts = []
    with torch.no_grad():
        for start in range(0, len(held), size):
            ids, attn, reply, returns, last = tensors(held[start : start + size], pad_id)
            v = token_values(model, ids, attn, packed=False)
            parts += [(v[reply > 0], returns[reply > 0], v[last > 0], returns[last > 0])]
    v, r, vl, rl = (torch.cat([p[k] for p in parts]) for k in range(4))
    return explained_variance(v, r, torch.ones_like(r)), explained_variance(vl, rl, torch.ones_like(rl))


def run(setting: str, model_paths: dict[str, Path], train, held, args, pad_id: int) -> None:
    init, backbone_lr, head_lr = setting.split(":")
    torch.manual_seed(args.seed)
    model = load_value_model(str(model_paths[init]), torch.float32)
    head = list(model.value_head.parameters())
    backbone = [p for n, p in model.named_parameters() if not n.startswith("value_head.")]
    groups = [{"params": head, "lr": float(head_lr)}]
    if float(backbone_lr) > 0:
        groups.append({"params": backbone, "lr": float(backbone_lr)})
    else:
        for p in backbone:
            p.requires_grad_(False)
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    fresh = []
    began = time.perf_counter()
    for b, start in enumerate(range(0, len(train) - args.batch + 1, args.batch)):
        ids, attn, reply, returns, _ = tensors(train[start : start + args.batch], pad_id)
        model.eval()
        with torch.no_grad():
            fresh.append(explained_variance(token_values(model, ids, attn, packed=False), returns, reply))
        model.train()
        for _ in range(args.epochs):
            v = token_values(model, ids, attn, packed=False)
            loss = 0.5 * (((v - returns) ** 2) * reply).sum() / reply.sum()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], 1.0)
            optimizer.step()
        if (b + 1) % args.every == 0:
            every, last = held_out_ev(model, held, pad_id)
            window = fresh[-args.window :]
            print(
                f"{setting:>22} batch {b + 1:3d} ({(b + 1) * args.batch} episodes): "
                f"fresh EV {statistics.mean(window):+.3f} (last {len(window)}), "
                f"held-out EV all {every:+.3f}, last token {last:+.3f}  [{time.perf_counter() - began:.0f} s]",
                flush=True,
            )


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--train", type=int, default=768)
        parser.add_argument("--held-out", type=int, default=256)
        parser.add_argument("--batch", type=int, default=32)
        parser.add_argument("--epochs", type=int, default=1, help="AdamW steps per batch")
        parser.add_argument("--every", type=int, default=8, help="batches between held-out evaluations")
        parser.add_argument("--window", type=int, default=8)
        parser.add_argument(
            "--cache", default=None, help="episode cache (default: CHECKPOINT/critic_fit_episodes.pt)"
        )
        parser.add_argument("--setting", action="append", required=True, help="INIT:BACKBONE_LR:HEAD_LR")

    args, cfg, checkpoint = parse_checkpoint_args(__doc__, options)
    cache = Path(args.cache) if args.cache else checkpoint / "critic_fit_episodes.pt"
    data = episodes(cfg, checkpoint, args.train + args.held_out, args.seed, cache)
    held, train = data[: args.held_out], data[args.held_out : args.held_out + args.train]
    if len(held) + len(train) < args.held_out + args.train:
        print(
            f"note: {len(data)} episodes with a reply (the cache's or the sample's), fewer than asked",
            flush=True,
        )
    rewards = [w for _, _, w in held + train]
    print(f"{len(train)} training and {len(held)} held-out episodes; rewards "
          f"{ {w: rewards.count(w) for w in sorted(set(rewards))} }", flush=True)  # fmt: skip
    pad_id = load_tokenizer(str(checkpoint / "model")).pad_token_id
    paths = {"base": Path(resolve_model(cfg.policy.model_name)), "policy": checkpoint / "model"}
    for setting in args.setting:
        run(setting, paths, train, held, args, pad_id)


if __name__ == "__main__":
    main()
