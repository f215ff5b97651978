"""Worker groups of PPO: the policy whose workers may hold the critic (`PPOActor`, defined here beside its
group), and the critic's two placements.

split: `SplitCritic`, data-parallel `Critic` workers of their own (Ray actors with critic.cpus_per_worker
CPUs and, with GPUs, one GPU each; one in-process worker with cluster.backend=local).
colocated: `ColocatedCritic`, the critic held in every policy worker (`PPOActor`), on its device.
Both have the same methods: values, train, save_checkpoint, load_checkpoint, state_dict, shutdown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from posttrain.config.common import PolicyConfig
from posttrain.data.batching import TokenBatch
from posttrain.distributed.actor import ActorPolicy
from posttrain.distributed.actor_group import ActorGroup
from posttrain.distributed.policy_group import PolicyGroup
from posttrain.models.critic import Critic
from posttrain.models.policy import LossFn, TrainResult


class PPOActor(ActorPolicy):
    """An `ActorPolicy` that also holds the critic on its own device (critic.placement: colocated);
    the `critic_*` methods are the critic's, called on every rank by `ColocatedCritic`."""

    def __init__(self, cfg: PolicyConfig, *, critic: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.critic: Critic | None = None
        if critic is not None:
            gpus = 1 if self.device.type == "cuda" else 0
            self.critic = Critic(**critic, rank=self.rank, world_size=self.world_size, gpus=gpus)

    def _held_critic(self) -> Critic:
        if self.critic is None:
            raise RuntimeError("this policy worker holds no critic (critic.placement=split)")
        return self.critic

    def critic_values(self, batch: TokenBatch) -> torch.Tensor:
        return self._held_critic().values(batch)

    def critic_train(self, batch: TokenBatch, loss_fn: Any, normalizer: float) -> TrainResult:
        return self._held_critic().train(batch, loss_fn, normalizer)

    def critic_save_checkpoint(self, directory: str) -> None:
        self._held_critic().save_checkpoint(directory)

    def critic_load_checkpoint(self, directory: str) -> None:
        self._held_critic().load_checkpoint(directory)

    def critic_state_dict_cpu(self) -> dict[str, torch.Tensor]:
        return self._held_critic().state_dict_cpu()


class PPOActorGroup(ActorGroup):
    """Data-parallel `PPOActor` ranks (built with `critic=...` to hold a colocated critic)."""

    worker_cls = PPOActor


class SplitCritic(PolicyGroup):
    """Data-parallel `Critic` workers of their own; the batch is split over them like the policy's."""

    worker_cls = Critic
    worker_name = "critic"

    def values(self, batch: TokenBatch) -> torch.Tensor:
        """[B, T] V(s_t), the batch split over the critic's ranks."""
        return self.run_chunked(Critic.values, batch)


def merge_results(results: list[TrainResult]) -> TrainResult:
    """One optimizer step over ranks: loss metrics summed (each rank's share of global means)."""
    merged = TrainResult(grad_norm=results[0].grad_norm, lr=results[0].lr)
    for r in results:
        merged.num_tokens += r.num_tokens
        for key, value in r.loss_metrics.items():
            merged.loss_metrics[key] = merged.loss_metrics.get(key, 0.0) + value
    return merged


class ColocatedCritic:
    """The critic held in the policy's workers (`PPOActor.critic`): the same ranks, the same device."""

    def __init__(self, policy: PPOActorGroup) -> None:
        self.policy = policy
        self.workers = policy.workers

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def values(self, batch: TokenBatch) -> torch.Tensor:
        return self.policy.run_chunked(PPOActor.critic_values, batch)

    def train(self, batch: TokenBatch, loss_fn: LossFn, normalizer: float) -> TrainResult:
        shards = batch.shards(self.world_size)
        return merge_results(
            self.workers.run(PPOActor.critic_train, [(shard, loss_fn, normalizer) for shard in shards])
        )

    def save_checkpoint(self, directory: Path) -> None:
        self.workers.run(PPOActor.critic_save_checkpoint, [(str(directory),)] * self.world_size)

    def load_checkpoint(self, directory: Path) -> None:
        self.workers.run(PPOActor.critic_load_checkpoint, [(str(directory),)] * self.world_size)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.workers.run(PPOActor.critic_state_dict_cpu)[0]

    def shutdown(self) -> None:
        """The policy's workers hold the critic: they go with the policy."""


def split_critic_cluster(cluster: Any, *, num_workers: int, cpus_per_worker: int) -> Any:
    """The cluster config of split critic workers: their own count and CPUs."""
    return cluster.model_copy(update={"num_workers": num_workers, "cpus_per_worker": cpus_per_worker})
