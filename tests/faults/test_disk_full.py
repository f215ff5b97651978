"""A disk that fills during a checkpoint write: the run stops saying so, the previous checkpoint is
intact, and once there is space the same command resumes from it.

The checkpoint folder is a small tmpfs mounted in a private mount namespace (`unshare`, as root or
in a user namespace), so the real filesystem fills, not a simulation of it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import write_sft_jsonl
from fault_helpers import ENV, losses, sft_args

UNSHARE = ["unshare", "--user", "--map-root-user", "--mount"]


def _can_mount_tmpfs(tmp_path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    script = f"mount -t tmpfs -o size=1m tmpfs {probe} && mount -o remount,size=2m {probe}"
    return subprocess.run([*UNSHARE, "sh", "-c", script], capture_output=True).returncode == 0


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so(tiny_model_dir, tmp_path):
    if not _can_mount_tmpfs(tmp_path):
        pytest.skip("cannot mount a tmpfs in a private mount namespace here (unshare --user --mount)")
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=24)
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    command = shlex.join([sys.executable, "-m", "posttrain.cli", *sft_args(tiny_model_dir, data, run_dir)])
    # one checkpoint of the tiny model (fp32 weights + AdamW state) is ~38 MB: 50 MB hold one, not two
    script = f"""
        mount -t tmpfs -o size=50m tmpfs {checkpoints}
        {command} > {tmp_path}/out1 2>&1; echo $? > {tmp_path}/rc1
        ls -a {checkpoints} > {tmp_path}/ls1
        cp {run_dir}/metrics.jsonl {tmp_path}/metrics1.jsonl
        mount -o remount,size=200m {checkpoints}
        {command} > {tmp_path}/out2 2>&1; echo $? > {tmp_path}/rc2
        ls -a {checkpoints} > {tmp_path}/ls2
        for d in {checkpoints}/step_*; do [ -f "$d/COMPLETE" ] && echo "$d"; done > {tmp_path}/complete2
    """
    subprocess.run([*UNSHARE, "sh", "-c", script], check=True, timeout=600, env=ENV)
    read = lambda name: (tmp_path / name).read_text()  # noqa: E731

    first = read("out1")
    assert read("rc1").strip() == "2", first[-3000:]
    error = [line for line in first.splitlines() if line.startswith("error:")]
    assert error == [
        f"error: no space left on device to write checkpoint step_000002 under {checkpoints}; the partial "
        f"write was removed and the previous checkpoint {checkpoints / 'step_000001'} is intact. Free "
        "space there (or lower checkpoint.keep_last) and run the same command to resume."
    ], first[-3000:]
    assert read("ls1").split() == [".", "..", "step_000001"]

    second = read("out2")
    assert read("rc2").strip() == "0", second[-3000:]
    assert f"resumed from {checkpoints / 'step_000001'}" in second
    assert read("ls2").split() == [".", "..", "step_000002", "step_000003"]
    assert read("complete2").split() == [str(checkpoints / "step_000002"), str(checkpoints / "step_000003")]
    # nothing lost: step 2 is taken again from checkpoint 1 (to the same loss), then step 3; the first
    # attempt's row of step 2 is dropped on resume, so no step is logged twice
    first_rows = [json.loads(line) for line in read("metrics1.jsonl").splitlines()]
    first_step_2 = [row["loss"] for row in first_rows if row["step"] == 2 and "loss" in row]
    steps = losses(run_dir)
    assert [step for step, _ in steps] == [1, 2, 3]
    assert first_step_2 == [steps[1][1]]
