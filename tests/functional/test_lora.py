"""LoRA (peft) on the tiny random Llama: the step-0 model is the base model, merged weights compute what
the adapters compute, only the adapters train, the reference is the base with adapters off, checkpoints
hold the adapter and resume bit-exactly, export loads in peft and transformers, refits make generators
run the merged weights (the gate passes after a refit and fails on a skipped one), and short runs."""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("peft")

from posttrain.config.common import ClusterConfig, LoraConfig, OptimizerConfig, PolicyConfig, SchedulerConfig  # noqa: E402
from posttrain.config.rollout import GenerationConfig, RefitCheckConfig  # noqa: E402
from posttrain.data.batching import TokenBatch  # noqa: E402
from posttrain.distributed.actor import ActorPolicy  # noqa: E402
from posttrain.models.policy import Policy  # noqa: E402

RANK = 4


def _cfg(lora: LoraConfig | None = None, **kw) -> PolicyConfig:
    return PolicyConfig(
        lora=lora if lora is not None else LoraConfig(rank=RANK, alpha=8.0),
        optimizer=OptimizerConfig(lr=1e-2, max_grad_norm=None),
        scheduler=SchedulerConfig(name="constant"),
        train_micro_batch_size=2,
        **kw,
    )


def _actor(model_dir, cfg: PolicyConfig | None = None, **kw) -> ActorPolicy:
    return ActorPolicy(
        cfg or _cfg(), model_path=str(model_dir), total_steps=10, tokenizer_path=str(model_dir), **kw
    )


def _base(model_dir) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _batch(tokenizer, n: int = 4) -> TokenBatch:
    texts = [f"Question {i}: what is {i} times {i + 1}? Answer: {i * (i + 1)}" for i in range(n)]
    rows = [tokenizer(t)["input_ids"] for t in texts]
    length = max(len(r) for r in rows)
    ids = torch.full((n, length), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, length), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    loss_mask = mask.float()
    loss_mask[:, :4] = 0
    return TokenBatch(ids, mask, loss_mask)


def _nll(logprobs: torch.Tensor, batch: TokenBatch, normalizer: float):
    from posttrain.trainers.sft import sft_loss  # importable by Ray workers (a test module's function is not)

    return sft_loss(logprobs, batch, normalizer)


def _step(policy: Policy, batch: TokenBatch) -> None:
    policy.train(batch, _nll, float(batch.loss_mask.sum()))


@torch.no_grad()
def _logits(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    model.eval()
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits


def _perturb_adapters(model: torch.nn.Module, seed: int = 1) -> None:
    """B != 0 everywhere (B starts at zero): the adapters change the model."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def test_step0_logits_equal_the_base_model(tiny_model_dir, tokenizer):
    batch = _batch(tokenizer)
    for init in ("default", "gaussian"):
        policy = _actor(tiny_model_dir, _cfg(LoraConfig(rank=RANK, init=init)))
        assert torch.equal(_logits(policy.model, batch), _logits(_base(tiny_model_dir), batch)), init


def test_trainable_parameters_are_r_times_in_plus_out_per_adapted_linear(tiny_model_dir):
    # tiny Llama: hidden 64, 4 heads of 16 (q, o: 64 -> 64), 2 kv heads (k, v: 64 -> 32), MLP 128, 2 layers
    per_layer_all = (64 + 64) + (64 + 32) + (64 + 32) + (64 + 64) + 2 * (64 + 128) + (128 + 64)
    for targets, per_layer in (("all-linear", per_layer_all), (["q_proj", "v_proj"], (64 + 64) + (64 + 32))):
        policy = Policy(
            _cfg(LoraConfig(rank=RANK, target_modules=targets)), model_path=str(tiny_model_dir), total_steps=1
        )
        trainable = [p for p in policy.model.parameters() if p.requires_grad]
        assert sum(p.numel() for p in trainable) == RANK * per_layer * 2, targets
        optimized = [p for group in policy.optimizer.param_groups for p in group["params"]]
        assert {id(p) for p in optimized} == {id(p) for p in trainable}


def test_merged_weights_compute_what_the_adapters_compute(tiny_model_dir, tokenizer):
    """fp32: a plain model loaded with the merged W + s·B@A against the adapted model, within 1e-5; the
    trained tensors are left untouched by the merge."""
    batch = _batch(tokenizer)
    policy = _actor(tiny_model_dir)
    _perturb_adapters(policy.model)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    merged = dict(policy.generator_weights())
    plain = _base(tiny_model_dir)
    assert set(merged) == {name for name, _ in plain.named_parameters()}
    plain.load_state_dict(merged, strict=False)
    adapted, folded = _logits(policy.model, batch), _logits(plain, batch)
    assert (adapted - folded).abs().max() <= 1e-5
    assert (adapted - _logits(_base(tiny_model_dir), batch)).abs().max() > 1e-2  # the adapters matter
    after = policy.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_reference_is_the_base_model_with_adapters_off(tiny_model_dir, tokenizer):
    batch = _batch(tokenizer)
    policy = _actor(tiny_model_dir, reference=True)
    assert policy.reference is None  # no second copy of the weights
    base_lp = _actor(tiny_model_dir, PolicyConfig()).logprobs(batch)
    assert torch.equal(policy.reference_logprobs(batch), base_lp)
    _step(policy, batch)
    _step(policy, batch)
    assert (policy.logprobs(batch) - base_lp).abs().max() > 1e-3  # the policy moved
    assert torch.equal(policy.reference_logprobs(batch), base_lp)  # the reference did not
    assert all(p.requires_grad == ("lora_" in n) for n, p in policy.model.named_parameters())


def test_adapter_only_checkpoint_resumes_bit_exactly(tiny_model_dir, tokenizer, tmp_path):
    from safetensors.torch import load_file

    batch = _batch(tokenizer)
    cfg = _cfg(LoraConfig(rank=RANK, dropout=0.1))  # dropout: the RNG state is part of the resume
    first = _actor(tiny_model_dir, cfg)
    _step(first, batch)
    first.save_checkpoint(str(tmp_path / "ckpt"))
    _step(first, batch)
    _step(first, batch)
    expected = first.state_dict_cpu()

    saved = load_file(tmp_path / "ckpt" / "model" / "adapter_model.safetensors")
    trainable = [n for n, p in first.model.named_parameters() if p.requires_grad]
    assert len(saved) == len(trainable) and all("lora_" in k for k in saved)
    optimizer = torch.load(tmp_path / "ckpt" / "optimizer.pt", weights_only=False)["optimizer"]
    assert len(optimizer["state"]) == len(trainable)  # AdamW state of the adapters only

    resumed = _actor(tiny_model_dir, cfg)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    _step(resumed, batch)
    _step(resumed, batch)
    got = resumed.state_dict_cpu()
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_resume_refuses_another_lora_shape(tiny_model_dir, tmp_path):
    from posttrain.modeling.loading import CheckpointMismatchError

    _actor(tiny_model_dir).save_checkpoint(str(tmp_path / "ckpt"))
    other = _actor(tiny_model_dir, _cfg(LoraConfig(rank=RANK, target_modules=["q_proj"])))
    with pytest.raises(CheckpointMismatchError, match="policy.lora"):
        other.load_checkpoint(str(tmp_path / "ckpt"))


# ------------------------------------------------------------------ refit and the parity gate
@pytest.mark.parametrize("transport", ["object_store", "collective"])
def test_refit_makes_the_generator_run_the_merged_weights(tiny_model_dir, tokenizer, transport):
    from posttrain.distributed.actor_group import ActorGroup, GenerationGroup
    from posttrain.distributed.refit_check import RefitError, check_refit
    from posttrain.generation.sampling import SamplingParams
    from posttrain.generation.worker import GenerationWorker

    batch = _batch(tokenizer)
    cluster = ClusterConfig(backend="local")
    kw = dict(model_path=str(tiny_model_dir), tokenizer_path=str(tiny_model_dir))
    policy = ActorGroup(_cfg(), cluster, total_steps=10, **kw)
    generation = GenerationConfig(placement="split", refit_transport=transport)
    generator = GenerationGroup(generation, _cfg(), cluster, transport=transport, **kw)
    try:
        prompts = [tokenizer(f"Count to {i}")["input_ids"] for i in range(3)]
        params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=0)
        pad = tokenizer.pad_token_id
        checks = {mode: RefitCheckConfig(mode=mode, new_tokens=6) for mode in ("checksum", "logprobs")}
        gate = functools.partial(check_refit, policy=policy, generator=generator, probe_prompts=prompts)
        for check in checks.values():  # step 0: the base model on both sides
            gate(check, params=params, pad_id=pad)
        policy.train(batch, _nll, float(batch.loss_mask.sum()))
        policy.train(batch, _nll, float(batch.loss_mask.sum()))
        for check in checks.values():  # the refit was skipped: the gate fails
            with pytest.raises(RefitError):
                gate(check, params=params, pad_id=pad)
        generator.refit(policy)
        assert gate(checks["checksum"], params=params, pad_id=pad)["refit/checksum_relative_diff"] < 1e-6
        assert gate(checks["logprobs"], params=params, pad_id=pad)["refit/probe_mult_prob_error"] <= 1.0001
        # the generator's weights are the merged ones, under the base model's names
        [worker] = generator.workers.run(GenerationWorker.state_dict_cpu)
        [policy_rank] = policy.workers.instances
        merged = dict(policy_rank.generator_weights())
        assert all(torch.allclose(worker[name], tensor) for name, tensor in merged.items())
    finally:
        generator.shutdown()
        policy.shutdown()


def test_a_bf16_sampler_copy_runs_the_merged_weights(tiny_model_dir, tokenizer):
    """generation.hf.dtype=bfloat16 under a LoRA policy: the colocated copy holds W + s·BA cast to bf16
    under the base model's names; the checksum gate (over the merged weights) fails on a skipped
    refit and passes after one."""
    from conftest import OneActorGroup

    from posttrain.config.rollout import HFGenerationConfig
    from posttrain.distributed.refit_check import RefitError, check_refit
    from posttrain.generation.sampling import SamplingParams

    generation = GenerationConfig(hf=HFGenerationConfig(dtype="bfloat16"))
    policy = _actor(tiny_model_dir, generation=generation)
    group = OneActorGroup(policy)
    gate = functools.partial(
        check_refit, RefitCheckConfig(mode="checksum"), group, group, [], SamplingParams(), 0, "bfloat16"
    )
    gate()  # step 0: B = 0, the merged weights are the base's
    batch = _batch(tokenizer)
    _step(policy, batch)
    _step(policy, batch)
    with pytest.raises(RefitError):
        gate()
    policy.refit_engine()
    assert gate()["refit/checksum_relative_diff"] == 0.0
    copy = dict(policy.sampler_copy.named_parameters())
    merged = dict(policy.generator_weights())
    assert merged.keys() == copy.keys()
    assert all(torch.equal(copy[name], tensor.to(torch.bfloat16)) for name, tensor in merged.items())


# ------------------------------------------------------------------ the output layer (tied or not)
def test_lora_on_a_tied_lm_head_is_refused_at_startup(tiny_model_dir):
    # the tiny Llama ties lm_head to embed_tokens: its adapter would be dropped from merged refits
    with pytest.raises(ValueError, match=r"lm_head, whose weight is tied to model\.embed_tokens\.weight"):
        cfg = _cfg(LoraConfig(rank=RANK, target_modules=["q_proj", "lm_head"]))
        Policy(cfg, model_path=str(tiny_model_dir), total_steps=1)


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory, tokenizer):
    from conftest import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("untied"), tokenizer, tie_word_embeddings=False)


def test_lora_on_an_untied_lm_head_refits_the_merged_output_layer(untied_model_dir, tokenizer):
    """An untied lm_head's adapter reaches the generator: after a refit the generator's lm_head is the
    merged W + s·B@A (not the embedding, not the base), the gate passes, and generation logprobs match."""
    from posttrain.distributed.actor_group import ActorGroup, GenerationGroup
    from posttrain.distributed.refit_check import check_refit
    from posttrain.generation.sampling import SamplingParams
    from posttrain.generation.worker import GenerationWorker

    cfg = _cfg(LoraConfig(rank=RANK, alpha=8.0, target_modules=["q_proj", "lm_head"]))
    cluster = ClusterConfig(backend="local")
    kw = dict(model_path=str(untied_model_dir), tokenizer_path=str(untied_model_dir))
    policy = ActorGroup(cfg, cluster, total_steps=10, **kw)
    generator = GenerationGroup(
        GenerationConfig(placement="split", refit_transport="object_store"), cfg, cluster,
        transport="object_store", **kw,
    )  # fmt: skip
    try:
        [rank] = policy.workers.instances
        _perturb_adapters(rank.model)
        generator.refit(policy)
        prompts = [tokenizer(f"Count to {i}")["input_ids"] for i in range(3)]
        params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=0)
        for mode in ("checksum", "logprobs"):
            check_refit(RefitCheckConfig(mode=mode, new_tokens=6), policy, generator, prompts, params,
                        tokenizer.pad_token_id)  # fmt: skip
        [served] = generator.workers.run(GenerationWorker.state_dict_cpu)
        head = rank.model.lm_head
        lora_a, lora_b = head.lora_A["default"].weight, head.lora_B["default"].weight
        expected = head.base_layer.weight + (lora_b @ lora_a) * (8.0 / RANK)
        assert torch.allclose(served["lm_head.weight"], expected, atol=1e-6)
        assert (served["lm_head.weight"] - head.base_layer.weight).abs().max() > 1e-3  # the adapter is in
        assert torch.equal(served["model.embed_tokens.weight"], rank.model.model.embed_tokens.weight)
    finally:
        generator.shutdown()
        policy.shutdown()


# ------------------------------------------------------------------ trainers end to end, export
LORA_OVERRIDES = {"policy.lora.rank": RANK, "policy.lora.alpha": 8, "policy.optimizer.lr": 1e-2}


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory):
    from conftest import write_sft_jsonl

    return write_sft_jsonl(tmp_path_factory.mktemp("lora_sft") / "train.jsonl", n=24)


def test_sft_with_lora_learns_and_exports_merged_and_as_adapter(
    tiny_model_dir, sft_data, tokenizer, tmp_path
):
    from conftest import sft_overrides
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from posttrain.checkpoint.export import export_checkpoint
    from posttrain.cli import main
    from posttrain.config import load_config
    from posttrain.config.supervised import SFTConfig
    from posttrain.errors import UserError
    from posttrain.trainers.sft import run_sft

    overrides = {**LORA_OVERRIDES, "sft.max_steps": 6, "sft.val_every": 3}
    cfg = load_config(SFTConfig, None, sft_overrides(tiny_model_dir, sft_data, tmp_path / "run", **overrides))
    result = run_sft(cfg)
    losses = [h["loss"] for h in result.history if "loss" in h]
    assert len(losses) == 6 and losses[-1] < losses[0]
    ckpt = result.last_checkpoint
    assert (ckpt / "model" / "adapter_config.json").is_file()
    assert not list((ckpt / "model").glob("model*.safetensors"))  # the adapter only

    batch = _batch(tokenizer)
    trained = _actor(tiny_model_dir, _cfg())
    trained.load_checkpoint(str(ckpt))
    want = _logits(trained.model, batch)
    assert (want - _logits(_base(tiny_model_dir), batch)).abs().max() > 1e-3  # it learned something

    merged = export_checkpoint(ckpt, tmp_path / "merged").path
    assert main(["export", str(ckpt), str(tmp_path / "adapter"), "--adapter"]) == 0
    plain = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    with_peft = PeftModel.from_pretrained(_base(tiny_model_dir), tmp_path / "adapter")
    for model in (plain, with_peft):
        assert (_logits(model, batch) - want).abs().max() <= 1e-5
    assert not any("lora" in name for name in plain.state_dict())
    # a LoRA checkpoint is not a whole model: where one is needed, the error says to export it
    from posttrain.checkpoint.export import resolve_model_source

    with pytest.raises(UserError, match="posttrain export"):
        resolve_model_source(str(ckpt))


def test_grpo_with_lora_colocated_with_kl_and_split_with_refit_gate(tiny_model_dir, tmp_path):
    from conftest import grpo_test_config

    from posttrain.trainers.grpo import run_grpo

    runs = {
        "colocated": {"loss.kl_beta": 0.1},
        "split": {
            "generation.placement": "split",
            "generation.refit_transport": "object_store",
            "generation.refit_check.mode": "checksum",
        },
    }
    for name, extra in runs.items():
        result = run_grpo(grpo_test_config(tiny_model_dir, tmp_path / name, **LORA_OVERRIDES, **extra))
        train = [h for h in result.history if "reward/mean" in h]
        assert [h["step"] for h in train] == [1, 2], name
        assert (result.last_checkpoint / "model" / "adapter_model.safetensors").is_file()
        if name == "split":
            assert all(h["refit/checksum_relative_diff"] < 1e-9 for h in train)
        else:
            assert train[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the reference is the step-0 policy


def test_lora_refuses_shared_memory_refits():
    from posttrain.config import load_config
    from posttrain.config.rl import GRPOConfig

    with pytest.raises(ValueError, match="LoRA"):
        load_config(
            GRPOConfig,
            None,
            ["policy.lora.rank=4", "generation.placement=split", "generation.refit_transport=shared_memory"],
        )
    cfg = load_config(GRPOConfig, None, ["policy.lora.rank=4", "generation.placement=split"])
    assert cfg.generation.resolved_refit_transport(cfg.cluster, cfg.policy.split_weights) != "shared_memory"


@pytest.fixture(scope="module")
def preference_data(tmp_path_factory):
    from preference_helpers import write_preference_jsonl

    return write_preference_jsonl(tmp_path_factory.mktemp("lora_pref") / "train.jsonl", n=8)


def test_dpo_and_rm_with_lora(tiny_model_dir, preference_data, tokenizer, tmp_path):
    from preference_helpers import preference_overrides

    from posttrain.checkpoint.export import export_checkpoint
    from posttrain.config import load_config
    from posttrain.config.supervised import DPOConfig, RMConfig
    from posttrain.errors import UserError
    from posttrain.models.reward_model import load_reward_model
    from posttrain.trainers.dpo import run_dpo
    from posttrain.trainers.rm import run_rm

    extra = {**LORA_OVERRIDES, "max_steps": 2, "val_every": 2}
    for section, config, run in (("dpo", DPOConfig, run_dpo), ("rm", RMConfig, run_rm)):
        knobs = {k if k.startswith("policy.") else f"{section}.{k}": v for k, v in extra.items()}
        overrides = preference_overrides(
            tiny_model_dir, preference_data, tmp_path / section, section, **knobs
        )
        result = run(load_config(config, None, overrides))
        train = [h for h in result.history if "loss" in h]
        assert [h["step"] for h in train] == [1, 2], section
        if section == "dpo":  # π = π_ref (the base, adapters off) at step 1: -log σ(0)
            assert train[0]["loss"] == pytest.approx(0.6931, abs=1e-3)
    # the reward model trains its new score head in full beside the adapters; export merges both
    ckpt = result.last_checkpoint
    with pytest.raises(UserError, match="posttrain export"):
        load_reward_model(ckpt, torch.float32)
    merged = load_reward_model(export_checkpoint(ckpt, tmp_path / "rm_merged").path, torch.float32).eval()
    from posttrain.models.reward_model import RewardPolicy

    trained = RewardPolicy(
        _cfg(), pad_token_id=tokenizer.pad_token_id, model_path=str(tiny_model_dir), total_steps=2
    )
    trained.load_checkpoint(str(ckpt))
    batch = _batch(tokenizer)
    with torch.no_grad():
        got = merged(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.squeeze(-1)
    assert (got - trained.scores(batch)).abs().max() <= 1e-5


def test_distill_with_lora(tiny_model_dir, tmp_path):
    from posttrain.config import load_config
    from posttrain.config.rl import DistillConfig
    from posttrain.trainers.distill import run_distill

    overrides = {
        "policy.model_name": str(tiny_model_dir),
        "policy.max_seq_len": 96,
        "data.example_turns": "[]",  # the quickstart's worked example does not fit in 96 tokens
        "teacher.model_name": str(tiny_model_dir),
        "data.train.reasoning_gym.size": 16,
        "data.validation": "null",
        "distill.max_steps": 2,
        "distill.prompts_per_step": 2,
        "distill.generations_per_prompt": 2,
        "distill.topk_logits_k": 8,
        "generation.max_new_tokens": 8,
        "cluster.backend": "local",
        "logging.run_dir": str(tmp_path / "run"),
        "logging.tensorboard": False,
        **LORA_OVERRIDES,
    }
    result = run_distill(load_config(DistillConfig, None, [f"{k}={v}" for k, v in overrides.items()]))
    train = [h for h in result.history if "distill/divergence" in h]
    assert [h["step"] for h in train] == [1, 2]
    # the teacher is the student's base model: the step-1 divergence is 0 (B = 0)
    assert train[0]["distill/divergence"] == pytest.approx(0.0, abs=1e-5)


# ------------------------------------------------------------------ FSDP2 (2 CPU workers, gloo)
@pytest.mark.ray
def test_fsdp2_lora_matches_one_plain_worker_and_refits_merged(
    ray_cluster, tiny_model_dir, tokenizer, tmp_path
):
    from posttrain.distributed.actor_group import ActorGroup
    from posttrain.trainers.sft import sft_loss

    batch = _batch(tokenizer)
    kw = dict(
        model_path=str(tiny_model_dir), tokenizer_path=str(tiny_model_dir), total_steps=4, reference=True
    )
    results = {}
    for name, cfg, workers in (("plain", _cfg(), 1), ("fsdp", _cfg(fsdp=True), 2)):
        group = ActorGroup(cfg, ClusterConfig(backend="ray", num_workers=workers), **kw)
        try:
            ref0 = group.reference_logprobs(batch)
            out = group.train(batch, sft_loss, float(batch.loss_mask.sum()))
            group.save_checkpoint(tmp_path / name)
            results[name] = dict(
                out=out,
                ref=(ref0, group.reference_logprobs(batch)),
                logprobs=group.logprobs(batch),
                checksums=group.parameters_checksum(),
                merged=group.packed_weights(),
            )
            if name == "fsdp":  # resume: train, reload, the same weights as after the saved step
                group.train(batch, sft_loss, float(batch.loss_mask.sum()))
                group.load_checkpoint(tmp_path / name)
                assert group.parameters_checksum()[0] == pytest.approx(
                    results[name]["checksums"][0], rel=1e-12
                )
        finally:
            group.shutdown()
    plain, fsdp = results["plain"], results["fsdp"]
    assert fsdp["out"].loss_metrics["loss"] == pytest.approx(plain["out"].loss_metrics["loss"], rel=1e-5)
    assert fsdp["out"].grad_norm == pytest.approx(plain["out"].grad_norm, rel=1e-4)
    for ref in (*plain["ref"], *fsdp["ref"]):  # the reference stays the base model
        assert (ref - plain["ref"][0]).abs().max() <= 1e-5
    assert (fsdp["logprobs"] - plain["logprobs"]).abs().max() <= 1e-4
    assert (fsdp["logprobs"] - plain["ref"][0]).abs().max() > 1e-3
    a, b = fsdp["checksums"]  # every rank fingerprints the same merged weights
    assert a == b and a == pytest.approx(plain["checksums"][0], rel=1e-6)
    from posttrain.weights.refit import unpack

    merged = {}
    for bucket in fsdp["merged"]:
        import ray

        merged.update((n, t.clone()) for n, t in unpack([ray.get(bucket).to_packed()]))
    assert "model.layers.0.self_attn.q_proj.weight" in merged and not any("lora" in n for n in merged)
