"""Each logger sink writes what it should: JSONL, TensorBoard events, a W&B offline run, an MLflow file store."""

import json
import math

import pytest

from posttrain.config.common import LoggingConfig
from posttrain.config.supervised import SFTConfig
from posttrain.logging.loggers import MetricsLogger, flatten, mlflow_key
from posttrain.logging.plots import plot_run

STEPS = [
    {"loss": 2.0, "val/pass@4": 0.25, "timing/generation": 1.0, "timing/training": 2.0, "timing/step": 3.0},
    {"loss": 1.5, "val/pass@4": 0.5, "timing/generation": 1.2, "timing/training": 1.8, "timing/step": 3.0},
    {
        "loss": 1.0,
        "grad_norm": float("nan"),
        "timing/generation": 0.9,
        "timing/training": 2.1,
        "timing/step": 3.0,
    },
]


def _log_run(cfg: LoggingConfig, run_dir) -> SFTConfig:
    config = SFTConfig()
    logger = MetricsLogger(cfg, run_dir, total_steps=3, config=config)
    for step, metrics in enumerate(STEPS, start=1):
        logger.log(step, metrics)
    logger.close()
    return config


def test_jsonl_and_system_metrics(tmp_path):
    _log_run(LoggingConfig(tensorboard=False, progress=False), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["loss"] for r in rows] == [2.0, 1.5, 1.0]
    assert math.isnan(rows[2]["grad_norm"])
    for r in rows:
        assert 0.0 <= r["system/cpu_percent"] <= 100.0 * 64
        assert r["system/cpu_memory_used_gib"] > 0 and r["system/process_rss_gib"] > 0.01


def test_tensorboard_scalars_and_hparams(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_run(LoggingConfig(jsonl=False, progress=False, system_metrics=False), tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 2.0), (2, 1.5), (3, 1.0)]
    assert "grad_norm" not in events.Tags()["scalars"]  # NaN is skipped
    assert "config/text_summary" in events.Tags()["tensors"]


def test_a_resumed_run_purges_the_tensorboard_steps_after_its_checkpoint(tmp_path):
    """Steps 1-3 logged, then the run crashed and resumed from its step-1 checkpoint: TensorBoard
    shows step 1 of the first run and steps 2-3 of the resumed one, not the first run's later points."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = LoggingConfig(jsonl=False, progress=False, system_metrics=False)
    _log_run(cfg, tmp_path)
    resumed = MetricsLogger(cfg, tmp_path, total_steps=3, start_step=1)
    resumed.log(2, {"loss": 0.7})
    resumed.log(3, {"loss": 0.6})
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [
        (1, 2.0),
        (2, pytest.approx(0.7)),
        (3, pytest.approx(0.6)),
    ]


def _wandb_records(path):
    """Records of an offline run's .wandb file: a 7-byte W&B header, then LevelDB-log framed protobufs."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, buffer = path.read_bytes(), 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768  # records never straddle a block header
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        buffer = chunk if kind in (1, 2) else buffer + chunk  # FULL/FIRST start, MIDDLE/LAST continue
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buffer)
            yield record


def _wait_for_exit_record(path, timeout_s=60.0):
    """wandb-core writes the offline log asynchronously; run.finish() can return before it is flushed."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        records = list(_wandb_records(path))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def test_wandb_offline_run_directory(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = LoggingConfig(jsonl=False, tensorboard=False, progress=False, system_metrics=False)
    cfg.wandb.enabled, cfg.wandb.mode, cfg.wandb.project = True, "offline", "posttrain-test"
    config = _log_run(cfg, tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    (log,) = runs[0].glob("run-*.wandb")  # the transaction log that `wandb sync` uploads
    records = _wait_for_exit_record(log)
    history = [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    assert [(h["_step"], h["loss"]) for h in history] == [(1, 2.0), (2, 1.5), (3, 1.0)]
    assert [h.get("val/pass@4") for h in history] == [0.25, 0.5, None]
    logged = {
        i.key: json.loads(i.value_json)
        for r in records
        if r.WhichOneof("record_type") == "config"
        for i in r.config.update
    }
    assert logged["policy"]["optimizer"]["lr"] == config.policy.optimizer.lr
    assert any(r.WhichOneof("record_type") == "exit" for r in records)  # finished cleanly


def test_mlflow_file_store(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    cfg = LoggingConfig(jsonl=False, tensorboard=False, progress=False, system_metrics=False)
    cfg.mlflow.enabled, cfg.mlflow.experiment = True, "posttrain-test"
    config = _log_run(cfg, tmp_path)
    assert (tmp_path / "mlruns").is_dir()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("posttrain-test")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == tmp_path.name
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.5), (3, 1.0)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "val/pass_at_4")] == [0.25, 0.5]
    assert run.data.params["policy.optimizer.lr"] == str(config.policy.optimizer.lr)
    assert "grad_norm" not in run.data.metrics  # NaN is skipped


def test_flatten_and_mlflow_key():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}}) == {"a.b": 1, "a.c.d": [1, 2], "e": {}}
    assert mlflow_key("val/pass@4") == "val/pass_at_4"
    assert mlflow_key("timing/step (s)") == "timing/step _s_"


def test_end_of_run_plots(tmp_path):
    _log_run(LoggingConfig(tensorboard=False, progress=False, system_metrics=False), tmp_path)
    written = plot_run(tmp_path, ["loss", "val/pass@4", "kl"])
    names = sorted(p.name for p in written)
    assert names == ["loss.png", "summary.png", "timing_breakdown.png", "val_pass@4.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000
