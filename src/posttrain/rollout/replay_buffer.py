"""The replay buffer of asynchronous GRPO: rollout groups between the generator and the trainer.

Each group (one prompt's G trajectories) records the policy version that generated it. The
trainer, at policy version v, takes groups whose age v - version is at most `max_age`:

- staleness eviction: groups older than `max_age` are dropped (and counted in `dropped`) when the
  trainer samples; they never reach the loss;
- sampling rule: the oldest fresh groups first (FIFO), of whatever version. The trainer never
  waits for one particular version (strict target-step matching stalls a trainer when the
  generator runs late or early), so it starves only when no fresh group exists at all, which the
  collector's throttle (`posttrain.rollout.async_collector`) rules out;
- size bound: at most `capacity` groups; `put` refuses more (the collector waits for room).

`state_dict` / `load_state_dict` carry the groups (trajectories, versions, order) and the
counters through a checkpoint, so that a resumed run trains on the same data in the same order.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from posttrain.data.trajectory import ClosedContext, Trajectory


@dataclass
class RolloutGroup:
    """One prompt's trajectories, the policy version that generated them, and the batch they came in
    (`batch_index`: the collector's count; `batch_metrics`: that batch's environment metrics)."""

    trajectories: list[Trajectory]
    policy_version: int
    batch_index: int
    batch_metrics: dict[str, float] = field(default_factory=dict)

    def age(self, version: int) -> int:
        """How many policy updates the trainer (at `version`) is ahead of this group's generator."""
        return version - self.policy_version


class ReplayBuffer:
    """FIFO of `RolloutGroup`s bounded by `capacity`, evicting groups older than `max_age` steps."""

    def __init__(self, capacity: int, max_age: int) -> None:
        if capacity <= 0:
            raise ValueError(f"replay buffer capacity must be > 0, got {capacity}")
        if max_age < 0:
            raise ValueError(f"max_trajectory_age_steps must be >= 0, got {max_age}")
        self.capacity = capacity
        self.max_age = max_age
        self.groups: deque[RolloutGroup] = deque()
        self.dropped = 0  # groups evicted as too old, since the run began

    def __len__(self) -> int:
        return len(self.groups)

    @property
    def free(self) -> int:
        return self.capacity - len(self.groups)

    @property
    def fill(self) -> float:
        """Share of the capacity in use, in [0, 1]."""
        return len(self.groups) / self.capacity

    def put(self, group: RolloutGroup) -> None:
        if self.free <= 0:
            raise OverflowError(f"the replay buffer is full ({self.capacity} groups)")
        self.groups.append(group)

    def evict_stale(self, version: int) -> int:
        """Drop the groups older than `max_age` at trainer version `version`; returns how many."""
        kept = deque(g for g in self.groups if g.age(version) <= self.max_age)
        evicted = len(self.groups) - len(kept)
        self.groups = kept
        self.dropped += evicted
        return evicted

    def sample(self, n: int, version: int) -> list[RolloutGroup] | None:
        """The `n` oldest groups fresh enough for trainer version `version`, removed from the buffer,
        after evicting the stale ones; None (nothing removed) while fewer than `n` are fresh."""
        self.evict_stale(version)
        if len(self.groups) < n:
            return None
        return [self.groups.popleft() for _ in range(n)]

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "max_age": self.max_age,
            "dropped": self.dropped,
            "groups": [
                {
                    "trajectories": [dataclasses.asdict(t) for t in g.trajectories],
                    "policy_version": g.policy_version,
                    "batch_index": g.batch_index,
                    "batch_metrics": dict(g.batch_metrics),
                }
                for g in self.groups
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore groups and counters; the capacity and age bound stay this buffer's own (a resumed run
        may change them: groups beyond the capacity are refused, stale ones evicted at the next sample)."""
        groups = [
            RolloutGroup(
                trajectories=[_trajectory(t) for t in g["trajectories"]],
                policy_version=g["policy_version"],
                batch_index=g["batch_index"],
                batch_metrics=g["batch_metrics"],
            )
            for g in state["groups"]
        ]
        if len(groups) > self.capacity:
            raise ValueError(
                f"the checkpoint's replay buffer holds {len(groups)} groups, more than this run's capacity "
                f"({self.capacity}); raise grpo.async_buffer_groups"
            )
        self.groups = deque(groups)
        self.dropped = state["dropped"]


def _trajectory(fields: dict[str, Any]) -> Trajectory:
    fields = dict(fields)
    fields["turn_spans"] = [tuple(span) for span in fields.get("turn_spans", [])]
    fields["stop_strings"] = tuple(fields.get("stop_strings", ()))
    fields["contexts"] = [
        ClosedContext(**{**c, "turn_spans": [tuple(span) for span in c["turn_spans"]]})
        for c in fields.get("contexts", [])
    ]
    return Trajectory(**fields)
