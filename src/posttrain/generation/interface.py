"""What a generator provides to the code that samples through it (the rollout loops, the agent
endpoint, the RL runtime):

- `Generates`: `generate(prompt_ids, params, batch_size)`, one batch of prompts to their completions.
- `SamplerHost`: run code where the generator's samplers live, one call per sampler (a model or a
  vLLM engine, in this process or in each generation worker): multi-turn episodes without a turn
  barrier decode continuously beside the sampler (`posttrain.rollout.continuous`).

Implemented by `LocalGenerator` (one sampler, in this process) and the worker groups of
`posttrain.distributed.actor_group` (one sampler per worker)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from posttrain.generation.sampling import GenerationOutput, SamplingParams


class Generates(Protocol):
    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, batch_size: int
    ) -> GenerationOutput: ...


class SamplerHost(Protocol):
    def num_samplers(self) -> int:
        """How many samplers `run_on_samplers` can call (at least 1)."""
        ...

    def run_on_samplers(self, fn: Callable[..., Any], args: Sequence[tuple]) -> list[Any]:
        """`fn(sampler, tokenizer, *args[k])` on sampler k for k < len(args) <= num_samplers(), results
        in order: the sampler is an HF model (run under the generation compute context) or a vLLM
        engine, the tokenizer the generator's own."""
        ...
