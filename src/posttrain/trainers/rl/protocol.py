"""The RL runtime's contract with an algorithm (GRPO, PPO, on-policy distillation, REINFORCE-MA).

The runtime (`posttrain.trainers.rl.runtime.RLRuntime`) owns everything the algorithms share:
the policy's (and generator's, environment's, teacher's) worker groups, rollouts, refits and
their parity gate, validation, checkpoints and the fit loop. An algorithm owns its batch and its
update, and says what the runtime must build for it. Algorithms are siblings: each implements
`RLAlgorithm` on its own, none derives from another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from posttrain.config.rl import RLLoopConfig
from posttrain.rollout.rollout import Rollouts


@dataclass(frozen=True)
class PolicyWorkers:
    """How the runtime builds the policy's worker group for an algorithm."""

    group: type
    """The worker group class (`ActorGroup`; PPO's may hold a colocated critic; distillation's
    `StudentGroup` trains on the teacher's top-k)."""
    optimizer_steps: int
    """The policy's optimizer steps over the run: the length of its learning-rate schedule."""
    reference: bool
    """Whether the workers load π_ref (a KL penalty)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra constructor arguments of the workers (PPO, colocated: the critic's)."""


class RLAlgorithm(Protocol):
    """One RL algorithm as the runtime drives it. Per step the runtime calls `collect` (unless
    asynchronous rollouts supply the batch), `make_batch`, then `train_on`; `train_on` ends with
    `runtime.policy_updated()` when it changed the policy's weights.

    The members below `train_on` are optional: an algorithm that declares `RLAlgorithm` as its base
    (the protocol, never another algorithm) and leaves one out gets the default written here."""

    name: str
    """The name in the run's log lines."""
    run_kind: str
    """The run directory's default name, runs/<run_kind>."""
    plots: list[str]
    """The metrics plotted into <run_dir>/plots at the end."""
    loop: RLLoopConfig
    """The config's loop section (grpo, ppo, distill, ...)."""

    def policy_workers(self, model_path: str) -> PolicyWorkers:
        """What the policy's worker group needs (`model_path`: the resolved policy model)."""
        ...

    def collect(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """The rollouts of one synchronous step and their statistics (`RLRuntime.draw`)."""
        ...

    def make_batch(self, rollouts: Rollouts) -> tuple[Any, dict[str, float]]:
        """The training batch of the rollouts (logprobs, advantages, masks) and its metrics."""
        ...

    def train_on(self, batch: Any) -> dict[str, float]:
        """The updates on one batch; metrics."""
        ...

    async_mode: bool = False
    """Whether generation runs ahead of training (GRPO's `grpo.async_mode`); default no."""

    def describe(self) -> str:
        """More of the run's first log line ("" or a sentence ending in "; "); default ""."""
        return ""

    def save_state(self, directory: Path) -> None:
        """Write the algorithm's own state (a critic, replay) into a checkpoint folder; default none."""

    def load_state(self, directory: Path, step: int) -> None:
        """Read what `save_state` wrote; `step` is the checkpoint's."""

    def close(self) -> None:
        """Release the algorithm's own workers (the runtime releases its own after); default none."""
