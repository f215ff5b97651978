"""Asynchronous GRPO on the tiny random model (local backend: generation in a thread, split worker):
age 0 gives the synchronous run's steps bit for bit; with age 1 stale data gets π_old recomputed
(never the on-policy shortcut) and the buffer survives a resume."""

import threading
import time

import pytest
import torch

from posttrain.errors import WorkerLostError
from posttrain.trainers.grpo import GRPOTrainer
from posttrain.trainers.rl.asynchronous import STATE_FILE


def _cfg(tiny_model_dir, run_dir, **extra):
    from conftest import grpo_test_config

    return grpo_test_config(
        tiny_model_dir,
        run_dir,
        **{
            "generation.placement": "split",
            "loss.importance_correction": "truncated",
            "grpo.max_steps": 3,
            "grpo.val_at_start": False,
            "grpo.val_every": 100,
            "logging.plots": False,
            "environment.name": "length_env:LengthEnvironment",
            "policy.optimizer.lr": 1e-3,
            **extra,
        },
    )


def _fit(cfg, **kwargs):
    trainer = GRPOTrainer(cfg)
    try:
        result = trainer.runtime.fit(**kwargs)
        return result, trainer.runtime.policy.state_dict()
    finally:
        trainer.runtime.shutdown()


def _train_rows(result):
    return [h for h in result.history if "pg_loss" in h]


def test_async_age_zero_is_bit_identical_to_sync(tiny_model_dir, tmp_path):
    common = {"checkpoint.enabled": False}
    sync, sync_weights = _fit(_cfg(tiny_model_dir, tmp_path / "sync", **common))
    run, async_weights = _fit(
        _cfg(
            tiny_model_dir,
            tmp_path / "async",
            **{"grpo.async_mode": True, "grpo.max_trajectory_age_steps": 0, **common},
        )
    )
    rows_sync, rows_async = _train_rows(sync), _train_rows(run)
    assert [r["step"] for r in rows_async] == [1, 2, 3]
    for a, b in zip(rows_sync, rows_async, strict=True):
        for key in ("reward/mean", "pg_loss", "grad_norm", "response_length", "importance_weight_mean"):
            assert a[key] == b[key], (a["step"], key)
        assert b["async/age_max"] == 0 and b["async/dropped_stale"] == 0
        assert "timing/old_logprobs" not in b  # exactly on-policy: the shortcut is right here
        # generator and trainer run the same weights: the importance weight is 1 up to fp32 rounding
        assert abs(b["importance_weight_mean"] - 1.0) < 1e-4 and b["is_oob_ratio"] == 0.0
    assert all(r["grad_norm"] > 0 for r in rows_async)
    assert sync_weights.keys() == async_weights.keys()
    for name, tensor in sync_weights.items():
        assert torch.equal(tensor, async_weights[name]), name
    assert run.history[-1]["val/reward"] == sync.history[-1]["val/reward"]


def test_async_age_one_recomputes_pi_old_and_resumes_with_the_buffer(tiny_model_dir, tmp_path):
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "run",
        **{"grpo.async_mode": True, "grpo.max_trajectory_age_steps": 1, "checkpoint.save_every": 1},
    )
    first, _ = _fit(cfg, stop_after=2)
    rows = _train_rows(first)
    assert [r["step"] for r in rows] == [1, 2]
    # batch 1 is generated with version 0 while the trainer trains step 1: one update old
    assert rows[0]["async/age_max"] == 0 and rows[1]["async/age_max"] == 1
    assert "timing/old_logprobs" not in rows[0]
    # exactly on-policy: the loss's token_mult_prob_error is the engine mismatch alone
    assert rows[0]["async/fresh_token_fraction"] == 1.0 and rows[0]["token_mult_prob_error"] >= 1.0
    assert "async/staleness_mult_prob_error" not in rows[0]
    for r in rows[1:]:
        assert r["timing/old_logprobs"] > 0  # π_old recomputed for data that is not exactly on-policy
        # every row one update old: the gap is staleness, reported apart, never as the engine mismatch
        assert r["async/fresh_token_fraction"] == 0.0 and "token_mult_prob_error" not in r
        assert r["async/staleness_mult_prob_error"] > 1.0 and r["async/staleness_kl"] > 0.0
        assert r["async/is_weight_min"] <= r["async/is_weight_mean"] <= r["async/is_weight_max"]
        assert r["async/is_weight_mean"] != 1.0  # an update apart: the weights moved
        assert 0.0 <= r["async/overlap_fraction"] <= 1.0 and r["async/buffer_fill"] <= 1.0
    saved = torch.load(first.last_checkpoint / STATE_FILE, weights_only=False)
    buffered = [(g["batch_index"], g["policy_version"]) for g in saved["buffer"]["groups"]]
    # the next batches, generated while steps 2 and 3 would train, none older than the age bound
    assert buffered and buffered[0][0] == 2 and all(v >= 1 for _, v in buffered)
    second, _ = _fit(cfg)
    resumed = _train_rows(second)
    assert [r["step"] for r in resumed] == [3]
    assert resumed[0]["async/first_batch"] == 2  # the buffered batch first, with its version
    assert resumed[0]["async/age_max"] == 2 - buffered[0][1]


@pytest.mark.ray
def test_async_on_ray_with_object_store_snapshots(ray_cluster, tiny_model_dir, tmp_path):
    """Generation actors produce while the policy actor trains; weights travel as packed buckets."""
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "run",
        **{
            "cluster.backend": "ray",
            "cluster.cpus_per_worker": 1,
            "environment.name": "math",  # Ray's workers cannot import the tests' length_env
            "generation.refit_transport": "object_store",
            "grpo.async_mode": True,
            "checkpoint.enabled": False,
        },
    )
    result, _ = _fit(cfg)
    rows = _train_rows(result)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["async/age_max"] for r in rows][:2] == [0, 1]
    assert all(r["async/age_max"] <= 1 and r["async/dropped_stale"] == 0 for r in rows)
    assert all("timing/old_logprobs" in r for r in rows if r["async/age_max"] > 0)


@pytest.mark.ray
def test_a_killed_generation_worker_stops_the_async_run(ray_cluster, tiny_model_dir, tmp_path):
    """The generation actor's process is killed after the first step; the run stops with the error
    that names the worker and the checkpoint to resume from (no hang: the collector hands the
    failure to the trainer, and the watchdog bounds any wait)."""
    import ray

    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "run",
        **{
            "cluster.backend": "ray",
            "cluster.cpus_per_worker": 1,
            "environment.name": "math",  # Ray's workers cannot import the tests' length_env
            "grpo.async_mode": True,
            "grpo.max_steps": 30,
            "grpo.async_watchdog_s": 120,
            "checkpoint.save_every": 1,
        },
    )
    trainer = GRPOTrainer(cfg)
    [actor] = trainer.runtime.generator.workers.actors

    def kill_after_first_step() -> None:
        while trainer.runtime.policy_version < 1:
            time.sleep(0.05)
        ray.kill(actor, no_restart=True)

    threading.Thread(target=kill_after_first_step, daemon=True).start()
    try:
        with pytest.raises(
            WorkerLostError, match=r"worker generation-0 died .*latest complete checkpoint: .*step_"
        ):
            trainer.runtime.fit()
        assert trainer.runtime.policy_version < 30
    finally:
        trainer.runtime.shutdown()
