"""Every random stream of a generate call has a seed of its own (issue 12, item 10).

A call seeded with `base` is spread over generation workers (`generate_on`), and each worker draws
one stream per HF sampler batch or per vLLM request. Formerly worker w got seed base * 1000 + w and
its batch k seed base * 1000 + w + k, so worker w's batch k + 1 shared worker w + 1's batch k seed.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from posttrain.distributed.actor_group import generate_on
from posttrain.generation import sampling
from posttrain.generation.sampling import SamplingParams
from posttrain.generation.worker import Sampling

LOW32 = (1 << 32) - 1


def _invert(seed: int) -> tuple[int, int, int]:
    """(base mod 2**31, stream, index) back from a seed: a left inverse, so `sampling_seed` is injective."""
    from posttrain.generation.sampling import SEED_INDEX_BITS, _mix64

    base = seed >> 32
    low = (seed & LOW32) ^ (_mix64(base) >> 32)
    return base, low >> SEED_INDEX_BITS, low & ((1 << SEED_INDEX_BITS) - 1)


def test_sampling_seed_has_a_left_inverse_and_fits_int64():
    from posttrain.generation.sampling import SEED_INDEX_BITS, SEED_STREAM_BITS, sampling_seed

    rng = random.Random(0)
    corners = [0, 1, (1 << 31) - 1]
    bases = corners + [rng.randrange(1 << 31) for _ in range(300)]
    streams = [0, 1, (1 << SEED_STREAM_BITS) - 1] + [rng.randrange(1 << SEED_STREAM_BITS) for _ in range(5)]
    indices = [0, 1, (1 << SEED_INDEX_BITS) - 1] + [rng.randrange(1 << SEED_INDEX_BITS) for _ in range(5)]
    for base in bases:
        for stream in streams:
            for index in indices:
                seed = sampling_seed(base, stream, index)
                assert 0 <= seed < 1 << 63
                assert _invert(seed) == (base, stream, index)
    # within one call the low 32 bits (all that torch's CPU generator keeps) are a bijection of (stream, index)
    for base in bases[:20]:
        lows = {sampling_seed(base, s, i) & LOW32 for s in range(8) for i in range(64)}
        assert len(lows) == 8 * 64
    with pytest.raises(ValueError, match="worker index"):
        sampling_seed(0, 1 << SEED_STREAM_BITS, 0)
    with pytest.raises(ValueError, match="streams in one generate call"):
        sampling_seed(0, 0, 1 << SEED_INDEX_BITS)


def test_torch_cpu_generator_keeps_only_32_bits_of_a_seed():
    """Why the low half alone must already be distinct within a call."""
    a = torch.rand(4, generator=torch.Generator().manual_seed(7))
    b = torch.rand(4, generator=torch.Generator().manual_seed(7 + (1 << 32)))
    assert torch.equal(a, b)


class _FakeModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(eos_token_id=0)


class _HFWorker(Sampling):
    """A colocated/split worker's `generate` (the real one) over a fake model."""

    def __init__(self) -> None:
        self.engine = None
        self.model = _FakeModel()
        self.tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=0)


class _Workers:
    """Stands for `Workers`: runs `method` on each instance with its arguments."""

    def __init__(self, instances: list) -> None:
        self.instances = instances

    def __len__(self) -> int:
        return len(self.instances)

    def run(self, method, args_per_rank=None, **kwargs):
        return [
            method(inst, *args, **kwargs) for inst, args in zip(self.instances, args_per_rank, strict=False)
        ]


def _step_bases(seed: int = 0, steps: int = 40, rounds: int = 3) -> list[int]:
    """The call seeds of a run: GRPO's per-step, per-round rollout seeds, and validation's."""
    return [seed * 1_000_003 + step * 101 + r for step in range(steps) for r in range(1, rounds + 1)] + [seed]


def test_hf_sampler_seeds_are_distinct_across_workers_batches_and_steps(monkeypatch):
    seeds_of_call: list[int] = []

    def fake_sample(model, prompt_ids, *, seed, **kwargs):
        seeds_of_call.append(seed)
        return [[5, 0] for _ in prompt_ids], [[-0.5, -0.5] for _ in prompt_ids]

    monkeypatch.setattr(sampling, "sample", fake_sample)
    workers = _Workers([_HFWorker() for _ in range(4)])
    prompts = [[1, 2, i] for i in range(64)]  # 16 per worker: 4 batches of 4 each
    every: list[int] = []
    for base in _step_bases():
        seeds_of_call.clear()
        out = generate_on(workers, Sampling.generate, prompts, SamplingParams(seed=base), batch_size=4)
        assert len(out.token_ids) == 64
        assert len(seeds_of_call) == 16
        assert len(set(seeds_of_call)) == 16, f"call {base}: workers or batches share a seed"
        assert len({s & LOW32 for s in seeds_of_call}) == 16, "distinct for torch's CPU generator too"
        every += seeds_of_call
    assert len(set(every)) == len(every), "two streams of the run share a seed"


@pytest.mark.vllm
def test_vllm_request_seeds_are_distinct_across_workers_requests_and_steps():
    try:
        from vllm import LLM  # noqa: F401
    except ImportError as e:
        pytest.skip(f"vLLM is not installed: {e}")
    from posttrain.generation.vllm_engine import VLLMGenerator

    seeds_of_call: list[int] = []

    class FakeLLM:
        def generate(self, prompts, sampling, use_tqdm=False, lora_request=None):
            seeds_of_call.extend(sp.seed for sp in sampling)
            step = {5: SimpleNamespace(logprob=-0.5), 0: SimpleNamespace(logprob=-0.5)}
            done = SimpleNamespace(token_ids=[5, 0], logprobs=[step, step])
            return [SimpleNamespace(outputs=[done]) for _ in prompts]

    def engine() -> VLLMGenerator:
        gen = VLLMGenerator.__new__(VLLMGenerator)
        gen.llm, gen.sleeping, gen.eos_ids = FakeLLM(), False, {0}
        gen.adapter = None  # no LoRA adapter served
        gen.tokenizer = SimpleNamespace(eos_token_id=0)
        return gen

    class VLLMWorker(Sampling):
        def __init__(self) -> None:
            self.engine = engine()

    workers = _Workers([VLLMWorker() for _ in range(3)])
    prompts = [[1, 2, i] for i in range(30)]
    every: list[int] = []
    for base in _step_bases(seed=3):
        seeds_of_call.clear()
        generate_on(workers, Sampling.generate, prompts, SamplingParams(seed=base), batch_size=64)
        assert len(set(seeds_of_call)) == len(seeds_of_call) == 30
        assert len({s & LOW32 for s in seeds_of_call}) == 30
        every += seeds_of_call
    assert len(set(every)) == len(every)
