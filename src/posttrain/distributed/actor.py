"""The role that both trains and samples, beside its worker group (`actor_group.ActorGroup`).

RL additions to the training policy: generation with the training weights (colocated), a frozen
reference model for the KL penalty, and packed weights for refit. The generation-only worker of split
placement is `posttrain.generation.worker.GenerationWorker`."""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from posttrain.config.common import PolicyConfig
from posttrain.config.rollout import GenerationConfig
from posttrain.data.batching import TokenBatch
from posttrain.generation.worker import Sampling, build_vllm_engine
from posttrain.modeling.loading import DTYPES, MASTER_DTYPE, compute_autocast, load_causal_lm
from posttrain.modeling.tokenizer import load_tokenizer
from posttrain.models.logprobs import batched_logprobs
from posttrain.models.policy import Policy, full_tensor
from posttrain.weights.refit import (
    BucketLayout,
    NumpyBucket,
    RefitGroup,
    SharedFlatWeights,
    SharedSnapshot,
    SharedWeightsHandle,
    host_refit_store,
    load_named,
    pack_state_dict,
    plan_buckets,
    send_buckets,
    weights_checksum,
)


def _in_ray_worker() -> bool:
    try:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    except ImportError:
        return False


class ActorPolicy(Sampling, Policy):
    """A `Policy` that can also sample (with its own weights, or with a vLLM engine in the same
    process that it refits in place) and score with a frozen reference."""

    def __init__(
        self,
        cfg: PolicyConfig,
        *,
        tokenizer_path: str,
        reference: bool = False,
        generation: GenerationConfig | None = None,
        shared_weights: bool = False,
        lora_adapter_refit: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(cfg, **kwargs)
        # generators serve the adapter (generation.vllm.lora_adapter): refits send A and B only
        self.adapter_refit = bool(self.lora) and lora_adapter_refit
        if shared_weights and self.lora:
            raise ValueError("shared-memory refits cannot serve a LoRA policy (its weights are not merged)")
        self.shared = SharedFlatWeights(self.model) if shared_weights and self.rank == 0 else None
        if self.shared is not None:
            atexit.register(self.shared.close)
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.reference = None
        self.has_reference = reference
        # the frozen reference computes like the policy, so that KL(π || π_ref) is 0 before the first
        # update: under FSDP2 the policy computes in pure bf16 (parameters cast), so the reference holds
        # bf16 weights; otherwise the policy is fp32 under autocast, and so is the reference. With LoRA
        # the reference is the policy's own model with its adapters off (no second copy)
        self.reference_dtype = DTYPES[cfg.dtype] if cfg.fsdp and self.world_size > 1 else MASTER_DTYPE
        if reference and not self.lora:
            self.reference = load_causal_lm(kwargs["model_path"], self.reference_dtype).to(self.device).eval()
            self.reference.requires_grad_(False)
        self.engine = None
        if generation is not None and generation.backend == "vllm":
            self.engine = build_vllm_engine(
                generation, cfg, kwargs["model_path"], tokenizer_path, self.device, rank=self.rank
            )
        # generation.hf.dtype other than the policy's: the HF sampler decodes from a copy of the weights
        # in that dtype, refitted after every update (`refit_engine`); training keeps its fp32 weights
        self.sampler_copy: torch.nn.Module | None = None
        if generation is not None and generation.backend == "hf":
            dtype = generation.sampling_dtype(cfg.dtype)
            if dtype != cfg.dtype:
                copy = load_causal_lm(kwargs["model_path"], DTYPES[dtype]).to(self.device).eval()
                self.sampler_copy = copy.requires_grad_(False)
                self.refit_sampler_copy()
        self.refit_group: RefitGroup | None = None
        self.snapshot: SharedSnapshot | None = None
        self._refit_store: Any = None
        self._refit_layouts: dict[torch.dtype | None, list[BucketLayout]] = {}

    # ------------------------------------------------------------------ adapter refits (vllm.lora_adapter)
    def generator_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What refits send: serving the adapter, its A and B tensors (peft names); else the weights."""
        if self.adapter_refit:
            from posttrain.models.lora import adapter_weights

            return adapter_weights(self.model, full_tensor)
        return super().generator_weights()

    def generator_weight_specs(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        if self.adapter_refit:
            from posttrain.models.lora import adapter_specs

            return adapter_specs(self.model)
        return super().generator_weight_specs()

    def parameters_checksum(self, dtype: str | None = None) -> tuple[float, float]:
        """Serving the adapter: the fingerprint of A and s·B that the engine's checksum computes."""
        if self.adapter_refit:
            from posttrain.models.lora import adapter_fingerprint

            return adapter_fingerprint(self.model, DTYPES[dtype] if dtype else None, full_tensor)
        return super().parameters_checksum(dtype)

    def generation_autocast(self) -> contextlib.AbstractContextManager:
        """Colocated HF generation computes like training: autocast to `policy.dtype` over the fp32
        weights (FSDP2: its mixed-precision policy); a sampler copy computes in its own dtype."""
        return self.autocast() if self.sampler_copy is None else contextlib.nullcontext()

    def sampler_model(self) -> torch.nn.Module:
        """The trained model, or its copy in generation.hf.dtype."""
        return self.model if self.sampler_copy is None else self.sampler_copy

    def refit_sampler_copy(self) -> int:
        """Cast the trained weights into the sampler copy (LoRA: merged; FSDP2: gathered, every rank
        in step); returns the number of tensors."""
        return load_named(self.sampler_copy, self.generator_weights())

    def shared_weights_handle(self) -> SharedWeightsHandle | None:
        """Split placement on one machine: where generation workers map this rank's weights."""
        return None if self.shared is None else self.shared.handle

    def unlink_shared_weights(self) -> None:
        """Once every reader has mapped the buffers, remove their names (the mappings stay valid)."""
        if self.shared is not None:
            self.shared.close()

    def publish_weights(self, version: int = -1) -> SharedWeightsHandle | None:
        """Asynchronous GRPO, shared_memory transport: copy the current weights into this rank's shared
        snapshot (made on first use) and return its handle (rank 0; other ranks None). Generation
        workers load the snapshot, never the weights that training updates in place."""
        if self.rank != 0:
            return None
        if self.snapshot is None:
            self.snapshot = SharedSnapshot(self.model)
            atexit.register(self.snapshot.close)
        self.snapshot.write(self.model, version)
        return self.snapshot.handle

    def unlink_snapshot(self) -> None:
        """Once every reader has mapped the snapshot, remove its files' names."""
        if self.snapshot is not None:
            self.snapshot.close()

    def refit_engine(self) -> int:
        """Colocated vLLM: copy the trained weights into the engine (no disk, no other process); the HF
        sampler's copy (generation.hf.dtype): cast them into it."""
        if self.sampler_copy is not None:
            return self.refit_sampler_copy()
        if self.engine is None:
            return 0
        # FSDP2 shards are DTensors: gather each full tensor (every rank runs this in step); LoRA: merged
        return self.engine.load_weights(self.generator_weights())

    # ------------------------------------------------------------------ collective refit (split placement)
    def refit_layout(self, cast: torch.dtype | None = None) -> list[BucketLayout]:
        """The buckets the weights travel in: every parameter's (name, full shape, dtype), grouped by
        dtype (floating point cast to `cast` if given). The same on every rank and at every refit, so
        computed once."""
        if cast not in self._refit_layouts:
            self._refit_layouts[cast] = plan_buckets(self.generator_weight_specs(), cast=cast)
        return self._refit_layouts[cast]

    def host_refit_group(
        self, world_size: int, cast: torch.dtype | None = None
    ) -> tuple[str, int, list[BucketLayout]]:
        """Rank 0: start the refit group's rendezvous; returns (address, port, bucket layout) for the
        generation workers, which keep the layout for every later refit."""
        self._refit_store, address, port = host_refit_store(world_size)
        return address, port, self.refit_layout(cast)

    def join_refit_group(self, world_size: int) -> None:
        """Rank 0: become rank 0 of the refit group (returns once every generation worker has joined)."""
        self.refit_group = RefitGroup(self._refit_store, 0, world_size, self.device)

    def broadcast_weights(self, cast: torch.dtype | None = None) -> int:
        """Collective refit; every rank runs it (under FSDP each bucket's full tensors are gathered, a
        collective of the training group), rank 0 broadcasts the buckets, floating point cast to `cast`
        (the one given to `host_refit_group`). Returns the bytes sent."""
        if self.rank == 0 and self.refit_group is None:
            raise RuntimeError("broadcast_weights before join_refit_group")
        weights = self.generator_weights()  # lazy: each tensor gathered (and merged) when a bucket asks
        pending: dict[str, torch.Tensor] = {}

        def tensors_of(layout: BucketLayout) -> dict[str, torch.Tensor]:
            wanted = [name for name, _, _ in layout.entries]
            while any(name not in pending for name in wanted):
                name, tensor = next(weights)
                pending[name] = tensor
            return {name: pending.pop(name) for name in wanted}

        with torch.no_grad():
            return send_buckets(self.refit_group, self.refit_layout(cast), tensors_of)

    def close_refit_group(self) -> None:
        if self.refit_group is not None:
            self.refit_group.close()
        self.refit_group = self._refit_store = None

    def engine_checksum(self) -> tuple[float, float] | None:
        if self.sampler_copy is not None:
            return weights_checksum(self.sampler_copy.parameters())
        return None if self.engine is None else self.engine.checksum()

    def sleep_engine(self) -> None:
        if self.engine is not None:
            self.engine.sleep()

    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        if not self.has_reference:
            raise RuntimeError("this policy was built without a reference model (loss.kl_beta is 0)")
        if self.lora:  # the base model: the policy's own module with the adapters off
            from posttrain.models.lora import adapters_disabled

            with adapters_disabled(self.model):
                return self.logprobs(batch)
        fp32_weights = self.reference_dtype == MASTER_DTYPE  # else bf16 weights, computed as they are
        with compute_autocast(self.device, self.compute_dtype if fp32_weights else MASTER_DTYPE):
            return batched_logprobs(
                self.reference,
                batch,
                "loss_mask",
                batch_size=self.cfg.logprob_batch_size,
                chunk_size=self.cfg.logprob_chunk_size,
                temperature=self.cfg.logprob_temperature,
                packed=self.cfg.packed_sequences,
            )

    def packed_weights(self, cast: torch.dtype | None = None) -> list:
        """The parameters (tied ones once, like the collective transport) packed into buckets on rank 0
        (other ranks: []), floating point cast to `cast` if given; inside Ray, put in the object store
        (refs, not copies). Called on every rank: under FSDP2 the full tensors are gathered."""
        if self.lora:  # merged tensors, gathered one by one under FSDP2 (every rank iterates, rank 0 keeps)
            state = {}
            for name, tensor in self.generator_weights():
                if self.rank == 0:
                    state[name] = tensor.cpu()
        else:
            # under FSDP2 a collective on every rank; the full tensors land on rank 0 only
            full = self.state_dict_cpu() if self.sharded else None
            if self.rank != 0:
                return []
            params = self.model.named_parameters()
            state = (
                {n: full[n] for n, _ in params} if full is not None else {n: p.detach() for n, p in params}
            )
        if self.rank != 0:
            return []
        buckets = pack_state_dict(state, cast=cast)
        if _in_ray_worker():
            import ray

            return [ray.put(NumpyBucket.of(bucket)) for bucket in buckets]
        return buckets
