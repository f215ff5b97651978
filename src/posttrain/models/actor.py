"""RL additions to the training policy: generation with the training weights (colocated), a frozen
reference model for the KL penalty, and packed weights for refit; plus the generation-only worker
used by split placement."""

from __future__ import annotations

from typing import Any

import torch

from posttrain.config.schema import PolicyConfig
from posttrain.data.batching import TokenBatch
from posttrain.models.generation import GenerationOutput, SamplingParams, hf_generate
from posttrain.models.logprobs import batched_logprobs
from posttrain.models.policy import DTYPES, Policy, load_causal_lm, pick_device
from posttrain.models.refit import PackedBucket, load_packed, pack_state_dict
from posttrain.models.tokenizer import load_tokenizer


def _in_ray_worker() -> bool:
    try:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    except ImportError:
        return False


class ActorPolicy(Policy):
    """A `Policy` that can also sample (with its own weights) and score with a frozen reference."""

    def __init__(
        self, cfg: PolicyConfig, *, tokenizer_path: str, reference: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(cfg, **kwargs)
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.reference = None
        if reference:
            self.reference = load_causal_lm(kwargs["model_path"], DTYPES[cfg.dtype]).to(self.device).eval()
            self.reference.requires_grad_(False)

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, batch_size: int
    ) -> GenerationOutput:
        return hf_generate(self.model, self.tokenizer, prompt_ids, params, batch_size=batch_size)

    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        if self.reference is None:
            raise RuntimeError("this policy was built without a reference model (loss.kl_beta is 0)")
        return batched_logprobs(
            self.reference,
            batch,
            "loss_mask",
            batch_size=self.cfg.logprob_batch_size,
            chunk_size=self.cfg.logprob_chunk_size,
        )

    def packed_weights(self) -> list:
        """Rank 0: the weights packed into buckets; inside Ray, put in the object store (refs, not copies)."""
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        buckets = pack_state_dict(state)
        if _in_ray_worker():
            import ray

            return [ray.put(bucket) for bucket in buckets]
        return buckets


class GenerationWorker:
    """Split placement: a separate copy of the model that only samples, refitted after each update."""

    def __init__(
        self,
        cfg: PolicyConfig,
        *,
        model_path: str,
        tokenizer_path: str,
        gpus: int = 0,
        num_threads: int | None = None,
    ) -> None:
        if num_threads:
            torch.set_num_threads(num_threads)
        self.cfg = cfg
        self.device = pick_device(gpus)
        self.model = load_causal_lm(model_path, DTYPES[cfg.dtype]).to(self.device).eval()
        self.tokenizer = load_tokenizer(tokenizer_path)

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, batch_size: int
    ) -> GenerationOutput:
        return hf_generate(self.model, self.tokenizer, prompt_ids, params, batch_size=batch_size)

    def load_weights(self, buckets: list) -> int:
        """Load packed buckets (or Ray refs to them) into this worker's model."""
        if buckets and not isinstance(buckets[0], PackedBucket):
            import ray

            buckets = ray.get(buckets)
        return load_packed(self.model, buckets)

    def logprobs(self, batch: TokenBatch, target_mask: str = "loss_mask") -> torch.Tensor:
        return batched_logprobs(
            self.model,
            batch,
            target_mask,
            batch_size=self.cfg.logprob_batch_size,
            chunk_size=self.cfg.logprob_chunk_size,
        )

    def parameters_checksum(self) -> float:
        return float(sum(p.detach().double().sum().item() for p in self.model.parameters()))
