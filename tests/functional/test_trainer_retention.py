"""Retention, deadline and end-of-run plots wired into the SFT trainer (tiny model, in-process)."""

import json

from conftest import sft_overrides, write_sft_jsonl

from posttrain.config import load_config
from posttrain.config.supervised import SFTConfig
from posttrain.trainers.sft import run_sft


def _cfg(tiny_model_dir, tmp_path, **extra) -> SFTConfig:
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=32)
    return load_config(SFTConfig, None, sft_overrides(tiny_model_dir, data, tmp_path / "run", **extra))


def test_sft_keeps_best_val_loss_and_latest(tiny_model_dir, tmp_path):
    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        **{
            "sft.max_steps": 6,
            "sft.val_every": 1,
            "checkpoint.save_every": 1,
            "checkpoint.keep_last": 1,
            "checkpoint.keep_best": 2,
            "policy.optimizer.lr": 3e-2,  # large enough that validation loss goes up and down
            "logging.plots": True,
        },
    )
    assert (cfg.checkpoint.metric, cfg.checkpoint.mode) == ("val/loss", "min")  # SFT's defaults
    result = run_sft(cfg)
    val = {h["step"]: h["val/loss"] for h in result.history if "val/loss" in h}
    best_two = sorted((loss, step) for step, loss in val.items() if step >= 1)[:2]
    expected = {step for _, step in best_two} | {6}
    kept = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    assert {int(p.name[5:]) for p in kept} == expected
    for p in kept:
        meta = json.loads((p / "COMPLETE").read_text())
        assert meta["metrics"]["val/loss"] == val[meta["step"]]
    assert (tmp_path / "run" / "plots" / "summary.png").is_file()
    assert (tmp_path / "run" / "plots" / "loss.png").is_file()


def test_sft_deadline_saves_and_stops_then_resumes(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path, **{"sft.max_steps": 4, "checkpoint.deadline_s": 1e-6})
    stopped = run_sft(cfg)
    assert stopped.stopped_by_deadline and stopped.step == 0
    assert stopped.last_checkpoint.name == "step_000000"
    resumed = run_sft(_cfg(tiny_model_dir, tmp_path, **{"sft.max_steps": 4}))
    assert not resumed.stopped_by_deadline and resumed.step == 4
    assert [h["step"] for h in resumed.history if "loss" in h] == [1, 2, 3, 4]
