"""REINFORCE-MA on the tiny random model (local backend): the logged baseline follows
b <- m b + (1 - m) mean(r) from the logged rewards, the advantages use the baseline before the
batch, and a checkpoint holds b and a resumed run goes on from it."""

import json

import pytest

from posttrain.config import load_config
from posttrain.config.reinforce_ma import ReinforceMAConfig
from posttrain.trainers.reinforce_ma import STATE_FILE, run_reinforce_ma


def _cfg(model_dir, run_dir, **extra) -> ReinforceMAConfig:
    """2 steps of 4 prompts x 1 sample, 12 new tokens; reward = reply length / 100 (varies)."""
    overrides = {
        "policy.model_name": str(model_dir),
        "policy.max_seq_len": 96,
        "data.example_turns": "[]",  # the quickstart's worked example does not fit in 96 tokens
        "data.train.reasoning_gym.size": 32,
        "data.validation.reasoning_gym.size": 4,
        "reinforce_ma.max_steps": 2,
        "reinforce_ma.prompts_per_step": 4,
        "reinforce_ma.val_at_start": False,
        "reinforce_ma.baseline_momentum": 0.5,
        "generation.max_new_tokens": 12,
        "environment.name": "length_env:LengthEnvironment",
        "cluster.backend": "local",
        "logging.run_dir": str(run_dir),
        "logging.tensorboard": False,
        **extra,
    }
    return load_config(ReinforceMAConfig, None, [f"{k}={v}" for k, v in overrides.items()])


def test_two_steps_baseline_follows_the_formula_and_survives_a_resume(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path / "run", **{"loss.kl_beta": 0.1})
    first = run_reinforce_ma(cfg, stop_after=1)
    assert first.step == 1 and first.last_checkpoint.name == "step_000001"
    (row1,) = [h for h in first.history if "pg_loss" in h]
    r1 = row1["reward/mean"]
    assert r1 > 0 and row1["reinforce_ma/baseline"] == pytest.approx(r1, rel=1e-6)  # first batch: its mean
    assert row1["reinforce_ma/advantage_mean"] == pytest.approx(0.0, abs=1e-6)  # r - mean(r)
    saved = json.loads((first.last_checkpoint / STATE_FILE).read_text())["baseline"]
    assert saved == row1["reinforce_ma/baseline"]

    second = run_reinforce_ma(cfg)  # resumes from step 1: b = saved
    (row2,) = [h for h in second.history if "pg_loss" in h]
    assert row2["step"] == 2 and second.last_checkpoint.name == "step_000002"
    r2 = row2["reward/mean"]
    assert r2 != pytest.approx(saved, rel=1e-3)  # a fresh baseline (r2) would differ from the resumed one
    assert row2["reinforce_ma/advantage_mean"] == pytest.approx(r2 - saved, rel=1e-5, abs=1e-6)
    assert row2["reinforce_ma/baseline"] == pytest.approx(0.5 * saved + 0.5 * r2, rel=1e-6)
    assert (
        json.loads((second.last_checkpoint / STATE_FILE).read_text())["baseline"]
        == row2["reinforce_ma/baseline"]
    )
    assert "kl" in row2 and row2["grad_norm"] > 0
    assert [h["step"] for h in second.history if "val/accuracy" in h] == [2]
