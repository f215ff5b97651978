"""Sampling workers: `Sampling`, the `generate` of every worker that samples (a vLLM engine or an HF
model), and `GenerationWorker`, the generation-only worker of split placement: a separate copy of the
model that only samples, refitted from the policy's packed weights after each update. The policy's
own worker (`posttrain.distributed.actor.ActorPolicy`) samples through the same `Sampling`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from posttrain.config.common import PolicyConfig
from posttrain.config.rollout import GenerationConfig
from posttrain.generation.sampler import WeightUpdates
from posttrain.generation.sampling import GenerationOutput, SamplingParams, hf_generate
from posttrain.modeling.loading import DTYPES, MASTER_DTYPE, load_causal_lm, pick_device, set_torch_threads
from posttrain.modeling.tokenizer import load_tokenizer
from posttrain.weights.refit import (
    BucketLayout,
    PackedBucket,
    RefitGroup,
    SharedWeightsHandle,
    SnapshotReader,
    load_named,
    load_packed,
    receive_buckets,
    unpack,
    weights_checksum,
)


class Sampling:
    """`generate` for workers that hold a vLLM engine (`self.engine`) or an HF model (`self.model`)."""

    engine: Any
    model: torch.nn.Module
    tokenizer: Any

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, batch_size: int
    ) -> GenerationOutput:
        if self.engine is not None:
            return self.engine.generate(prompt_ids, params) if prompt_ids else GenerationOutput()
        updates = self.weight_updates() if params.partial_rollouts else None
        with self.generation_autocast():
            return hf_generate(
                self.sampler_model(),
                self.tokenizer,
                prompt_ids,
                params,
                batch_size=batch_size,
                updates=updates,
            )

    def sampler_model(self) -> torch.nn.Module:
        """The HF model that samples (called under `generation_autocast`)."""
        return self.model

    def weight_updates(self) -> WeightUpdates:
        """Partial rollouts: how this worker loads newer weights between decode steps."""
        raise ValueError(
            "partial rollouts (grpo.partial_rollouts) need a generation worker of the HF backend that "
            "loads the policy's shared-memory snapshots"
        )

    def run_with_model(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(sampler, tokenizer, *args)` where the sampler lives: code that needs it itself (multi-turn
        episodes without a turn barrier). The sampler is this worker's vLLM engine, or else its HF model
        (called under the generation compute context)."""
        if self.engine is not None:
            return fn(self.engine, self.tokenizer, *args)
        with self.generation_autocast():
            return fn(self.sampler_model(), self.tokenizer, *args)

    def generation_autocast(self) -> contextlib.AbstractContextManager:
        """The compute context of HF generation (a generation worker's model is already in its dtype)."""
        return contextlib.nullcontext()


class GenerationWorker(Sampling):
    """Split placement: a separate copy of the model (HF or a vLLM engine) that only samples,
    refitted from the policy's packed weights after each update."""

    def __init__(
        self,
        cfg: PolicyConfig,
        *,
        model_path: str,
        tokenizer_path: str,
        generation: GenerationConfig | None = None,
        gpus: int = 0,
        num_threads: int | None = None,
        rank: int = 0,
    ) -> None:
        set_torch_threads(num_threads)
        self.cfg = cfg
        self.device = pick_device(gpus)
        self.engine = None
        self.shared: SnapshotReader | None = None  # the policy's shared weights, mapped
        self.weights_version: int | None = None  # the snapshot version loaded (shared snapshots only)
        self.refit_group: RefitGroup | None = None
        self.refit_layout: list[BucketLayout] = []
        if generation is not None and generation.backend == "vllm":
            self.engine = build_vllm_engine(
                generation, cfg, model_path, tokenizer_path, self.device, rank=rank
            )
        else:
            dtype = cfg.dtype if generation is None else engine_dtype(generation, cfg)
            self.model = load_causal_lm(model_path, DTYPES[dtype]).to(self.device).eval()
        self.tokenizer = load_tokenizer(tokenizer_path)  # observations' tokens (episodes without a barrier)

    def load_weights(self, buckets: list) -> int:
        """Load packed buckets (or Ray refs to them) into this worker's model or engine."""
        if buckets and not isinstance(buckets[0], PackedBucket):
            import ray

            buckets = [b.to_packed() for b in ray.get(buckets)]
        if self.engine is not None:
            return self.engine.load_weights(unpack(buckets))
        return load_packed(self.model, buckets)

    def join_refit_group(
        self, address: str, port: int, rank: int, world_size: int, layout: list[BucketLayout]
    ) -> None:
        """Join the policy's refit group as `rank` (> 0) and keep the bucket layout for every refit."""
        self.refit_layout = layout
        self.refit_group = RefitGroup.connect(address, port, rank, world_size, self.device)

    def receive_weights(self) -> int:
        """Collective refit: receive each bucket that policy rank 0 broadcasts and load it at once."""
        if self.refit_group is None:
            raise RuntimeError("receive_weights before join_refit_group")
        return sum(self.load_weights([b]) for b in receive_buckets(self.refit_group, self.refit_layout))

    def close_refit_group(self) -> None:
        if self.refit_group is not None:
            self.refit_group.close()
            self.refit_group = None

    def load_shared(self, handle: SharedWeightsHandle) -> int:
        """Load the policy's current weights from its shared-memory buffers (mapped on first use)."""
        if self.shared is None:
            self.shared = SnapshotReader(handle)
        with self.shared.reading():
            self.weights_version = self.shared.published_version()
            if self.engine is not None:
                return self.engine.load_weights(self.shared.views)
            load_named(self.model, self.shared.views)
        return len(self.shared.views)

    def poll_snapshot(self) -> int | None:
        """Partial rollouts: load the shared snapshot if it holds a newer version than this worker's
        weights; that version, or None (unchanged)."""
        with self.shared.reading():
            version = self.shared.published_version()
            if version is None or version <= self.weights_version:
                return None
            load_named(self.model, self.shared.views)
        self.weights_version = version
        return version

    def weight_updates(self) -> WeightUpdates:
        if self.engine is not None or self.shared is None or self.weights_version is None:
            return super().weight_updates()  # raises: no snapshot with a version to poll
        return WeightUpdates(self.poll_snapshot, self.weights_version)

    def parameters_checksum(self) -> tuple[float, float]:
        if self.engine is not None:
            return self.engine.checksum()
        return weights_checksum(self.model.parameters())

    def state_dict_cpu(self) -> dict[str, torch.Tensor]:
        """HF backend: a copy of the weights this worker samples with (for tests and debugging)."""
        if self.engine is not None:
            raise NotImplementedError("the vLLM backend's weights are compared by parameters_checksum")
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}


def engine_dtype(generation: GenerationConfig, policy: PolicyConfig) -> str:
    """The dtype the generator's weights have: the policy's compute dtype, unless the backend's
    `dtype` (generation.vllm.dtype, generation.hf.dtype) sets another."""
    return generation.sampling_dtype(policy.dtype)


def refit_cast_dtype(generation: GenerationConfig, policy: PolicyConfig) -> str | None:
    """The engine's dtype when it differs from the policy's parameters, which are fp32 master weights
    whatever `policy.dtype` is (refits cast the weights to it, the checksum check compares the policy's
    weights cast to it), else None."""
    dtype = engine_dtype(generation, policy)
    return dtype if DTYPES[dtype] != MASTER_DTYPE else None


def build_vllm_engine(
    generation: GenerationConfig,
    policy: PolicyConfig,
    model_path: str,
    tokenizer_path: str,
    device: torch.device,
    *,
    rank: int,
):
    from posttrain.generation.vllm_engine import VLLMGenerator

    return VLLMGenerator(
        generation.vllm,
        model_path=model_path,
        tokenizer_path=tokenizer_path,
        dtype=engine_dtype(generation, policy),
        max_model_len=policy.max_seq_len,
        seed=policy.seed + rank,
        device=device,
        rank=rank,
        lora=policy.lora,
    )
