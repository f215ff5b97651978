"""The RL configs (grpo, ppo, distill) share one set of checks (`check_rl_config`, issue #29 item 10),
and vLLM's truncated-distribution logprobs are refused where they would bias a ratio (item 11)."""

from __future__ import annotations

import warnings

import pytest

from posttrain.config import ALGORITHM_CONFIGS, ConfigError, load_config
from posttrain.config.common import ConfigWarning
from posttrain.config.ppo import PPOConfig
from posttrain.config.rl import DistillConfig, GRPOConfig, RLConfig, RLLoopConfig

RL_CONFIGS = {"grpo": GRPOConfig, "ppo": PPOConfig, "distill": DistillConfig}
RL_IDS = list(RL_CONFIGS)


def _load(loop: str, overrides: list[str]):
    return load_config(RL_CONFIGS[loop], None, overrides)


def test_every_rl_config_runs_the_shared_checks():
    # every config that trains a policy on its own generations derives from RLConfig, its loop named
    rl = {n: cls for n, cls in ALGORITHM_CONFIGS.items() if {"policy", "generation"} <= set(cls.model_fields)}
    assert set(RL_CONFIGS) <= set(rl)
    for name, cls in rl.items():
        assert issubclass(cls, RLConfig), name
        assert cls.LOOP == name and isinstance(getattr(cls(), cls.LOOP), RLLoopConfig), name


@pytest.mark.parametrize("loop", RL_IDS)
def test_lora_with_split_shared_memory_refits_is_refused_by_every_rl_config(loop):
    # PPOConfig used to accept it (its copy of the check asked only about policy.fsdp)
    with pytest.raises(ConfigError, match=r"shared_memory cannot serve .* a LoRA policy"):
        _load(
            loop,
            ["policy.lora.rank=4", "generation.placement=split", "generation.refit_transport=shared_memory"],
        )
    cfg = _load(loop, ["policy.lora.rank=4", "generation.placement=split"])
    assert cfg.generation.resolved_refit_transport(cfg.cluster, cfg.policy.split_weights) != "shared_memory"


@pytest.mark.parametrize("loop", RL_IDS)
def test_fsdp_with_split_shared_memory_refits_is_refused_by_every_rl_config(loop):
    with pytest.raises(ConfigError, match=r"shared_memory cannot serve an FSDP2-sharded policy"):
        _load(
            loop,
            ["policy.fsdp=true", "generation.placement=split", "generation.refit_transport=shared_memory"],
        )


@pytest.mark.parametrize("loop", RL_IDS)
def test_every_rl_config_checks_the_minibatch_split_with_one_message(loop):
    # 4 prompts x 2 samples (distill, ppo: generations_per_prompt 2) = 8 sequences, 2 workers, 3 updates
    base = [f"{loop}.prompts_per_step=4", f"{loop}.generations_per_prompt=2", "cluster.num_workers=2"]
    with pytest.raises(
        ConfigError,
        match=rf"{loop}\.updates_per_batch=3 does not split the rollout batch of 8 sequences .* over the 2 "
        rf"policy worker\(s\).* Set {loop}\.updates_per_batch to one of \[1, 2, 4\]",
    ):
        _load(loop, [*base, f"{loop}.updates_per_batch=3"])
    assert getattr(_load(loop, [*base, f"{loop}.updates_per_batch=4"]), loop).updates_per_batch == 4


@pytest.mark.parametrize("loop", RL_IDS)
def test_vllm_lora_adapter_needs_the_vllm_backend_in_every_rl_config(loop):
    with pytest.raises(ConfigError, match="lora_adapter=true serves the adapter"):
        _load(loop, ["policy.lora.rank=4", "generation.vllm.lora_adapter=true"])


def test_a_local_teacher_has_one_worker_in_both_configs_that_have_one():
    teacher = ["teacher.model_name=some/model", "cluster.backend=local", "teacher.num_workers=2"]
    with pytest.raises(ConfigError, match="teacher.num_workers=2 with cluster.backend=local"):
        _load("distill", teacher)
    with pytest.raises(ConfigError, match="teacher.num_workers=2 with cluster.backend=local"):
        _load("grpo", [*teacher, "advantage.estimator=on_policy_distill", "teacher.placement=split"])


# ------------------------------------------------------------------ item 11: vLLM top-p / top-k
VLLM_TOP_P = ["generation.backend=vllm", "generation.top_p=0.9"]


@pytest.mark.parametrize("loop", ["grpo", "ppo"])
@pytest.mark.parametrize("truncation", [["generation.top_p=0.9"], ["generation.top_k=20"]])
def test_vllm_truncated_sampling_is_refused_with_importance_correction(loop, truncation):
    with pytest.raises(
        ConfigError,
        match=r"vllm with generation\.top_p=.*truncated distribution.*importance_correction=icepop",
    ):
        _load(loop, ["generation.backend=vllm", *truncation, "loss.importance_correction=icepop"])


def test_vllm_truncated_sampling_is_refused_wherever_generation_logprobs_enter_the_loss():
    with pytest.raises(ConfigError, match=r"grpo\.async_mode=true corrects stale data"):
        _load("grpo", [*VLLM_TOP_P, "grpo.async_mode=true", "generation.placement=split",
                       "generation.refit_transport=object_store"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"kl_in_reward with grpo\.updates_per_batch=1 takes π_old"):
        _load("grpo", [*VLLM_TOP_P, "loss.kl_in_reward=true", "loss.kl_beta=0.1"])
    with pytest.raises(ConfigError, match=r"on_policy_distill with grpo\.updates_per_batch=1"):
        _load("grpo", [*VLLM_TOP_P, "advantage.estimator=on_policy_distill", "teacher.model_name=m"])
    # with several updates per batch the trainer recomputes π_old itself: allowed (with the warning)
    with pytest.warns(
        ConfigWarning, match="token_mult_prob_error, gen_kl and entropy include the truncation"
    ):
        _load("grpo", [*VLLM_TOP_P, "loss.kl_in_reward=true", "loss.kl_beta=0.1", "grpo.updates_per_batch=2"])


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "generation.backend=hf",
            "generation.top_p=0.9",
            "generation.placement=split",
        ],  # full-softmax logprobs
        ["generation.backend=vllm", "generation.top_p=1.0"],  # no truncation
        [
            "generation.backend=vllm",
            "generation.top_p=0.9",
            "generation.temperature=0",
        ],  # greedy: none applied
    ],
)
def test_importance_correction_is_allowed_where_both_sides_agree(overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        cfg = _load("grpo", [*overrides, "loss.importance_correction=truncated"])
    assert cfg.loss.importance_correction == "truncated"


@pytest.mark.parametrize("loop", ["grpo", "ppo"])
def test_a_lower_precision_engine_gets_truncated_importance_weights_by_default(loop):
    """vLLM sampling in bf16 under a float32 policy: importance correction is on ("truncated") unless
    the config sets it, null included; an engine in the policy's own dtype leaves it off."""
    bf16_engine = ["generation.backend=vllm", "generation.vllm.dtype=bfloat16"]
    assert _load(loop, []).loss.importance_correction is None  # "auto" resolved: the sampler is the trainer
    assert _load(loop, bf16_engine).loss.importance_correction == "truncated"
    assert (
        _load(loop, [*bf16_engine, "loss.importance_correction=icepop"]).loss.importance_correction
        == "icepop"
    )
    assert _load(loop, [*bf16_engine, "loss.importance_correction=null"]).loss.importance_correction is None
    assert _load(loop, ["generation.backend=vllm"]).loss.importance_correction is None
    assert (
        _load(loop, ["generation.backend=vllm", "generation.vllm.dtype=float32"]).loss.importance_correction
        is None
    )
    with pytest.raises(
        ConfigError, match="truncated distribution"
    ):  # the default's ratios would be biased too
        _load(loop, [*bf16_engine, "generation.top_p=0.9"])


@pytest.mark.parametrize("loop", ["grpo", "ppo"])
def test_a_bf16_hf_sampler_copy_gets_truncated_importance_weights_by_default(loop):
    """generation.hf.dtype=bfloat16 under a float32 policy: the HF sampler decodes from a bf16 copy, so
    its logprobs are not the trainer's (correction on, and no "has no effect" warning); the policy's own
    dtype, or auto, leaves it off; a vLLM backend does not read hf.dtype (an error, not a silent no-op)."""
    bf16_copy = ["generation.hf.dtype=bfloat16"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        cfg = _load(loop, bf16_copy)
        assert cfg.loss.importance_correction == "truncated"
        assert cfg.generation.sampling_dtype(cfg.policy.dtype) == "bfloat16"
        assert (
            _load(loop, [*bf16_copy, "loss.importance_correction=icepop"]).loss.importance_correction
            == "icepop"
        )
    assert _load(loop, ["generation.hf.dtype=float32"]).loss.importance_correction is None
    cfg = _load(loop, [*bf16_copy, "policy.dtype=bfloat16"])  # autocast bf16 already: no copy
    assert cfg.loss.importance_correction is None and cfg.generation.sampling_dtype("bfloat16") == "bfloat16"
    with pytest.raises(ConfigError, match=r"generation.hf.dtype=bfloat16 sets the HF sampler.*vllm.dtype"):
        _load(loop, [*bf16_copy, "generation.backend=vllm"])


def test_distill_allows_vllm_truncated_sampling():
    # the distillation loss reads no generation logprobs
    assert _load("distill", VLLM_TOP_P).generation.top_p == 0.9
