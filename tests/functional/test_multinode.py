"""A simulated cluster: two Ray nodes on this machine (`ray.cluster_utils.Cluster`, driven by
ray_nodes.py in its own process: the session's `ray_nodes` fixture) and the real command line
attached to it with RAY_ADDRESS.

The head node has no CPUs and each worker node one, so two 1-CPU workers can only run one per node:
the data-parallel policy ranks, or the policy and the generation worker, sit on different nodes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import sft_overrides, write_sft_jsonl
from safetensors.torch import load_file

pytestmark = pytest.mark.ray

HERE = Path(__file__).parent
ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0"}


def cli(args: list[str], *, address: str | None = None, **env: str) -> subprocess.CompletedProcess:
    extra = {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled"} if address else {}  # as Nodes.client_env
    return subprocess.run(
        [sys.executable, "-m", "posttrain.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**ENV, **extra, **env},
    )


def metric_rows(run_dir: Path, key: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [row for row in rows if key in row]


def sft_args(model_dir, data, run_dir, **extra) -> list[str]:
    settings = {"sft.max_steps": 2, "sft.val_every": 100, "sft.val_at_start": False, "logging.plots": False}
    return ["sft", *sft_overrides(model_dir, data, run_dir, **{**settings, **extra})]


def test_data_parallel_over_two_nodes_equals_one_worker(ray_nodes, tiny_model_dir, tmp_path):
    """Two policy ranks, one per node, train like one worker on the whole batch: the loss is
    normalised by the global token count and the gradients are all-reduced over gloo across the
    nodes. Only fp32 rounding separates them (each rank sums half the batch)."""
    ray_nodes.set("a=1 b=1")
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=16)
    two = cli(
        sft_args(
            tiny_model_dir,
            data,
            tmp_path / "two",
            **{"cluster.backend": "ray", "cluster.num_workers": 2, "cluster.cpus_per_worker": 1},
        ),
        address=ray_nodes.address,
    )
    assert two.returncode == 0, two.stderr[-4000:]
    assert "on 2 worker(s)" in two.stdout + two.stderr
    one = cli(sft_args(tiny_model_dir, data, tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-4000:]

    a, b = metric_rows(tmp_path / "two", "loss"), metric_rows(tmp_path / "one", "loss")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    for x, y in zip(a, b, strict=True):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-5)
        assert x["tokens"] == y["tokens"]
    weights = [
        load_file(tmp_path / run / "checkpoints" / "step_000002" / "model" / "model.safetensors")
        for run in ("two", "one")
    ]
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        # in norm: elementwise, AdamW's first steps (~lr * g / (|g| + eps)) amplify rounding where g ~ 0
        error = (weights[0][name] - weights[1][name]).norm() / weights[1][name].norm()
        assert error <= 1e-5, f"{name}: relative error {error:.2e}"
    assert not torch.equal(weights[1]["model.norm.weight"], torch.ones_like(weights[1]["model.norm.weight"]))


def test_refit_across_nodes(ray_nodes, tiny_model_dir, tmp_path):
    """The policy on one node, the generation worker on the other: after every update the new
    weights travel to the other node through Ray's object store (gloo across nodes: the data-parallel
    test above; the collective refit on one node: test_grpo.py), and the refit check
    (Σw, Σw² of both sides to 1e-9) passes every step. A reward that varies within a group makes
    every update change the weights."""
    ray_nodes.set("a=1 b=1")
    transport = "object_store"
    run_dir = tmp_path / "run"
    settings = {
        "policy.model_name": tiny_model_dir,
        "policy.max_seq_len": 96,
        "data.example_turns": "[]",  # the quickstart's worked example does not fit in 96 tokens
        "policy.optimizer.lr": 1e-3,
        "data.train.reasoning_gym.size": 16,
        "data.validation.reasoning_gym.size": 4,
        "environment.name": "constant_env:OneGroupVariesEnvironment",
        "grpo.max_steps": 2,
        "grpo.prompts_per_step": 2,
        "grpo.generations_per_prompt": 4,
        "grpo.val_every": 100,
        "grpo.val_at_start": False,
        "generation.max_new_tokens": 8,
        "generation.placement": "split",
        "generation.refit_transport": transport,
        "cluster.backend": "ray",
        "cluster.cpus_per_worker": 1,
        "logging.run_dir": run_dir,
        "logging.tensorboard": False,
        "logging.plots": False,
    }
    result = cli(
        ["grpo", *[f"{k}={v}" for k, v in settings.items()]],
        address=ray_nodes.address,
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"refit via {transport}" in result.stdout + result.stderr
    steps = metric_rows(run_dir, "refit/checksum_relative_diff")
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert row["grad_norm"] > 0  # the update changed the weights that were sent
        assert row["refit/checksum_relative_diff"] <= 1e-9


def test_a_lost_node_fails_fast_naming_the_worker(ray_nodes, tiny_model_dir, tmp_path):
    """A node disappears mid-run (its raylet and workers killed at once): the run stops with the
    dead rank's name and the checkpoint a re-run resumes from, instead of waiting in a collective."""
    ray_nodes.set("a=1 b=1")
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=16)
    run_dir = tmp_path / "run"
    args = sft_args(
        tiny_model_dir,
        data,
        run_dir,
        **{
            "sft.max_steps": 1000,
            "sft.num_epochs": 1000,
            "checkpoint.save_every": 1,
            "cluster.backend": "ray",
            "cluster.num_workers": 2,
            "cluster.cpus_per_worker": 1,
        },
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**ENV, **ray_nodes.client_env},
    )
    try:
        first = run_dir / "checkpoints" / "step_000001" / "COMPLETE"
        deadline = time.monotonic() + 300
        while not first.exists():
            assert run.poll() is None, run.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
        ray_nodes.remove("b")
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 2, err[-4000:]
    [error] = [line for line in err.splitlines() if line.startswith("error:")]
    assert re.fullmatch(
        r"error: worker policy-[01] died \(.+\); the run stopped; latest complete checkpoint: "
        + re.escape(str(run_dir / "checkpoints"))
        + r"/step_\d{6}\. Re-run the same command to resume from the latest complete checkpoint\.",
        error,
    ), error
