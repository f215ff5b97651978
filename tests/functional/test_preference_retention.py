"""Keep-best retention and the wall-clock deadline wired into the DPO and RM trainers (tiny model, in-process)."""

import json

import pytest
from preference_helpers import preference_overrides, write_preference_jsonl

from posttrain.config import load_config
from posttrain.config.supervised import DPOConfig, RMConfig
from posttrain.trainers.dpo import run_dpo
from posttrain.trainers.rm import run_rm

RUNS = {"dpo": (DPOConfig, run_dpo), "rm": (RMConfig, run_rm)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_preference_jsonl(tmp_path_factory.mktemp("pref") / "train.jsonl", n=16)


def _cfg(algorithm, tiny_model_dir, data, run_dir, **extra):
    overrides = preference_overrides(tiny_model_dir, data, run_dir, algorithm, **extra)
    return load_config(RUNS[algorithm][0], None, overrides)


def test_dpo_keeps_best_val_loss_and_latest(tiny_model_dir, data, tmp_path):
    cfg = _cfg(
        "dpo",
        tiny_model_dir,
        data,
        tmp_path / "run",
        **{
            "dpo.max_steps": 6,
            "dpo.val_every": 1,
            "checkpoint.save_every": 1,
            "checkpoint.keep_last": 1,
            "checkpoint.keep_best": 2,
            "policy.optimizer.lr": 3e-2,  # large enough that validation loss goes up and down
        },
    )
    assert (cfg.checkpoint.metric, cfg.checkpoint.mode) == ("val/loss", "min")  # a name DPO logs
    result = run_dpo(cfg)
    val = {h["step"]: h["val/loss"] for h in result.history if "val/loss" in h}
    assert sorted(val) == list(range(7))
    best_two = sorted((loss, step) for step, loss in val.items() if step >= 1)[:2]
    expected = {step for _, step in best_two} | {6}
    kept = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    assert {int(p.name[5:]) for p in kept} == expected
    for p in kept:
        meta = json.loads((p / "COMPLETE").read_text())
        assert meta["metrics"]["val/loss"] == val[meta["step"]]


@pytest.mark.parametrize("algorithm", ["dpo", "rm"])
def test_deadline_saves_and_stops_then_resume_continues(algorithm, tiny_model_dir, data, tmp_path):
    run = RUNS[algorithm][1]
    steps = {f"{algorithm}.max_steps": 4, f"{algorithm}.val_every": 2}
    stopped = run(
        _cfg(algorithm, tiny_model_dir, data, tmp_path / "run", **steps, **{"checkpoint.deadline_s": 1e-6})
    )
    assert stopped.stopped_by_deadline and stopped.step == 0
    assert stopped.last_checkpoint.name == "step_000000"
    assert json.loads((stopped.last_checkpoint / "COMPLETE").read_text())["step"] == 0
    resumed = run(_cfg(algorithm, tiny_model_dir, data, tmp_path / "run", **steps))
    assert not resumed.stopped_by_deadline and resumed.step == 4
    assert [h["step"] for h in resumed.history if "loss" in h] == [1, 2, 3, 4]
    assert resumed.last_checkpoint.name == "step_000004"
