"""The data-parallel group of `Policy` workers, driven by the controller with explicit methods."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from posttrain.algorithms.metrics import accumulate_metrics
from posttrain.config.common import ClusterConfig, PolicyConfig
from posttrain.data.batching import TokenBatch
from posttrain.distributed.workers import make_workers
from posttrain.models.policy import LossFn, Policy, TrainResult


class PolicyGroup:
    """N data-parallel `Policy` ranks. Every batch is split into N equal contiguous shards."""

    worker_cls: type[Policy] = Policy
    worker_name = "policy"

    def __init__(
        self,
        cfg: PolicyConfig,
        cluster: ClusterConfig,
        *,
        model_path: str,
        total_steps: int,
        **worker_kwargs: Any,
    ) -> None:
        n = cluster.policy_workers()
        gpus = 1 if cluster.gpus_per_node > 0 else 0
        threads = cluster.worker_cpus() if cluster.backend == "ray" else None
        kwargs = [
            dict(
                cfg=cfg,
                model_path=model_path,
                total_steps=total_steps,
                rank=r,
                world_size=n,
                gpus=gpus,
                num_threads=threads,
                **worker_kwargs,
            )
            for r in range(n)
        ]
        self.workers = make_workers(self.worker_cls, kwargs, cluster, name=self.worker_name)
        # FSDP2: every forward pass is a collective of all ranks, so every call must reach every rank
        self.collective = cfg.fsdp and n > 1
        if n > 1:
            [(address, port)] = self.workers.run(Policy.rendezvous_address, [()])
            self.workers.run(Policy.init_distributed, [(address, port)] * n)

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def train(self, batch: TokenBatch, loss_fn: LossFn, normalizer: float) -> TrainResult:
        """One optimizer step on the global batch; loss metrics are summed over ranks."""
        results: list[TrainResult] = self.workers.run(
            Policy.train, [(shard, loss_fn, normalizer) for shard in batch.shards(self.world_size)]
        )
        merged = TrainResult(grad_norm=results[0].grad_norm, lr=results[0].lr)
        for r in results:
            merged.num_tokens += r.num_tokens
            accumulate_metrics(merged.loss_metrics, r.loss_metrics)
        return merged

    def logprobs(self, batch: TokenBatch, target_mask: str = "loss_mask") -> torch.Tensor:
        """[B, T] log-probabilities, the batch split over ranks."""
        return self.run_chunked(Policy.logprobs, batch, target_mask)

    def run_chunked(self, method: Callable, batch: TokenBatch, *args: Any) -> torch.Tensor:
        """Split the batch over ranks, run `method(chunk, *args)` -> [b, t] on each, reassemble [B, T].

        Under FSDP2 (`collective`) every rank is called, with an empty chunk when the batch has fewer
        rows than there are ranks (the method still joins every forward, see `batched_logprobs`)."""
        chunks = batch.chunks(self.world_size)
        if self.collective:
            chunks += [batch.select(len(batch), len(batch)) for _ in range(self.world_size - len(chunks))]
        parts = self.workers.run(method, [(chunk, *args) for chunk in chunks])
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        start = 0
        for chunk, part in zip(chunks, parts, strict=True):
            out[start : start + len(chunk), : part.shape[1]] = part
            start += len(chunk)
        return out

    def save_checkpoint(self, directory: Path) -> None:
        self.workers.run(Policy.save_checkpoint, [(str(directory),)] * self.world_size)

    def load_checkpoint(self, directory: Path) -> None:
        self.workers.run(Policy.load_checkpoint, [(str(directory),)] * self.world_size)

    def parameters_checksum(self, dtype: str | None = None) -> list[tuple[float, float]]:
        return self.workers.run(Policy.parameters_checksum, dtype=dtype)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.workers.run(Policy.state_dict_cpu)[0]

    def shutdown(self) -> None:
        self.workers.shutdown()
