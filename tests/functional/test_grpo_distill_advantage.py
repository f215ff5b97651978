"""GRPO with advantage.estimator=on_policy_distill on tiny random models: the advantage of every
generated token is the teacher's log-probability of it (checked against a plain full forward of the
teacher model) minus the sampler's, and whole runs work with the teacher colocated or split."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import grpo_test_config, make_tiny_model_dir

from posttrain.models.policy import load_causal_lm
from posttrain.trainers.grpo import GRPOTrainer, run_grpo


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tokenizer):
    return make_tiny_model_dir(
        tmp_path_factory.mktemp("opd_teacher"), tokenizer, seed=1, initializer_range=0.5
    )


def _cfg(model_dir, teacher, run_dir, **extra):
    return grpo_test_config(
        model_dir,
        run_dir,
        **{"advantage.estimator": "on_policy_distill", "teacher.model_name": str(teacher), **extra},
    )


def _reference_token_logprobs(
    model_dir, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """[B, T] log softmax(logits)[t-1] gathered at token t (0 at t = 0), one unpacked forward."""
    model = load_causal_lm(str(model_dir), torch.float64).eval()
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros(len(input_ids), 1, dtype=logprobs.dtype), logprobs], dim=1)


def test_advantages_are_teacher_minus_sampler_logprobs(tiny_model_dir, teacher_dir, tmp_path):
    trainer = GRPOTrainer(_cfg(tiny_model_dir, teacher_dir, tmp_path / "run"))
    try:
        rollouts, _ = trainer.collect(0)
        batch, metrics = trainer.make_batch(rollouts)
    finally:
        trainer.runtime.shutdown()
    mask = batch.loss_mask.bool()
    assert mask.sum() > 0 and batch.advantages.shape == mask.shape
    teacher = _reference_token_logprobs(teacher_dir, batch.input_ids, batch.attention_mask)
    expected = torch.where(mask, teacher - batch.generation_logprobs.double(), torch.zeros_like(teacher))
    # fp32 teacher forward (packed) against a float64 one: a few ulps of log-probabilities near -11
    assert torch.allclose(batch.advantages.double(), expected, atol=1e-4, rtol=0)
    assert (batch.advantages[~mask] == 0).all()
    assert metrics["distill/reverse_kl"] == pytest.approx(float(-expected[mask].mean()), abs=1e-4)


def test_teacher_equal_to_the_policy_gives_no_signal(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(_cfg(tiny_model_dir, tiny_model_dir, tmp_path / "run"))
    try:
        rollouts, _ = trainer.collect(0)
        batch, metrics = trainer.make_batch(rollouts)
    finally:
        trainer.runtime.shutdown()
    # the sampler and the teacher run the same weights: only fp32 rounding separates them
    assert batch.advantages.abs().max() < 1e-4
    assert abs(metrics["distill/reverse_kl"]) < 1e-5


@pytest.mark.parametrize("placement", ["colocated", "split"])
def test_two_steps_end_to_end(tiny_model_dir, teacher_dir, tmp_path, placement):
    cfg = _cfg(
        tiny_model_dir,
        teacher_dir,
        tmp_path / "run",
        **{"teacher.placement": placement, "advantage.distill_reward_weight": 0.5},
    )
    result = run_grpo(cfg)
    assert result.step == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if "distill/reverse_kl" in row]
    assert len(trained) == 2
    assert all(row["distill/teacher_logprob"] < 0 for row in trained)
    assert all(row["timing/teacher"] >= 0 for row in trained)
