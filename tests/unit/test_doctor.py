"""`posttrain doctor`: the pure checks with numbers, the table on this machine, a missing vLLM."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.config import load_config
from posttrain.config.rl import GRPOConfig
from posttrain.doctor import (
    GIB,
    _shm_needed,
    check_cluster_size,
    check_cpu_bf16,
    check_disk,
    check_gpus,
    check_ray,
    check_shm,
    missing,
    run_checks,
)


def test_shm_too_small_for_the_weights_names_the_fix() -> None:
    # 1.5 GiB of weights, 1 GiB free: fails; the docker flag rounds up to 2 GiB and adds 1 -> 3g.
    c = check_shm(1 * GIB, 3 * GIB // 2)
    assert c.status == "fail" and c.needed
    assert "--shm-size=3g" in c.fix and "generation.refit_transport=object_store" in c.fix
    assert "1.0 GiB free" in c.detail and "need 1.5 GiB" in c.detail
    assert check_shm(3 * GIB // 2, 3 * GIB // 2).status == "ok"  # exactly enough is enough
    assert check_shm(1 * GIB, 3 * GIB // 2, needed=False).status == "warn"  # not this run's transport


def test_disk_and_gpus_with_numbers() -> None:
    assert check_disk(2 * GIB, 2 * GIB, "runs/x").status == "ok"
    low = check_disk(2 * GIB - 1, 2 * GIB, "runs/x")
    assert low.status == "fail" and "logging.run_dir" in low.fix
    assert check_gpus([], 0).status == "ok"
    two = check_gpus([("H100", 80 * GIB)], 2)
    assert two.status == "fail" and "cluster.gpus_per_node=2 but 1 GPU(s)" in two.fix
    assert "H100 80.0 GiB" in two.detail


def test_bf16_rollouts_are_suggested_where_the_cpu_has_bf16_matmuls() -> None:
    avx2, zen5, amx = {"avx2", "fma"}, {"avx2", "avx512f", "avx512_bf16"}, {"avx512_bf16", "amx_bf16"}
    hint = check_cpu_bf16(zen5, gpus=0, bf16_rollouts=False)
    assert (
        hint.status == "ok" and "avx512_bf16" in hint.detail and "generation.hf.dtype=bfloat16" in hint.detail
    )
    assert "amx_bf16, avx512_bf16" in check_cpu_bf16(amx, gpus=0, bf16_rollouts=True).detail
    assert check_cpu_bf16(avx2, gpus=0, bf16_rollouts=False).status == "ok"  # fp32: the right choice
    slow = check_cpu_bf16(avx2, gpus=0, bf16_rollouts=True)  # asked for bf16 where it does not pay
    assert slow.status == "warn" and not slow.needed and slow.fix == "generation.hf.dtype=auto"
    assert check_cpu_bf16(avx2, gpus=1, bf16_rollouts=True).status == "ok"  # a GPU run


def test_shared_memory_is_needed_only_by_that_transport() -> None:
    assert not _shm_needed(GRPOConfig())  # colocated: no refit at all
    split = ["generation.placement=split", "cluster.backend=local"]
    assert _shm_needed(load_config(GRPOConfig, None, split))  # auto on one CPU machine
    assert not _shm_needed(load_config(GRPOConfig, None, [*split, "generation.refit_transport=object_store"]))


def test_default_config_is_green_on_this_machine() -> None:
    checks = run_checks(GRPOConfig())
    assert [c.name for c in checks] == [
        "versions",
        "GPUs",
        "Ray",
        "vLLM",
        "bf16 on CPU",
        "/dev/shm",
        "/dev/shm leftovers",
        "disk",
        "sandbox",
        "model",
    ]
    # leftovers depend on what ran before (a fault test SIGKILLs workers): a warning, never needed
    assert [c for c in checks if c.status != "ok" and c.name != "/dev/shm leftovers"] == []
    assert missing(checks) == []


def _doctor(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`posttrain doctor` in a subprocess whose `import vllm` fails (sitecustomize hides it)."""
    hide = tmp_path / "hide_vllm"
    hide.mkdir(exist_ok=True)
    (hide / "sitecustomize.py").write_text('import sys\nsys.modules["vllm"] = None\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), *sys.path]), "COLUMNS": "250"}
    cmd = [sys.executable, "-m", "posttrain.cli", "doctor", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_config_that_needs_vllm_without_it_names_the_fix(tmp_path: Path) -> None:
    recipe = tmp_path / "vllm.yaml"
    recipe.write_text("generation:\n  backend: vllm\ncluster:\n  backend: local\n")
    proc = _doctor(tmp_path, "--config", str(recipe))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "pip install 'posttrain[vllm]'" in proc.stdout and "missing for this run: vLLM" in proc.stdout
    # the same machine passes a config that does not need vLLM
    hf = _doctor(tmp_path, "--config", str(recipe), "generation.backend=hf")
    assert hf.returncode == 0, hf.stdout + hf.stderr
    assert "not installed (not needed" in hf.stdout


def test_ray_cluster_size_against_the_config() -> None:
    assert check_cluster_size("h:6379", 2, 64, 16, num_nodes=2, gpus_per_node=8).status == "ok"
    short = check_cluster_size("h:6379", 2, 64, 15, num_nodes=2, gpus_per_node=8)  # a GPU is missing
    assert short.status == "fail" and "2 node(s) x 8 GPU(s)" in short.fix
    assert "h:6379: 2 node(s), 64 CPUs, 15 GPUs" == short.detail
    assert check_cluster_size("h:6379", 1, 8, 0, num_nodes=2, gpus_per_node=0).status == "fail"


def test_ray_without_a_cluster(monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert "a local cluster will be started" in check_ray("ray", 1, 0).detail
    two = check_ray("ray", 2, 0)  # several nodes need a running cluster
    assert two.status == "fail" and "set RAY_ADDRESS" in two.fix
    with socket.socket() as s:  # a port nothing listens on: fails at once, not after ray.init's retries
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    gone = check_ray("ray", 1, 0)
    assert gone.status == "fail" and f"nothing answers at RAY_ADDRESS=127.0.0.1:{port}" == gone.detail
    assert check_ray("local", 1, 0).status == "warn"  # reported, but a local-backend run does not need Ray


@pytest.mark.slow
def test_a_machine_with_a_tiny_dev_shm_names_the_fix(tmp_path: Path) -> None:
    """`posttrain doctor` under a real 1 MiB /dev/shm (a tmpfs mounted over it in a private mount
    namespace, as Docker's default 64 MB is for a bigger model): the shared-memory refit of a split
    run cannot fit the weights, so it fails naming the fix; a run that does not need it passes."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    probe = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            "mount -t tmpfs -o size=1m tmpfs /dev/shm",
        ],
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace: {probe.stderr.decode()[-200:]}")
    recipe = tmp_path / "split.yaml"
    recipe.write_text("generation:\n  placement: split\ncluster:\n  backend: local\n")
    doctor = [sys.executable, "-m", "posttrain.cli", "doctor", "--config", str(recipe)]
    script = "mount -t tmpfs -o size=1m tmpfs /dev/shm && exec " + " ".join(doctor) + ' "$@"'
    env = {**os.environ, "COLUMNS": "250"}

    def run(*overrides: str) -> subprocess.CompletedProcess:
        cmd = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", *overrides]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)

    small = run()
    assert small.returncode == 1, small.stdout + small.stderr
    assert "missing for this run: /dev/shm" in small.stdout
    assert "1.0 GiB free in /dev/shm" not in small.stdout and "0.0 GiB free in /dev/shm" in small.stdout
    assert "--shm-size=" in small.stdout and "generation.refit_transport=object_store" in small.stdout
    other = run("generation.refit_transport=object_store")
    assert other.returncode == 0, other.stdout + other.stderr


def test_stale_shared_files_are_those_of_dead_processes(tmp_path):
    """A run killed with SIGKILL leaves its /dev/shm weights behind: doctor lists the files whose pid
    is gone (with the rm to run) and leaves a live process's files alone."""
    import subprocess
    import sys

    from posttrain.doctor import check_stale_shm
    from posttrain.weights.refit import stale_shared_files

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)
    (tmp_path / f"posttrain-weights-{dead_pid}-abcd1234-float32").write_bytes(b"\0" * 64)
    (tmp_path / f"posttrain-snapshot-{os.getpid()}-abcd1234-float32").write_bytes(b"\0" * 64)
    (tmp_path / "unrelated-file").write_bytes(b"x")
    stale = stale_shared_files(str(tmp_path))
    assert stale == [str(tmp_path / f"posttrain-weights-{dead_pid}-abcd1234-float32")]
    check = check_stale_shm(stale)
    assert check.status == "warn" and check.fix == "rm " + stale[0] and not check.needed
    assert check_stale_shm([]).status == "ok"
