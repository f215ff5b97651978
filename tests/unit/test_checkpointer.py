import pytest

from posttrain.checkpoint import Checkpointer, resolve_resume


def _write(tmp):
    (tmp / "weights.bin").write_bytes(b"x")


def test_keeps_last_k_and_latest(tmp_path):
    ckpt = Checkpointer(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        ckpt.save(step, _write)
    assert [p.name for p in ckpt.complete()] == ["step_000002", "step_000003"]
    assert ckpt.latest().name == "step_000003"
    assert resolve_resume("auto", ckpt) == ckpt.latest()
    assert resolve_resume("none", ckpt) is None


def test_interrupted_save_leaves_nothing_a_resume_would_pick(tmp_path):
    ckpt = Checkpointer(tmp_path, keep_last=3)
    ckpt.save(1, _write)

    def interrupted(tmp):
        _write(tmp)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ckpt.save(2, interrupted)
    assert ckpt.latest().name == "step_000001"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001"]


def test_killed_save_leftovers_are_ignored_and_removed(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, _write)
    (tmp_path / ".tmp-step_000002-abcd").mkdir()  # a process killed mid-write
    (tmp_path / "step_000003").mkdir()  # renamed by hand, never marked complete
    assert ckpt.latest().name == "step_000001"
    removed = ckpt.remove_partial()
    assert len(removed) == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["step_000001"]


def test_explicit_resume_path_must_be_complete(tmp_path):
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        resolve_resume(str(tmp_path / "nope"), ckpt)
