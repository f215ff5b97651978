"""LoRA (peft) on the tiny random Llama: the step-0 model is the base model, merged weights compute what
the adapters compute, only the adapters train, the reference is the base with adapters off, checkpoints
hold the adapter and resume bit-exactly, export loads in peft and transformers, refits make generators
run the merged weights (the gate passes after a refit and fails on a skipped one), and short runs."""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("peft")

from posttrain.config.schema import (  # noqa: E402
    ClusterConfig,
    GenerationConfig,
    LoraConfig,
    OptimizerConfig,
    PolicyConfig,
    RefitCheckConfig,
    SchedulerConfig,
)
from posttrain.data.batching import TokenBatch  # noqa: E402
from posttrain.models.actor import ActorPolicy  # noqa: E402
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
    loss = -(logprobs * batch.loss_mask).sum() / normalizer
    return loss, {"loss": float(loss.detach())}


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
    from posttrain.models.policy import CheckpointMismatchError

    _actor(tiny_model_dir).save_checkpoint(str(tmp_path / "ckpt"))
    other = _actor(tiny_model_dir, _cfg(LoraConfig(rank=RANK, target_modules=["q_proj"])))
    with pytest.raises(CheckpointMismatchError, match="policy.lora"):
        other.load_checkpoint(str(tmp_path / "ckpt"))


# ------------------------------------------------------------------ refit and the parity gate
@pytest.mark.parametrize("transport", ["object_store", "collective"])
def test_refit_makes_the_generator_run_the_merged_weights(tiny_model_dir, tokenizer, transport):
    from posttrain.distributed.actor_group import ActorGroup, GenerationGroup
    from posttrain.distributed.refit_check import RefitError, check_refit
    from posttrain.models.actor import GenerationWorker
    from posttrain.models.generation import SamplingParams

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
