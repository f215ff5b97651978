"""A local Ray cluster that posttrain starts keeps Ray's token authentication without printing Ray's
"Token authentication is enabled" warning on every run (RAY_AUTH_MODE=token, chosen explicitly)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

START = """
import ray
from posttrain.config.common import ClusterConfig
from posttrain.distributed.workers import init_ray
from ray._raylet import AuthenticationMode, get_authentication_mode

init_ray(ClusterConfig())
print("token mode:", get_authentication_mode() == AuthenticationMode.TOKEN)
ray.shutdown()
"""


@pytest.mark.ray
def test_local_ray_start_prints_no_token_auth_warning_and_keeps_token_auth(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    env["HOME"] = str(tmp_path)  # a fresh ~/.ray/auth_token, as on a new machine
    run = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True, env=env, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "token mode: True" in run.stdout
    assert "Token authentication" not in run.stderr, run.stderr
    assert "Started a local Ray instance" in run.stderr  # the stderr of Ray's start was captured
    assert (tmp_path / ".ray" / "auth_token").is_file()
