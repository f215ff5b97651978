"""A worker process killed mid-run (the OOM killer, a preempted machine): the run stops naming the
worker and saying how to go on, and the same command resumes from the latest complete checkpoint.

One GRPO run on Ray with split placement has all three kinds of worker as their own processes: the
policy (ActorPolicy), generation (GenerationWorker) and environment (_EnvWorker) actors. Each run
below loses the policy or the environment actor after its checkpoint; the next run resumes from
there. (A killed generation worker: test_grpo_async.py's, which stops the run the same way.) The runs attach
(RAY_ADDRESS) to the session's cluster process (`ray_nodes` in conftest.py; here one node of 3 CPUs),
as jobs on a long-lived cluster do, which saves starting Ray for each run.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from fault_helpers import (
    complete_steps,
    finish,
    kill_tree_leftovers,
    ray_actor_pids,
    remove_shared_files,
    start,
    wait_for,
)

pytestmark = pytest.mark.ray


def grpo_args(model_dir, run_dir, max_steps: int) -> list[str]:
    settings = {
        "policy.model_name": model_dir,
        "policy.max_seq_len": 96,
        "data.example_turns": "[]",  # the quickstart's worked example does not fit in 96 tokens
        "data.train.reasoning_gym.size": 32,
        "data.validation.reasoning_gym.size": 4,
        "grpo.max_steps": max_steps,
        "grpo.prompts_per_step": 2,
        "grpo.generations_per_prompt": 4,
        "grpo.val_every": 100,
        "grpo.val_at_start": False,
        "generation.max_new_tokens": 12,
        "generation.placement": "split",
        "cluster.backend": "ray",
        "cluster.cpus_per_worker": 1,
        "checkpoint.save_every": 1,
        "logging.run_dir": run_dir,
        "logging.tensorboard": False,
        "logging.plots": False,
    }
    return ["grpo", *[f"{k}={v}" for k, v in settings.items()]]


def response_lengths(run_dir) -> list[tuple[int, float]]:
    """(step, mean response length) per logged step: what the step's rollouts sampled."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [(row["step"], row["response_length"]) for row in rows if "response_length" in row]


# (actor class, worker name in the error)
WORKERS = [("ActorPolicy", "policy-0"), ("_EnvWorker", "env-math-0")]


def test_a_killed_worker_stops_the_run_and_the_rerun_resumes(ray_nodes, tiny_model_dir, tmp_path):
    ray_nodes.set("a=3")
    run_dir = tmp_path / "run"
    args = grpo_args(tiny_model_dir, run_dir, max_steps=len(WORKERS) + 1)
    earlier: set[int] = set()  # actor processes of earlier runs (they may still be exiting)
    for i, (class_name, worker) in enumerate(WORKERS):
        run, pid = start(args, **ray_nodes.client_env), None
        try:
            # after this run's first checkpoint (step i + 1), while it takes the next step
            wait_for(lambda i=i: complete_steps(run_dir)[-1:] == [i + 1], run, what=f"checkpoint {i + 1}")
            actors = ray_actor_pids(ray_nodes.process.pid)  # its raylets start the actors
            [pid] = [p for p in actors.get(class_name, []) if p not in earlier]
            earlier |= {p for pids in actors.values() for p in pids}
            os.kill(pid, signal.SIGKILL)
            returncode, output = finish(run)
        finally:
            kill_tree_leftovers(run)
            if pid is not None:
                remove_shared_files(pid)  # a killed policy worker's weights stay in /dev/shm
        assert returncode == 2, output[-4000:]
        [error] = [line for line in output.splitlines() if line.startswith("error:")]
        latest = run_dir / "checkpoints" / f"step_{i + 1:06d}"
        assert error.startswith(f"error: worker {worker} died (")
        assert error.endswith(
            f"the run stopped; latest complete checkpoint: {latest}. "
            "Re-run the same command to resume from the latest complete checkpoint."
        ), error
        assert "Traceback" not in output
        if i > 0:
            assert f"resumed from {run_dir / 'checkpoints' / f'step_{i:06d}'}" in output

    last = start(args, **ray_nodes.client_env)
    returncode, output = finish(last)
    assert returncode == 0, output[-4000:]
    assert f"resumed from {run_dir / 'checkpoints' / f'step_{len(WORKERS):06d}'}" in output
    # nothing lost: every step was taken and checkpointed; a step redone after a kill sampled the same
    # rollouts (same data position, same sampling seeds) as the killed run's attempt at it
    assert complete_steps(run_dir) == [len(WORKERS), len(WORKERS) + 1]
    taken = response_lengths(run_dir)
    assert sorted({step for step, _ in taken}) == list(range(1, len(WORKERS) + 2))
    for step in {step for step, _ in taken}:
        assert len({length for s, length in taken if s == step}) == 1, f"step {step} differs when redone"
