"""Checkpoint retention (keep_last + keep_best by a metric) and the wall-clock deadline."""

import json

import pytest

from posttrain.checkpoint import Checkpointer, CheckpointInfo, Deadline, select_retained


def _write(tmp):
    (tmp / "weights.bin").write_bytes(b"x")


def _infos(scores):
    return [CheckpointInfo(step, score) for step, score in scores.items()]


def test_select_retained_max_keeps_best_two_plus_latest():
    infos = _infos({10: 0.2, 20: 0.7, 30: 0.5, 40: 0.9, 50: 0.1})
    # best two by max: 40 (0.9), 20 (0.7); latest: 50
    assert select_retained(infos, keep_last=1, keep_best=2, mode="max") == {20, 40, 50}


def test_select_retained_min_mode():
    infos = _infos({10: 2.0, 20: 1.5, 30: 1.7, 40: 1.9})
    assert select_retained(infos, keep_last=1, keep_best=1, mode="min") == {20, 40}
    assert select_retained(infos, keep_last=2, keep_best=2, mode="min") == {20, 30, 40}


def test_select_retained_ties_prefer_later_step_and_unscored_never_best():
    infos = _infos({10: 0.5, 20: 0.5, 30: None, 40: float("nan"), 50: 0.1})
    assert select_retained(infos, keep_last=1, keep_best=1, mode="max") == {20, 50}
    # only two checkpoints are scored usefully above 0.1; unscored ones are kept only as "last"
    assert select_retained(infos, keep_last=0, keep_best=5, mode="max") == {10, 20, 50}


def test_select_retained_keep_best_zero_is_plain_keep_last():
    infos = _infos({1: 0.9, 2: 0.1, 3: 0.5})
    assert select_retained(infos, keep_last=2, keep_best=0) == {2, 3}
    with pytest.raises(ValueError, match="mode"):
        select_retained(infos, keep_last=1, mode="best")


def test_checkpointer_keeps_exactly_top_k_and_latest_on_disk(tmp_path):
    ckpt = Checkpointer(tmp_path, keep_last=1, keep_best=2, metric="val/accuracy", mode="max")
    accuracy = {1: 0.25, 2: 0.75, 3: 0.5, 4: 0.875, 5: 0.125, 6: 0.5}
    kept_after = {}
    for step, acc in accuracy.items():
        ckpt.save(step, _write, metrics={"val/accuracy": acc, "loss": 1.0 / step})
        kept_after[step] = [p.name for p in ckpt.complete()]
    # after step 3: best two are 2 (0.75) and 3 (0.5), latest is 3 -> {2, 3}
    assert kept_after[3] == ["step_000002", "step_000003"]
    # final: best two are 4 (0.875) and 2 (0.75); latest 6
    assert kept_after[6] == ["step_000002", "step_000004", "step_000006"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000002", "step_000004", "step_000006"]
    # pruning as we go ends where one global selection over all six would
    everything = [CheckpointInfo(step, acc) for step, acc in accuracy.items()]
    assert select_retained(everything, keep_last=1, keep_best=2, mode="max") == {2, 4, 6}
    assert ckpt.best().name == "step_000004"
    assert ckpt.latest().name == "step_000006"
    meta = json.loads((tmp_path / "step_000004" / "COMPLETE").read_text())
    assert meta == {"step": 4, "metrics": {"val/accuracy": 0.875, "loss": 0.25}}


def test_checkpointer_min_mode_and_unscored_checkpoints(tmp_path):
    ckpt = Checkpointer(tmp_path, keep_last=2, keep_best=1, metric="val/loss", mode="min")
    ckpt.save(1, _write)  # no metrics yet: unscored
    ckpt.save(2, _write, metrics={"val/loss": 3.0})
    ckpt.save(3, _write, metrics={"val/loss": 1.0})
    ckpt.save(4, _write, metrics={"val/loss": 2.0})
    ckpt.save(5, _write, metrics={"val/loss": 2.5})
    assert [p.name for p in ckpt.complete()] == ["step_000003", "step_000004", "step_000005"]


def test_keep_best_needs_a_metric(tmp_path):
    with pytest.raises(ValueError, match="metric"):
        Checkpointer(tmp_path, keep_best=1)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_deadline_stops_when_next_step_and_save_would_not_fit():
    clock = FakeClock()
    deadline = Deadline(60.0, clock=clock)
    assert not deadline.should_stop()
    clock.now += 30.0
    deadline.record_step(10.0)
    deadline.record_save(5.0)
    assert not deadline.should_stop()  # 30 + 10 + 5 = 45 <= 60
    clock.now += 16.0
    assert deadline.should_stop()  # 46 + 10 + 5 = 61 > 60
    deadline.record_step(2.0)  # the longest step counts, not the last
    assert deadline.longest_step == 10.0
    assert not Deadline(None, clock=clock).should_stop()
