"""policy.dtype=bfloat16 computes in bf16 over fp32 master weights and fp32 AdamW state (issue 12, item 3).

With bf16 master weights an update of lr 1e-6 is below half a bf16 ulp of almost every weight
(|w| ~ 0.02 has an ulp of 1.2e-4), so the weights never move. fp32 keeps the updates.
"""

from __future__ import annotations

import json

import torch
from conftest import write_sft_jsonl

from posttrain.checkpoint import Checkpointer
from posttrain.checkpoint.export import export_checkpoint
from posttrain.config.common import DatasetConfig, OptimizerConfig, PolicyConfig, SchedulerConfig
from posttrain.config.rollout import GenerationConfig, VLLMConfig
from posttrain.data.batching import collate
from posttrain.data.sft import build_sft_dataset
from posttrain.models.policy import Policy
from posttrain.trainers.sft import sft_loss


def _cfg(dtype: str = "bfloat16", lr: float = 1e-6) -> PolicyConfig:
    return PolicyConfig(
        dtype=dtype,
        train_micro_batch_size=4,
        optimizer=OptimizerConfig(lr=lr),
        scheduler=SchedulerConfig(name="constant"),
    )


def _batch(tmp_path, tokenizer):
    path = write_sft_jsonl(tmp_path / "d.jsonl", n=8)
    return collate(build_sft_dataset(DatasetConfig(path=str(path)), tokenizer, max_seq_len=128).examples)


def test_bf16_run_moves_its_weights_at_lr_1e_6(tiny_model_dir, tokenizer, tmp_path):
    policy = Policy(_cfg(), model_path=str(tiny_model_dir), total_steps=10)
    batch = _batch(tmp_path, tokenizer)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    policy.train(batch, sft_loss, normalizer=batch.num_target_tokens)
    compute = []  # from the second step on (the first runs a once-per-model probe in the weights' dtype)
    hook = policy.model.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda module, args, out: compute.append(out.dtype)
    )
    for _ in range(2):
        policy.train(batch, sft_loss, normalizer=batch.num_target_tokens)
    hook.remove()

    changed = sum(int((p.detach() != before[n]).sum()) for n, p in policy.model.named_parameters())
    total = sum(p.numel() for p in policy.model.parameters())
    assert changed / total > 0.9, f"only {changed / total:.1%} of the weights moved"
    assert set(compute) == {torch.bfloat16}, "forward passes compute in bf16"
    for name, p in policy.model.named_parameters():
        assert p.dtype == torch.float32, f"{name}: master weights are fp32"
    for state in policy.optimizer.state.values():
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32


def test_bf16_logprobs_reference_and_generation_compute_alike(tiny_model_dir, tokenizer):
    """The reference computes like the policy (KL 0 before any update), logprobs run in bf16 (they differ
    from fp32's) and colocated HF generation samples with the same bf16 numerics as training scores."""
    from posttrain.data.trajectory import Trajectory
    from posttrain.distributed.actor import ActorPolicy
    from posttrain.generation.sampling import SamplingParams
    from posttrain.rollout.rollout import build_rl_batch

    def actor(dtype: str) -> ActorPolicy:
        return ActorPolicy(
            _cfg(dtype),
            model_path=str(tiny_model_dir),
            total_steps=1,
            tokenizer_path=str(tiny_model_dir),
            reference=True,
        )

    bf16 = actor("bfloat16")
    assert next(bf16.reference.parameters()).dtype == torch.float32
    prompts = [tokenizer(f"Count to {i}:")["input_ids"] for i in range(4)]
    out = bf16.generate(prompts, SamplingParams(max_new_tokens=12, seed=0), batch_size=4)
    trajectories = [
        Trajectory(p + ids, [0] * len(p) + [1] * len(ids), [0.0] * len(p) + lps, [], {}, group_id=i)
        for i, (p, ids, lps) in enumerate(zip(prompts, out.token_ids, out.logprobs, strict=True))
    ]
    batch = build_rl_batch(trajectories, torch.zeros(4), tokenizer.pad_token_id)
    mask = batch.loss_mask.bool()
    train = bf16.logprobs(batch)
    assert torch.equal(bf16.reference_logprobs(batch), train)
    fp32 = actor("float32").logprobs(batch)
    assert (train - fp32)[mask].abs().max() > 1e-4, "bf16 compute differs from fp32"
    error = (train - batch.generation_logprobs)[mask].abs().exp().mean()
    assert error < 1.01, f"generation and training disagree: token_mult_prob_error {error:.4f}"


def test_bf16_refit_checkpoint_and_export(tiny_model_dir, tokenizer, tmp_path):
    """Generators get bf16 weights (refits cast the fp32 masters: checksums of the cast weights agree);
    checkpoints keep fp32 masters and say so; export writes the compute dtype by default."""
    from posttrain.distributed.actor import ActorPolicy
    from posttrain.distributed.actor_group import GenerationGroup
    from posttrain.generation.worker import GenerationWorker, refit_cast_dtype

    cfg = _cfg(lr=1e-3)
    assert refit_cast_dtype(GenerationConfig(), cfg) == "bfloat16"
    assert refit_cast_dtype(GenerationConfig(backend="vllm"), cfg) == "bfloat16"
    assert refit_cast_dtype(GenerationConfig(), _cfg("float32")) is None
    bf16_engine = GenerationConfig(backend="vllm", vllm=VLLMConfig(dtype="bfloat16"))
    assert refit_cast_dtype(bf16_engine, _cfg("float32")) == "bfloat16"
    cast = GenerationGroup.wire_dtype_of(GenerationConfig(placement="split"), cfg)
    assert cast == torch.bfloat16

    policy = ActorPolicy(
        cfg, model_path=str(tiny_model_dir), total_steps=2, tokenizer_path=str(tiny_model_dir)
    )
    worker = GenerationWorker(cfg, model_path=str(tiny_model_dir), tokenizer_path=str(tiny_model_dir))
    assert next(worker.model.parameters()).dtype == torch.bfloat16
    batch = _batch(tmp_path, tokenizer)
    policy.train(batch, sft_loss, normalizer=batch.num_target_tokens)
    buckets = policy.packed_weights(cast)
    assert {b.buffer.dtype for b in buckets} == {torch.bfloat16}
    worker.load_weights(buckets)
    assert worker.parameters_checksum() == policy.parameters_checksum("bfloat16")
    assert worker.parameters_checksum() != policy.parameters_checksum()

    checkpoint = Checkpointer(tmp_path / "run" / "checkpoints").save(
        1, lambda d: (policy.save_checkpoint(d), tokenizer.save_pretrained(d / "model"))
    )
    fmt = json.loads((checkpoint / "format.json").read_text())
    assert fmt["master_dtype"] == "float32" and fmt["compute_dtype"] == "bfloat16"
    from safetensors.torch import load_file

    saved = load_file(checkpoint / "model" / "model.safetensors")
    assert {t.dtype for t in saved.values()} == {torch.float32}
    resumed = Policy(cfg, model_path=str(tiny_model_dir), total_steps=2)
    resumed.load_checkpoint(str(checkpoint))
    assert resumed.parameters_checksum() == policy.parameters_checksum()  # exact: fp32 masters

    from transformers import AutoModelForCausalLM

    export_checkpoint(checkpoint, tmp_path / "hf")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf").dtype == torch.bfloat16
    export_checkpoint(checkpoint, tmp_path / "hf32", dtype="float32")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf32").dtype == torch.float32
