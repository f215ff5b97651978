"""The parity gate: after a weight transfer, prove that the generator runs the policy's weights.

checksum: (Σw, Σw²) in float64 over the policy's parameters must equal the engine's, relative
  tolerance `relative_tolerance`. A skipped, partial or stale refit changes the sums (one optimizer
  step moves Σw² by far more than float64 rounding).
logprobs: the generator samples `new_tokens` tokens for `prompts` fixed prompts; the policy scores
  the same tokens; token_mult_prob_error = mean_t exp(|logp_gen - logp_train|) must stay at or
  below `max_mult_prob_error` (1.0 is exact agreement).
"""

from __future__ import annotations

from typing import Protocol

import torch

from posttrain.algorithms.metrics import token_mult_prob_error
from posttrain.config.rollout import RefitCheckConfig
from posttrain.data.batching import TokenBatch
from posttrain.generation.sampling import GenerationOutput, SamplingParams


class RefitError(RuntimeError):
    """The generation engine does not run the trained weights."""


class Generator(Protocol):
    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, batch_size: int
    ) -> GenerationOutput: ...

    def generator_checksums(self) -> list[tuple[float, float] | None]: ...


class Scorer(Protocol):
    def logprobs(self, batch: TokenBatch, target_mask: str = "loss_mask") -> torch.Tensor: ...

    def parameters_checksum(self, dtype: str | None = None) -> list[tuple[float, float]]: ...


def probe_batch(
    prompt_ids: list[list[int]], out: GenerationOutput, pad_id: int
) -> tuple[TokenBatch, torch.Tensor]:
    """(right-padded prompt + completion batch with loss_mask on the completion, generation logprobs)."""
    rows = [list(p) + list(t) for p, t in zip(prompt_ids, out.token_ids, strict=True)]
    length = max(len(r) for r in rows)
    n = len(rows)
    input_ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, length), dtype=torch.long)
    loss_mask = torch.zeros((n, length), dtype=torch.float32)
    gen_logprobs = torch.zeros((n, length), dtype=torch.float32)
    for i, (prompt, tokens, logprobs) in enumerate(zip(prompt_ids, out.token_ids, out.logprobs, strict=True)):
        input_ids[i, : len(rows[i])] = torch.tensor(rows[i])
        attention_mask[i, : len(rows[i])] = 1
        span = slice(len(prompt), len(prompt) + len(tokens))
        loss_mask[i, span] = 1.0
        gen_logprobs[i, span] = torch.tensor(logprobs, dtype=torch.float32)
    return TokenBatch(input_ids, attention_mask, loss_mask), gen_logprobs


def compare_checksums(
    policy: tuple[float, float], generators: list[tuple[float, float] | None], tolerance: float
) -> float:
    """Largest relative difference of (Σw, Σw²) between the policy and any generator; raises above tolerance."""
    worst = 0.0
    for rank, got in enumerate(generators):
        if got is None:
            continue
        for name, want, have in zip(("sum", "sum of squares"), policy, got, strict=True):
            diff = abs(want - have) / max(abs(want), 1e-30)
            worst = max(worst, diff)
            if diff > tolerance:
                raise RefitError(
                    f"generator {rank} does not run the trained weights: {name} of the weights is "
                    f"{have!r} there and {want!r} in the policy (relative difference {diff:.3g} > {tolerance:g}). "
                    "The refit was skipped or incomplete; if this model's vLLM loader transforms weights, "
                    "use generation.refit_check.mode=logprobs."
                )
    return worst


def check_refit(
    cfg: RefitCheckConfig,
    policy: Scorer,
    generator: Generator,
    probe_prompts: list[list[int]],
    params: SamplingParams,
    pad_id: int,
    engine_dtype: str | None = None,
) -> dict[str, float]:
    """Run the configured check; returns its metric, raises `RefitError` when it fails.

    `engine_dtype`: the dtype the generator holds the weights in, when it differs from the policy's."""
    if cfg.mode == "off":
        return {}
    if cfg.mode == "checksum":
        [reference, *_] = policy.parameters_checksum(engine_dtype)
        diff = compare_checksums(reference, generator.generator_checksums(), cfg.relative_tolerance)
        return {"refit/checksum_relative_diff": diff}
    prompts = probe_prompts[: cfg.prompts]
    probe = SamplingParams(
        temperature=params.temperature, max_new_tokens=cfg.new_tokens, seed=params.seed, top_p=1.0
    )
    out = generator.generate(prompts, probe, len(prompts))
    batch, gen_logprobs = probe_batch(prompts, out, pad_id)
    train_logprobs = policy.logprobs(batch)
    error = float(token_mult_prob_error(train_logprobs, gen_logprobs, batch.loss_mask))
    if error > cfg.max_mult_prob_error:
        raise RefitError(
            f"the generator's logprobs disagree with the policy's on the probe batch: token_mult_prob_error "
            f"{error:.4f} > {cfg.max_mult_prob_error} (1.0 = identical). The engine does not run the "
            "trained weights (skipped or corrupted refit), or its numerics differ more than allowed."
        )
    return {"refit/probe_mult_prob_error": error}
