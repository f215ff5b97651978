"""One step's rollouts with DAPO's dynamic sampling (`collect_groups`), for every algorithm that
trains on groups drawn round by round (GRPO; PPO with dynamic sampling off)."""

from __future__ import annotations

from collections.abc import Callable

from posttrain.algorithms.dapo import zero_variance_groups
from posttrain.data.trajectory import Trajectory
from posttrain.rollout.rollout import Rollouts


def collect_groups(
    draw: Callable[[int], Rollouts],
    *,
    groups: int,
    group_size: int,
    dynamic_sampling: bool,
    max_rounds: int,
    unit: int = 1,
) -> tuple[Rollouts, dict[str, float]]:
    """The trajectories of one step; with dynamic sampling (DAPO), only groups whose rewards differ.

    ``draw(round)`` generates and scores one round (``groups`` prompts × ``group_size``, round
    1, 2, ...). Without dynamic sampling that one round is the batch. With it, groups with all-equal
    rewards among their scored samples (or fewer than two scored: ``zero_variance_groups``) are
    dropped and rounds are drawn until ``groups`` groups are kept, at most ``max_rounds``. If the
    batch is still short then, it trains on the groups kept (whole groups, as many as give a
    multiple of ``unit`` sequences: the batch must split evenly over updates × data-parallel workers): ``dapo/short_batch`` = 1. If none can be kept, the
    trajectories are empty and the caller skips the update: ``dapo/skipped_update`` = 1.

    Returns (Rollouts, stats) with stats dapo/generation_rounds, reward/zero_variance_fraction and,
    with dynamic sampling, dapo/kept_groups, dapo/short_batch, dapo/skipped_update.
    """
    kept: list[Trajectory] = []
    env_metrics: dict[str, float] = {}
    zero_fraction: list[float] = []
    target = groups * group_size
    rounds = 0
    while True:
        rounds += 1
        batch = draw(rounds)
        env_metrics = env_metrics or batch.env_metrics
        zero = zero_variance_groups(batch.rewards, batch.group_ids, scored=batch.scored)
        zero_fraction.append(float(zero.float().mean()))
        if not dynamic_sampling:
            kept = batch.trajectories
            break
        kept += [t for t, z in zip(batch.trajectories, zero.tolist(), strict=True) if not z]
        if len(kept) >= target or rounds >= max_rounds:
            break
    stats = {
        "dapo/generation_rounds": float(rounds),
        "reward/zero_variance_fraction": sum(zero_fraction) / rounds,
    }
    if dynamic_sampling:
        short = len(kept) < target
        if short:  # whole groups (kept holds whole groups, in order), a multiple of `unit` sequences
            kept_groups = len(kept) // group_size
            while kept_groups > 0 and (kept_groups * group_size) % unit:
                kept_groups -= 1
            kept = kept[: kept_groups * group_size]
        else:
            kept = kept[:target]
        stats["dapo/kept_groups"] = float(len(kept) // group_size)
        stats["dapo/short_batch"] = float(short)
        stats["dapo/skipped_update"] = float(not kept)
    return Rollouts(kept, env_metrics), stats
