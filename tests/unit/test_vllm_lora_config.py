"""generation.vllm.lora_adapter: accepted only with a LoRA policy and the vLLM backend, ranks vLLM serves;
vLLM's `max_lora_rank` for a policy rank; adapter module names for the served adapter's config."""

from __future__ import annotations

import pytest

from posttrain.config import load_config
from posttrain.config.eval import EvalConfig
from posttrain.config.ppo import PPOConfig
from posttrain.config.rl import DistillConfig, GRPOConfig
from posttrain.generation.vllm_lora import max_lora_rank, target_modules

ADAPTER = ["generation.vllm.lora_adapter=true"]


def test_lora_adapter_with_lora_and_vllm_is_accepted():
    cfg = load_config(GRPOConfig, None, ADAPTER + ["generation.backend=vllm", "policy.lora.rank=16"])
    assert cfg.generation.vllm.lora_adapter and cfg.policy.lora.rank == 16


@pytest.mark.parametrize("config_cls", [GRPOConfig, DistillConfig, PPOConfig])
def test_lora_adapter_needs_the_vllm_backend_and_a_lora_policy(config_cls):
    with pytest.raises(ValueError, match="generation.backend=hf"):
        load_config(config_cls, None, ADAPTER + ["policy.lora.rank=16"])
    with pytest.raises(ValueError, match="policy.lora is not set"):
        load_config(config_cls, None, ADAPTER + ["generation.backend=vllm"])


def test_lora_adapter_is_refused_by_eval_and_above_vllms_largest_rank():
    with pytest.raises(ValueError, match="policy.lora is not set"):
        load_config(EvalConfig, None, ADAPTER + ["generation.backend=vllm"])
    with pytest.raises(ValueError, match="up to 512"):
        load_config(GRPOConfig, None, ADAPTER + ["generation.backend=vllm", "policy.lora.rank=1024"])


def test_max_lora_rank_is_the_smallest_allowed_value_that_holds_the_rank():
    assert [max_lora_rank(r) for r in (1, 2, 4, 8, 9, 16, 300, 512)] == [1, 8, 8, 8, 16, 16, 320, 512]


def test_target_modules_are_the_leaf_names_of_the_adapter_tensors():
    names = [
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
        "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight",
    ]
    assert target_modules(names) == ["down_proj", "q_proj"]
