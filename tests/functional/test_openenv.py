"""Environments as OpenEnv services, on loopback only (issue #33 item 1).

(a) an environment written here with OpenEnv's own base class, served by OpenEnv's own server code,
    driven by posttrain's `openenv` environment;
(b) posttrain environments served by `posttrain env serve` (math, the sliding puzzle), driven by
    OpenEnv's own client;
(c) served episodes equal in-process ones bit for bit (rewards and their named components as float.hex,
    observations, scored, the invalid-tool-call and malformed-thinking flags, new_context);
(d) a server killed mid-run: unscored episodes naming the server, never a silent 0; a restarted server
    continues the other episodes exactly (replay checked by digests).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

pytest.importorskip("openenv.core")

from openenv.core.env_server.http_server import create_fastapi_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment as OpenEnvBase  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402
from openenv.core.generic_client import GenericEnvClient  # noqa: E402
from openenv_servers import (  # noqa: E402
    cli_server,
    free_port,
    kill,
    start_cli_server,
    thread_server,
    wait_healthy,
)

from posttrain.environments.calculator import CalculatorEnvironment  # noqa: E402
from posttrain.environments.interface import observation_messages  # noqa: E402
from posttrain.environments.math import MathEnvironment  # noqa: E402
from posttrain.environments.math_format import MathFormatEnvironment  # noqa: E402
from posttrain.environments.openenv_env import EnvironmentServerError, OpenEnvEnvironment  # noqa: E402
from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment  # noqa: E402
from posttrain.environments.sliding_puzzle_board import (  # noqa: E402
    apply_action,
    is_solved,
    legal_directions,
    shuffled_grid,
    solve_bfs,
)
from posttrain.rollout.episode import start_episodes  # noqa: E402
from posttrain.serve.openenv_server import create_app  # noqa: E402

PUZZLE_ARGS = ["sliding_puzzle", "max_moves=4", "shaped_reward=0.3", "max_shuffle_moves=5"]
PUZZLE_KWARGS = {"max_moves": 4, "shaped_reward": 0.3, "max_shuffle_moves": 5}


# -- (a) an OpenEnv environment of OpenEnv's own making -------------------------------------------


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    prompt: str = ""


class GuessDigit(OpenEnvBase[GuessAction, GuessObservation, State]):
    """Guess the digit seed % 10 in at most 3 guesses; reward 1 for the right guess, else "higher"/"lower"."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self.target = 0

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> GuessObservation:
        self.target = (seed or 0) % 10
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(prompt="Guess my digit (0-9).")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        guess = int(action.guess) if action.guess.strip().isdigit() else -1
        if guess == self.target:
            return GuessObservation(prompt="Right.", reward=1.0, done=True)
        hint = "higher" if guess < self.target else "lower"
        return GuessObservation(prompt=hint, reward=0.0, done=self._state.step_count >= 3)

    @property
    def state(self) -> State:
        return self._state


@pytest.fixture(scope="module")
def guess_url():
    with thread_server(
        create_fastapi_app(GuessDigit, GuessAction, GuessObservation, max_concurrent_envs=8)
    ) as url:
        yield url


def test_openenv_client_drives_an_openenv_server(guess_url: str) -> None:
    env = OpenEnvEnvironment(guess_url, action_field="guess", observation_field="prompt", timeout_s=30)
    starts = env.reset([{}, {}, {}], [13, 5, 7])  # targets 3, 5, 7
    assert [s.messages for s in starts] == [[{"role": "user", "content": "Guess my digit (0-9)."}]] * 3
    logs = [
        [*s.messages, {"role": "assistant", "content": reply}]
        for s, reply in zip(starts, ["3", "2", "9"], strict=True)
    ]
    first = env.step(logs, [s.metadata for s in starts])
    assert first.rewards == [1.0, 0.0, 0.0]
    assert first.done == [True, False, False]
    assert first.observations == [
        None,
        [{"role": "user", "content": "higher"}],
        [{"role": "user", "content": "lower"}],
    ]
    assert first.scored == [True, True, True]
    logs = [
        [*logs[k], *first.observations[k], {"role": "assistant", "content": r}]
        for k, r in ((1, "5"), (2, "8"))
    ]
    second = env.step(logs, first.metadata[1:])
    assert (second.rewards, second.done) == ([1.0, 0.0], [True, False])
    env.close()


def test_openenv_server_error_answer_leaves_the_episode_unscored(guess_url: str) -> None:
    """An action the server rejects (unknown field): no retry, scored=False, the error names server and request."""
    env = OpenEnvEnvironment(guess_url, action_field="answer", timeout_s=30, retries=2, backoff_s=0.0)
    [start] = env.reset([{}], [4])
    result = env.step([[*start.messages, {"role": "assistant", "content": "4"}]], [start.metadata])
    assert result.scored == [False] and result.done == [True]
    error = result.info[0]["verifier_error"]
    assert guess_url in error and "step" in error and start.metadata["openenv"]["episode_id"] in error
    assert "VALIDATION_ERROR" in error or "EXECUTION_ERROR" in error
    assert env.batch_metrics(result)["env/unscored"] == 1.0


def test_openenv_health_check_names_the_server() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(EnvironmentServerError, match=f"OpenEnv server {url} is not healthy.*/health"):
        OpenEnvEnvironment(url, retries=1, backoff_s=0.0, timeout_s=5)


# -- playing scripted episodes -------------------------------------------------------------------


def play(env: Any, tasks: list[dict], seeds: list[int], scripts: list[list[str]]) -> tuple[list, list]:
    """Run every episode to its end with its scripted replies; (starts, per-turn records of each episode)."""
    starts = start_episodes(env, tasks, seeds)  # the rollout's own start: reset, or the task's messages
    logs = [list(s.messages) for s in starts]
    metas = [s.metadata for s in starts]
    records: list[list[tuple]] = [[] for _ in tasks]
    active = list(range(len(tasks)))
    for turn in range(10):
        if not active:
            break
        for i in active:
            logs[i].append({"role": "assistant", "content": scripts[i][min(turn, len(scripts[i]) - 1)]})
        result = env.step([logs[i] for i in active], [metas[i] for i in active])
        for j, i in enumerate(active):
            obs = result.observations[j]
            records[i].append(
                (
                    float(result.rewards[j]).hex(),
                    observation_messages(obs),  # one message or a list of one: the same trajectory
                    result.done[j],
                    result.scored[j],
                    result.stop_strings[j],
                    result.response_prefixes[j],
                    json.loads(json.dumps(result.info[j])),
                    {name: float(v).hex() for name, v in result.reward_components[j].items()},
                    result.invalid_tool_call[j],
                    result.malformed_thinking[j],
                    result.new_context[j],
                )
            )
            logs[i].extend(observation_messages(obs))
            metas[i] = result.metadata[j]
        active = [i for j, i in enumerate(active) if not result.done[j]]
    return starts, records


def start_view(start: Any) -> tuple:
    return start.messages, start.tools, tuple(start.stop_strings), start.response_prefix


def puzzle_scripts(tasks: list[dict]) -> list[list[str]]:
    """Episode 0 solves its board (BFS), the others mix legal, illegal, view and malformed replies."""
    grid = shuffled_grid(tasks[0]["size"], tasks[0]["shuffle_moves"], tasks[0]["puzzle_seed"])
    solution = [f"<action>{m}</action>" for m in solve_bfs(grid)]
    mixed = ["<action>up</action>", "<action>slide 9 9</action>", "<action>view</action>", "no tag"]
    return [solution, mixed, mixed[::-1], ["<action>left</action>"]]


@pytest.fixture(scope="module")
def puzzle_url():
    with cli_server(PUZZLE_ARGS) as (url, _):
        yield url


@pytest.fixture(scope="module")
def math_url():
    with thread_server(create_app("math")) as url:
        yield url


MATH_TASKS = [
    {
        "messages": [{"role": "user", "content": "What is 6 * 7? Put the answer in \\boxed{}."}],
        "answer": "42",
    },
    {"messages": [{"role": "user", "content": "What is 10 - 3?"}], "answer": "7"},
    {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"},
]
MATH_REPLIES = [["The answer is \\boxed{42}."], ["\\boxed{8}"], ["four, I think"]]


def test_served_puzzle_episodes_equal_in_process_bit_for_bit(puzzle_url: str) -> None:
    local = SlidingPuzzleEnvironment(**PUZZLE_KWARGS)
    tasks = local.generate_tasks(4, seed=11)
    scripts = puzzle_scripts(tasks)
    remote = OpenEnvEnvironment(puzzle_url, timeout_s=30)
    remote_starts, remote_records = play(remote, tasks, [1, 2, 3, 4], scripts)
    local_starts, local_records = play(local, tasks, [1, 2, 3, 4], scripts)
    assert [start_view(s) for s in remote_starts] == [start_view(s) for s in local_starts]
    assert remote_records == local_records
    rewards = [[float.fromhex(r[0]) for r in episode] for episode in local_records]
    assert rewards[0][-1] == 1.0  # the BFS solution solves
    assert any(0.0 < r[-1] < 0.3 for r in rewards[1:])  # an unsolved end pays shaped_reward x tiles in place


def test_a_served_puzzle_without_history_restarts_the_conversation_as_in_process() -> None:
    """`history: false` over the wire: every observation of an unfinished episode comes with
    new_context (the next prompt is the board alone), as in-process, and the rest bit for bit."""
    kwargs = {**PUZZLE_KWARGS, "history": False}
    local = SlidingPuzzleEnvironment(**kwargs)
    tasks = local.generate_tasks(4, seed=11)
    scripts = puzzle_scripts(tasks)
    with thread_server(create_app("sliding_puzzle", kwargs)) as url:
        remote = play(OpenEnvEnvironment(url, timeout_s=30), tasks, [1, 2, 3, 4], scripts)
    local_run = play(local, tasks, [1, 2, 3, 4], scripts)
    assert remote[1] == local_run[1]
    flags = [(turn[2], turn[-1]) for episode in remote[1] for turn in episode]  # (done, new_context)
    assert all(new_context == (not done) for done, new_context in flags)
    assert any(new_context for _, new_context in flags)


def test_served_math_equals_in_process_and_hand_values(math_url: str) -> None:
    remote_starts, remote_records = play(
        OpenEnvEnvironment(math_url, timeout_s=30), MATH_TASKS, [0, 0, 0], MATH_REPLIES
    )
    local_starts, local_records = play(MathEnvironment(), MATH_TASKS, [0, 0, 0], MATH_REPLIES)
    assert [start_view(s) for s in remote_starts] == [start_view(s) for s in local_starts]
    assert remote_records == local_records
    # correct; wrong in the answer's shape (the format reward 0.1); no answer
    assert [float.fromhex(r[0][0]) for r in remote_records] == [1.0, 0.1, 0.0]


def test_served_reward_components_and_turn_flags_equal_in_process() -> None:
    """The named reward parts (GDPO) and the per-turn flags (invalid tool call, malformed thinking) come
    over the wire as in-process: math_format's {"correct", "format"}, the calculator's flags."""
    math_replies = [["\\boxed{42}"], ["\\boxed{8}"], ["<think>\\boxed{4}"]]
    with thread_server(create_app("math_format", {"format_weight": 0.25})) as url:
        remote = play(OpenEnvEnvironment(url, timeout_s=30), MATH_TASKS, [0, 0, 0], math_replies)
    local = play(MathFormatEnvironment(format_weight=0.25), MATH_TASKS, [0, 0, 0], math_replies)
    assert remote[1] == local[1] and [start_view(s) for s in remote[0]] == [start_view(s) for s in local[0]]
    components = [{k: float.fromhex(v) for k, v in episode[0][7].items()} for episode in remote[1]]
    assert components == [
        {"correct": 1.0, "format": 0.25},
        {"correct": 0.0, "format": 0.25},
        {"correct": 0.0, "format": 0.0},
    ]

    tasks = [{"a": 964, "b": 59}, {"a": 12, "b": 34}, {"a": 5, "b": 7}]
    tool = '<tool_call>{"name": "calculator", "arguments": {"expression": "964 * 59"}}</tool_call>'
    scripts = [
        [tool, "\\boxed{56876}"],
        ['<tool_call>{"name": "abacus", "arguments": {}}</tool_call>', "<think>so \\boxed{408}"],
        ["<think>a</think><think>b</think> \\boxed{35}"],
    ]
    with thread_server(create_app("tool_calculator")) as url:
        remote = play(OpenEnvEnvironment(url, timeout_s=30), tasks, [0, 0, 0], scripts)
    local = play(CalculatorEnvironment(), tasks, [0, 0, 0], scripts)
    assert remote[1] == local[1] and [start_view(s) for s in remote[0]] == [start_view(s) for s in local[0]]
    flags = [[(turn[8], turn[9]) for turn in episode] for episode in remote[1]]
    assert flags == [[(False, False), (False, False)], [(True, False), (False, True)], [(False, True)]]


def test_verify_route_carries_components_and_flags() -> None:
    with thread_server(create_app("tool_calculator")) as url:
        messages = [
            {"role": "assistant", "content": '<tool_call>{"name": "abacus", "arguments": {}}</tool_call>'},
            {"role": "assistant", "content": "<think>a</think><think>b</think> \\boxed{35}"},
        ]
        [start] = CalculatorEnvironment().reset([{"a": 5, "b": 7}], [0])
        body = json.dumps({"task": {"a": 5, "b": 7}, "messages": [*start.messages, *messages]}).encode()
        request = urllib.request.Request(
            f"{url}/posttrain/verify", data=body, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            verdict = json.loads(reply.read())
    assert verdict["invalid_tool_call"] == [True, False] and verdict["malformed_thinking"] == [False, True]
    assert verdict["reward_components"] == [{}, {}] and verdict["rewards"] == [0.0, 1.0]


# -- (b) OpenEnv's own client on posttrain's servers ----------------------------------------------


def test_openenv_own_client_drives_served_sliding_puzzle(puzzle_url: str) -> None:
    local = SlidingPuzzleEnvironment(**PUZZLE_KWARGS)
    task = local.generate_tasks(1, seed=5)[0]
    [start] = local.reset([task], [9])
    moves = [f"<action>{m}</action>" for m in solve_bfs(start.metadata["grid"])]
    with GenericEnvClient(base_url=puzzle_url).sync() as client:
        first = client.reset(seed=9, task=task)
        assert first.observation["messages"] == start.messages and first.done is False
        assert first.observation["stop_strings"] == ["</action>"]
        log, meta = list(start.messages), start.metadata
        for move in moves:
            log.append({"role": "assistant", "content": move})
            expected = local.step([log], [meta])
            got = client.step({"content": move})
            assert (got.reward, got.done) == (expected.rewards[0], expected.done[0])
            assert got.observation["info"] == expected.info[0] and got.observation["scored"] is True
            log.extend([] if expected.observations[0] is None else [expected.observations[0]])
            meta = expected.metadata[0]
        assert got.reward == 1.0 and got.done is True


def test_openenv_own_client_drives_served_math(math_url: str) -> None:
    with GenericEnvClient(base_url=math_url).sync() as client:
        reset = client.reset(task=MATH_TASKS[0])
        assert reset.observation["messages"] == MATH_TASKS[0]["messages"]
        result = client.step({"content": "so \\boxed{42}"})
        assert (result.reward, result.done, result.observation["scored"]) == (1.0, True, True)


def test_verify_route_scores_a_finished_transcript(puzzle_url: str) -> None:
    """posttrain's extension: POST /posttrain/verify replays a transcript's assistant turns, no session."""
    local = SlidingPuzzleEnvironment(**PUZZLE_KWARGS)
    task = local.generate_tasks(1, seed=21)[0]
    [start] = local.reset([task], [0])
    replies = [
        {"role": "assistant", "content": f"<action>{m}</action>"} for m in solve_bfs(start.metadata["grid"])
    ]
    body = json.dumps({"task": task, "seed": 0, "messages": [*start.messages, *replies]}).encode()
    request = urllib.request.Request(
        f"{puzzle_url}/posttrain/verify", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        verdict = json.loads(reply.read())
    assert verdict["rewards"][-1] == 1.0 and verdict["done"] is True and verdict["scored"] is True
    assert verdict["turns"] == len(replies) and sum(verdict["rewards"][:-1]) == 0.0


# -- (d) a server killed mid-run --------------------------------------------------------------------


def unsolving_moves(env: SlidingPuzzleEnvironment, tasks: list[dict]) -> list[str]:
    """Per task, a legal first move that does not solve the board (the episode goes on)."""
    moves = []
    for start in env.reset(tasks, [0] * len(tasks)):
        grid = start.metadata["grid"]
        moves.append(next(m for m in legal_directions(grid) if not is_solved(apply_action(grid, m)[0])))
    return moves


def test_killed_server_gives_unscored_episodes_and_a_restarted_one_continues() -> None:
    """Kill the server after one turn: the episodes stepped while it is down end unscored (scored=False,
    the error names the server, the request and the episode), never scored 0 as if played; after a restart
    on the same port the other episodes are replayed and continue exactly as in-process."""
    local = SlidingPuzzleEnvironment(**PUZZLE_KWARGS)
    tasks = local.generate_tasks(4, seed=3)
    scripts = [
        [f"<action>{move}</action>", "<action>view</action>"] for move in unsolving_moves(local, tasks)
    ]
    port = free_port()
    process = start_cli_server(PUZZLE_ARGS, port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process=process)
        remote = OpenEnvEnvironment(url, timeout_s=20, retries=2, backoff_s=0.05)
        starts = remote.reset(tasks, [0, 1, 2, 3])
        logs = [[*s.messages, {"role": "assistant", "content": scripts[k][0]}] for k, s in enumerate(starts)]
        first = remote.step(logs, [s.metadata for s in starts])
        assert first.scored == [True] * 4 and first.done == [False] * 4
        kill(process)
        logs = [
            [
                *log,
                *observation_messages(first.observations[k]),
                {"role": "assistant", "content": scripts[k][1]},
            ]
            for k, log in enumerate(logs)
        ]
        down = remote.step(logs[:2], first.metadata[:2])
        assert down.scored == [False, False] and down.done == [True, True]
        for k, info in enumerate(down.info):
            error = info["verifier_error"]
            assert url in error and "step" in error and "failed after 3 attempts" in error
            assert starts[k].metadata["openenv"]["episode_id"] in error
        assert remote.batch_metrics(down)["env/unscored"] == 2.0
        process = start_cli_server(PUZZLE_ARGS, port)
        wait_healthy(url, process=process)
        resumed = remote.step(logs[2:], first.metadata[2:])
    finally:
        kill(process)
    local_starts, local_records = play(local, tasks[2:], [2, 3], scripts[2:])
    assert [float(r).hex() for r in resumed.rewards] == [episode[1][0] for episode in local_records]
    assert [observation_messages(o) for o in resumed.observations] == [
        episode[1][1] for episode in local_records
    ]
    assert resumed.info == [episode[1][6] for episode in local_records]  # moves: 2, the replayed one counted
    assert resumed.scored == [True, True]
