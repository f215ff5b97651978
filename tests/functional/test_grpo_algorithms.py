"""GRPO runs on a tiny random model exercising the algorithm knobs end to end: zero-variance
groups, dynamic sampling that runs short, the KL as a reward, and the engine-mismatch metrics
from π_old in later minibatches."""

import pytest
import torch

from posttrain.algorithms.rl_loss import grpo_loss
from posttrain.config.common import OptimizerConfig, PolicyConfig, SchedulerConfig
from posttrain.data.trajectory import Trajectory
from posttrain.distributed.actor import ActorPolicy
from posttrain.generation.sampling import SamplingParams
from posttrain.rollout.rollout import build_rl_batch
from posttrain.trainers.grpo import run_grpo


def _cfg(tiny_model_dir, run_dir, **extra):
    from conftest import grpo_test_config

    base = {"data.validation": "null", "grpo.val_at_start": False, "checkpoint.enabled": False}
    return grpo_test_config(tiny_model_dir, run_dir, **{**base, **extra})


def _train_rows(result):
    return [h for h in result.history if "dapo/generation_rounds" in h]


def test_equal_inexact_rewards_give_no_gradient(tiny_model_dir, tmp_path):
    # every sample scores 0.1: every group has no spread, every advantage is exactly 0, so the
    # loss and the gradient are exactly 0 (float32 rounding used to leave A = ±0.007 .. 0.1)
    cfg = _cfg(tiny_model_dir, tmp_path / "run", **{"environment.name": "constant_env:ConstantEnvironment",
                                                     "grpo.max_steps": 1})  # fmt: skip
    [row] = _train_rows(run_grpo(cfg))
    assert row["reward/mean"] == pytest.approx(0.1)
    assert row["pg_loss"] == 0.0 and row["grad_norm"] == 0.0


def test_dynamic_sampling_short_batch_trains_on_what_was_kept(tiny_model_dir, tmp_path):
    # 2 groups wanted, 1 round allowed, exactly one group per round has rewards that differ:
    # the step trains on that one group instead of raising
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "run",
        **{
            "environment.name": "constant_env:OneGroupVariesEnvironment",
            "dapo.dynamic_sampling": True,
            "dapo.max_generation_rounds": 1,
        },
    )
    result = run_grpo(cfg)
    rows = _train_rows(result)
    assert result.step == 2 and len(rows) == 2
    for row in rows:
        assert row["dapo/short_batch"] == 1 and row["dapo/kept_groups"] == 1
        assert row["dapo/skipped_update"] == 0
        assert row["grad_norm"] > 0 and row["reward/mean"] == pytest.approx(0.5)


def test_dynamic_sampling_with_nothing_kept_skips_the_update(tiny_model_dir, tmp_path):
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "run",
        **{
            "environment.name": "constant_env:ConstantEnvironment",
            "dapo.dynamic_sampling": True,
            "dapo.max_generation_rounds": 2,
            "checkpoint.enabled": True,
        },
    )
    result = run_grpo(cfg)
    rows = _train_rows(result)
    assert result.step == 2 and len(rows) == 2 and result.last_checkpoint.name == "step_000002"
    for row in rows:
        assert row["dapo/skipped_update"] == 1 and row["dapo/kept_groups"] == 0
        assert row["dapo/generation_rounds"] == 2 and "pg_loss" not in row


@pytest.mark.parametrize("estimator", ["grpo", "reinforce_pp"])
def test_kl_in_reward_run(tiny_model_dir, tmp_path, estimator):
    # the reference logprobs are computed before the advantages; the loss only reports the KL.
    # Step 1: π_old = π_ref, no KL; step 2 after an update: a positive KL penalty
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / estimator,
        **{
            "environment.name": "constant_env:OneGroupVariesEnvironment",
            "advantage.estimator": estimator,
            "loss.kl_beta": 0.1,
            "loss.kl_in_reward": True,
            "grpo.updates_per_batch": 2,
            "grpo.max_steps": 2,
        },
    )
    rows = _train_rows(run_grpo(cfg))
    assert len(rows) == 2
    for row in rows:
        assert "kl" in row and row["timing/reference_logprobs"] > 0
    assert rows[0]["reward/kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert rows[1]["reward/kl_penalty"] > 1e-6


def test_mismatch_metrics_ignore_policy_drift_in_later_minibatches(tiny_model_dir, tokenizer):
    """Two minibatches of one rollout batch: the first update moves the policy (lr 1e-2); on the
    second, token_mult_prob_error still compares the engine with π_old (the sampling policy)."""
    cfg = PolicyConfig(
        train_micro_batch_size=8,
        optimizer=OptimizerConfig(lr=1e-2, max_grad_norm=None),
        scheduler=SchedulerConfig(name="constant"),
    )
    policy = ActorPolicy(
        cfg, model_path=str(tiny_model_dir), total_steps=2, tokenizer_path=str(tiny_model_dir)
    )
    prompts = [tokenizer(f"What is {i} + {i}?")["input_ids"] for i in range(4) for _ in range(2)]
    out = policy.generate(prompts, SamplingParams(max_new_tokens=12, seed=0), batch_size=8)
    trajectories = [
        Trajectory(p + ids, [0] * len(p) + [1] * len(ids), [0.0] * len(p) + lps, [], {}, group_id=i // 2)
        for i, (p, ids, lps) in enumerate(zip(prompts, out.token_ids, out.logprobs, strict=True))
    ]
    batch = build_rl_batch(trajectories, torch.tensor([1.0, -1.0] * 4), tokenizer.pad_token_id)
    batch.old_logprobs = policy.logprobs(batch)
    first, second = batch.chunks(2)

    def mult_error(lp, mb):
        mask = mb.loss_mask
        return float((torch.exp((lp - mb.generation_logprobs).abs()) * mask).sum() / mask.sum())

    def train(mb):
        tokens = float(mb.loss_mask.sum())
        return policy.train(mb, lambda lp, m, n: grpo_loss(lp, m, n, token_normalizer=tokens), tokens)

    train(first)
    drifted = policy.logprobs(second)
    assert mult_error(drifted, second) > 1.05  # the policy did move
    metrics = train(second).loss_metrics
    assert metrics["token_mult_prob_error"] == pytest.approx(
        mult_error(second.old_logprobs, second), rel=1e-5
    )
    assert metrics["token_mult_prob_error"] < 1.01
