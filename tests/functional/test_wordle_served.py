"""Wordle served over OpenEnv (`posttrain.serve.openenv_server`, loopback): the same scripted games
give the same starts, rewards, observations and info as the environment in process, bit for bit,
and the secret never reaches the client in an unsolved game."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openenv.core")

from openenv_servers import thread_server  # noqa: E402
from test_openenv import play, start_view  # noqa: E402

from posttrain.environments.openenv_env import OpenEnvEnvironment  # noqa: E402
from posttrain.environments.wordle import WordleEnvironment  # noqa: E402
from posttrain.serve.openenv_server import create_app  # noqa: E402

KWARGS = {"max_guesses": 4, "turn_penalty": 0.1}


def test_served_wordle_equals_in_process_bit_for_bit() -> None:
    local = WordleEnvironment(**KWARGS)
    tasks = local.generate_tasks(3, seed=5, split="heldout")
    secret = local.secret_of(tasks[0], 0)
    scripts = [
        ["<guess>crane</guess>", "nothing", f"<guess>{secret}</guess>"],  # solved on turn 3: 0.8
        ["<guess>crane</guess><guess>slate</guess>", "<guess>xyzzy</guess>", "<guess>toolong</guess>"],
        ["<guess>CRANE</guess>"],
    ]
    with thread_server(create_app("wordle", KWARGS)) as url:
        remote_starts, remote_records = play(OpenEnvEnvironment(url, timeout_s=30), tasks, [1, 2, 3], scripts)
    local_starts, local_records = play(local, tasks, [1, 2, 3], scripts)
    assert [start_view(s) for s in remote_starts] == [start_view(s) for s in local_starts]
    assert remote_records == local_records
    rewards = [[float.fromhex(r[0]) for r in episode] for episode in local_records]
    assert rewards[0] == [0.0, 0.0, 1.0 - 0.1 * 2] and rewards[1] == [0.0] * 4
    for task, episode in zip(tasks[1:], local_records[1:], strict=True):
        assert local.secret_of(task, 0) not in json.dumps(episode).lower()
