"""Worker groups for RL: the policy that also generates (colocated), and separate generation workers (split)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from posttrain.config.common import ClusterConfig, PolicyConfig
from posttrain.config.rollout import GenerationConfig, RefitTransport
from posttrain.data.batching import TokenBatch
from posttrain.distributed.actor import ActorPolicy
from posttrain.distributed.policy_group import PolicyGroup
from posttrain.distributed.workers import Workers, make_workers, run_concurrently
from posttrain.generation.sampling import GenerationOutput, SamplingParams
from posttrain.generation.worker import GenerationWorker, refit_cast_dtype
from posttrain.weights.refit import SharedWeightsHandle


def _split(items: list, n: int, *, every_rank: bool = False) -> list[list]:
    """At most n contiguous non-empty pieces whose sizes differ by at most one; `every_rank`: exactly n
    pieces, the last ones empty when there are fewer items than pieces."""
    pieces = max(1, min(n, len(items)))
    bounds = [round(i * len(items) / pieces) for i in range(pieces + 1)]
    out = [items[bounds[i] : bounds[i + 1]] for i in range(pieces)]
    if every_rank:
        out = [piece for piece in out if piece]
        out += [[] for _ in range(n - len(out))]
    return out


def generate_on(
    workers: Workers,
    method,
    prompt_ids: list[list[int]],
    params: SamplingParams,
    batch_size: int,
    *,
    every_rank: bool = False,
) -> GenerationOutput:
    """Spread prompts over the workers and concatenate the outputs in order. Worker i samples with
    `params.seed` and `seed_stream` i, so every random stream of the call has a seed of its own
    (`posttrain.generation.sampling.sampling_seed`). `every_rank`: call every worker, those without
    prompts too (FSDP2: every forward is a collective that all ranks must join)."""
    pieces = _split(prompt_ids, len(workers), every_rank=every_rank)
    args = [(piece, dataclasses.replace(params, seed_stream=i), batch_size) for i, piece in enumerate(pieces)]
    out = GenerationOutput()
    for part in workers.run(method, args):
        out.extend(part)
    return out


class ActorGroup(PolicyGroup):
    """Data-parallel `ActorPolicy` ranks: train, score, and (colocated) generate."""

    worker_cls = ActorPolicy

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, batch_size: int
    ) -> GenerationOutput:
        return generate_on(
            self.workers, ActorPolicy.generate, prompt_ids, params, batch_size, every_rank=self.collective
        )

    def num_samplers(self) -> int:
        return len(self.workers)

    def run_on_samplers(self, fn: Callable[..., Any], args: Sequence[tuple]) -> list[Any]:
        """`SamplerHost`: `fn(sampler, tokenizer, *args[k])` on rank k (`Sampling.run_with_model`)."""
        return self.workers.run(ActorPolicy.run_with_model, [(fn, *a) for a in args])

    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        return self.run_chunked(ActorPolicy.reference_logprobs, batch)

    def packed_weights(self, cast: torch.dtype | None = None) -> list:
        return self.workers.run(ActorPolicy.packed_weights, cast=cast)[0]  # every rank: FSDP2 gathers

    def shared_weights_handle(self) -> SharedWeightsHandle | None:
        return self.workers.run(ActorPolicy.shared_weights_handle)[0]

    def unlink_shared_weights(self) -> None:
        self.workers.run(ActorPolicy.unlink_shared_weights)

    def publish_weights(self, version: int = -1) -> SharedWeightsHandle | None:
        """Copy the weights into rank 0's shared-memory snapshot as policy `version` (asynchronous
        GRPO); its handle."""
        return self.workers.run(ActorPolicy.publish_weights, [(version,)] * len(self.workers))[0]

    def unlink_snapshot(self) -> None:
        self.workers.run(ActorPolicy.unlink_snapshot)

    def refit_engine(self) -> int:
        """Colocated vLLM: every rank copies its trained weights into its own engine."""
        return self.workers.run(ActorPolicy.refit_engine)[0]

    def generator_checksums(self) -> list[tuple[float, float] | None]:
        """Checksums of the weights the colocated engines run (None per rank without an engine)."""
        return self.workers.run(ActorPolicy.engine_checksum)

    def sleep_generator(self) -> None:
        self.workers.run(ActorPolicy.sleep_engine)


class GenerationGroup:
    """Split placement: generation workers on their own resources, refitted from the policy after each update."""

    def __init__(
        self,
        cfg: GenerationConfig,
        policy_cfg: PolicyConfig,
        cluster: ClusterConfig,
        *,
        model_path: str,
        tokenizer_path: str,
        transport: RefitTransport = "object_store",
    ) -> None:
        self.transport = transport
        self.refit_source: ActorGroup | None = None  # collective: the policy whose rank 0 sends
        self.wire_dtype = self.wire_dtype_of(cfg, policy_cfg)
        gpus = 1 if cluster.gpus_per_node > 0 else 0
        kwargs = [
            dict(
                cfg=policy_cfg,
                model_path=model_path,
                tokenizer_path=tokenizer_path,
                generation=cfg,
                gpus=gpus,
                num_threads=cfg.cpus_per_worker,
                rank=rank,
            )
            for rank in range(cfg.num_workers)
        ]
        gen_cluster = cluster.model_copy(update={"cpus_per_worker": cfg.cpus_per_worker})
        self.workers = make_workers(GenerationWorker, kwargs, gen_cluster, name="generation")

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, batch_size: int
    ) -> GenerationOutput:
        return generate_on(self.workers, GenerationWorker.generate, prompt_ids, params, batch_size)

    def num_samplers(self) -> int:
        return len(self.workers)

    def run_on_samplers(self, fn: Callable[..., Any], args: Sequence[tuple]) -> list[Any]:
        """`SamplerHost`: `fn(sampler, tokenizer, *args[k])` on generation worker k."""
        return self.workers.run(GenerationWorker.run_with_model, [(fn, *a) for a in args])

    @staticmethod
    def wire_dtype_of(cfg: GenerationConfig, policy_cfg: PolicyConfig) -> torch.dtype | None:
        """The dtype packed weights travel in when the engine's differs from the policy's (a bf16
        engine under an fp32 policy: half the bytes); None: the policy's own."""
        dtype = refit_cast_dtype(cfg, policy_cfg)
        return None if dtype is None else getattr(torch, dtype)

    def refit(self, policy: ActorGroup) -> int:
        """Give every generation worker the policy's weights; returns tensors loaded per worker.

        shared_memory: the workers read the policy's shared-memory buffers (one machine, one copy);
        object_store: policy rank 0 packs its weights into buckets that travel through the Ray object
        store; collective: policy rank 0 broadcasts the buckets over a process group it shares with
        the workers (NCCL on GPU, gloo on CPU), built at the first refit and reused."""
        if self.transport == "collective":
            return self._broadcast_from(policy)
        if self.transport == "shared_memory":
            handle = policy.shared_weights_handle()
            if handle is None:
                raise RuntimeError(
                    "refit_transport=shared_memory, but the policy was built without shared_weights"
                )
            count = self.workers.run(GenerationWorker.load_shared, [(handle,)] * len(self.workers))[0]
            policy.unlink_shared_weights()  # all workers have mapped the buffers
            return count
        buckets = policy.packed_weights(self.wire_dtype)
        return self.workers.run(GenerationWorker.load_weights, [(buckets,)] * len(self.workers))[0]

    def load_snapshot(self, snapshot: SharedWeightsHandle | list) -> int:
        """Asynchronous GRPO: load a weight snapshot the policy published (a shared-memory snapshot's
        handle, or packed buckets) into every worker; tensors loaded per worker."""
        n = len(self.workers)
        if isinstance(snapshot, SharedWeightsHandle):
            return self.workers.run(GenerationWorker.load_shared, [(snapshot,)] * n)[0]
        return self.workers.run(GenerationWorker.load_weights, [(snapshot,)] * n)[0]

    def _broadcast_from(self, policy: ActorGroup) -> int:
        n = len(self.workers)
        if self.refit_source is None:
            [(address, port, layout)] = policy.workers.run(
                ActorPolicy.host_refit_group, [(n + 1, self.wire_dtype)]
            )
            # every member blocks in the group's constructor until all have joined: start them together
            run_concurrently(
                (policy.workers, ActorPolicy.join_refit_group, [(n + 1,)]),
                (
                    self.workers,
                    GenerationWorker.join_refit_group,
                    [(address, port, rank + 1, n + 1, layout) for rank in range(n)],
                ),
            )
            self.refit_source = policy
        # every policy rank joins (FSDP gathers each bucket); rank 0 sends
        _, received = run_concurrently(
            (policy.workers, ActorPolicy.broadcast_weights, [(self.wire_dtype,)] * len(policy.workers)),
            (self.workers, GenerationWorker.receive_weights, None),
        )
        return received[0]

    def generator_checksums(self) -> list[tuple[float, float]]:
        return self.workers.run(GenerationWorker.parameters_checksum)

    def shutdown(self) -> None:
        if self.refit_source is not None:  # close the refit group on all its members together
            with contextlib.suppress(Exception):  # a member stuck in a failed refit: killed below
                run_concurrently(
                    (self.refit_source.workers, ActorPolicy.close_refit_group, [()]),
                    (self.workers, GenerationWorker.close_refit_group, None),
                    timeout_s=30,
                )
            self.refit_source = None
        self.workers.shutdown()
