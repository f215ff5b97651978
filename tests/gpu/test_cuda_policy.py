"""CUDA paths: bf16 training, generation/training logprob agreement on GPU, FSDP2. Skipped without CUDA."""

import os
import socket

import pytest
import torch

from posttrain.config.common import OptimizerConfig, PolicyConfig, SchedulerConfig

pytestmark = pytest.mark.gpu


def _cfg(**kw) -> PolicyConfig:
    return PolicyConfig(
        train_micro_batch_size=4,
        optimizer=OptimizerConfig(lr=1e-3),
        scheduler=SchedulerConfig(name="constant"),
        **kw,
    )


def _batch(tokenizer):
    from posttrain.data.batching import collate
    from posttrain.data.tokenize import tokenize_conversation

    examples = [
        tokenize_conversation(
            tokenizer,
            [{"role": "user", "content": f"{i} + {i}?"}, {"role": "assistant", "content": f"{2 * i}"}],
        )
        for i in range(8)
    ]
    return collate(examples)


def test_bf16_training_step_on_cuda_lowers_the_loss(tiny_model_dir, tokenizer):
    from posttrain.models.policy import Policy
    from posttrain.trainers.sft import sft_loss

    policy = Policy(_cfg(dtype="bfloat16"), model_path=str(tiny_model_dir), total_steps=10, gpus=1)
    assert next(policy.model.parameters()).device.type == "cuda"
    batch = _batch(tokenizer)
    losses = [policy.train(batch, sft_loss, batch.num_target_tokens).loss_metrics["loss"] for _ in range(5)]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_cuda_generation_logprobs_match_training(tiny_model_dir, tokenizer):
    from posttrain.data.trajectory import Trajectory
    from posttrain.distributed.actor import ActorPolicy
    from posttrain.generation.sampling import SamplingParams
    from posttrain.rollout.rollout import build_rl_batch

    policy = ActorPolicy(
        _cfg(), model_path=str(tiny_model_dir), total_steps=1, tokenizer_path=str(tiny_model_dir), gpus=1
    )
    prompts = [tokenizer(f"Count to {i}:")["input_ids"] for i in range(8)]
    out = policy.generate(prompts, SamplingParams(max_new_tokens=16, seed=0), batch_size=8)
    trajectories = [
        Trajectory(p + ids, [0] * len(p) + [1] * len(ids), [0.0] * len(p) + lps, [], {}, group_id=i)
        for i, (p, ids, lps) in enumerate(zip(prompts, out.token_ids, out.logprobs, strict=True))
    ]
    batch = build_rl_batch(trajectories, torch.zeros(8), tokenizer.pad_token_id)
    train_lp = policy.logprobs(batch)
    mask = batch.loss_mask
    error = float((torch.exp((train_lp - batch.generation_logprobs).abs()) * mask).sum() / mask.sum())
    assert error <= 1.01


def test_fsdp2_single_rank_trains_and_checkpoints(tiny_model_dir, tokenizer, tmp_path):
    import torch.distributed as dist

    from posttrain.models.policy import Policy
    from posttrain.trainers.sft import sft_loss

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    policy = Policy(_cfg(dtype="bfloat16", fsdp=True), model_path=str(tiny_model_dir), total_steps=10, gpus=1)
    try:
        policy.init_distributed("127.0.0.1", port)
        batch = _batch(tokenizer)
        first = policy.train(batch, sft_loss, batch.num_target_tokens).loss_metrics["loss"]
        for _ in range(3):
            last = policy.train(batch, sft_loss, batch.num_target_tokens).loss_metrics["loss"]
        assert last < first
        policy.save_checkpoint(str(tmp_path))
        assert (tmp_path / "model" / "model.safetensors").is_file()
        policy.load_checkpoint(str(tmp_path))
    finally:
        dist.destroy_process_group()
