"""`posttrain doctor --smoke`: one real GRPO step on a tiny random model in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from posttrain.doctor import smoke_check


def test_smoke_runs_one_grpo_step(smollm_dir) -> None:
    c = smoke_check()
    assert c.status == "ok", c.detail
    assert "reached step 1, entropy " in c.detail and "nan" not in c.detail


@pytest.mark.ray
def test_ray_check_reads_a_running_cluster(ray_cluster) -> None:
    """RAY_ADDRESS names the test cluster (3 logical CPUs, one node): doctor reports it and, for a
    2-node config, names what is missing."""
    import ray

    code = (
        "from posttrain.doctor import check_ray\n"
        "for nodes in (1, 2):\n"
        "    c = check_ray('ray', nodes, 0)\n"
        "    print(c.status, '|', c.detail, '|', c.fix)\n"
    )
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    one, two = proc.stdout.strip().splitlines()[-2:]
    assert one.startswith("ok | ") and "1 node(s), 3 CPUs, 0 GPUs" in one
    assert two.startswith("fail | ") and "the config asks for 2 node(s) x 0 GPU(s)" in two
