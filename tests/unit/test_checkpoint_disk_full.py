"""Which failed saves count as a full disk, and what the user is told (the fault test fills a real
tmpfs: tests/faults/test_disk_full.py)."""

from __future__ import annotations

import errno

import pytest

from posttrain.checkpoint import Checkpointer
from posttrain.checkpoint.checkpointer import disk_full
from posttrain.distributed.workers import WorkerError
from posttrain.errors import DiskFullError


def test_errors_that_mean_no_space(tmp_path):
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path)
    # safetensors and a Ray worker's exception carry it in their text or their cause
    assert disk_full(
        RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"), tmp_path
    )
    assert disk_full(WorkerError("worker policy-0 failed", OSError(errno.ENOSPC, "full")), tmp_path)
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(errno.EFBIG, "File too large")
    assert disk_full(wrapped, tmp_path)
    # anything else, on a disk with room: a real error, not a full disk
    assert not disk_full(
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"), tmp_path
    )
    assert not disk_full(OSError(errno.EACCES, "Permission denied"), tmp_path)


def test_a_failed_save_that_is_not_a_full_disk_is_raised_as_is(tmp_path):
    checkpointer = Checkpointer(tmp_path / "checkpoints")
    checkpointer.save(1, lambda d: (d / "w").write_text("1"))

    def broken(directory):
        raise ValueError("a bug in the writer")

    with pytest.raises(ValueError, match="a bug in the writer"):
        checkpointer.save(2, broken)

    def full(directory):
        (directory / "w").write_text("partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskFullError) as error:
        checkpointer.save(3, full)
    assert f"the previous checkpoint {tmp_path / 'checkpoints' / 'step_000001'} is intact" in str(error.value)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]  # partial removed
