"""The sandboxed `python(code)` tool and the `tool_python` environment, played with scripted replies."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from sandbox_helpers import started

from posttrain.environments import make_environment
from posttrain.environments.python_tool import PythonToolEnvironment, cut_middle
from posttrain.environments.tools import ToolCall

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]  # starts sandbox processes


@pytest.fixture(scope="module")
def env() -> Iterator[PythonToolEnvironment]:
    yield from started(
        PythonToolEnvironment(max_chars=40, sandbox={"workers": 1, "timeout_s": 3.0, "cpu_s": 3})
    )


def call(env: PythonToolEnvironment, code: str) -> str:
    return env.tools.call(ToolCall("python", {"code": code})).content


def test_answer_format_is_checked_before_any_sandbox_starts() -> None:
    with pytest.raises(ValueError, match="answer_format must be 'boxed' or 'boxed_or_last_number'"):
        PythonToolEnvironment(answer_format="last")


def test_cut_middle_keeps_both_ends() -> None:
    assert cut_middle("abcdef", 6) == "abcdef"
    assert cut_middle("abcdefghij", 4) == "ab\n...[6 characters cut]...\nij"


def test_the_tool_returns_stdout_stderr_and_status(env: PythonToolEnvironment) -> None:
    assert call(env, "print(sum(int(d) for d in str(2**10)))") == "7\n"
    assert call(env, "pass") == "[no output]"
    failed = call(env, "print('before')\n1/0")
    assert failed.startswith("before\n\n[stderr]\n") and "division by zero" in failed
    assert failed.endswith("[status: error]")
    assert call(env, "while True: pass") == "[status: timeout]"
    long = call(env, "print('x' * 1000)")
    assert long.startswith("x" * 20 + "\n...[961 characters cut]...") and len(long) < 100


def test_calls_do_not_share_state_or_see_the_host(env: PythonToolEnvironment) -> None:
    assert call(env, "print(open('f.txt', 'w').write('secret'))") == "6\n"
    assert call(env, "import os; print(os.path.exists('f.txt'))") == "False\n"
    assert call(env, f"import os; print(os.path.exists({os.path.abspath(__file__)!r}))") == "False\n"


def test_an_episode_with_one_tool_call(env: PythonToolEnvironment) -> None:
    task = {"base": 2, "exponent": 10}  # 1024: digit sum 7
    start = env.reset([task], [0])[0]
    assert "2**10" in start.messages[-1]["content"] and start.tools[0]["function"]["name"] == "python"
    assert start.metadata["answer"] == 7
    code = "print(sum(int(d) for d in str(2**10)))"
    turn1 = {
        "role": "assistant",
        "content": "<tool_call>"
        + json.dumps({"name": "python", "arguments": {"code": code}})
        + "</tool_call>",
    }
    log = [*start.messages, turn1]
    r1 = env.step([log], [start.metadata])
    assert (
        r1.done == [False] and r1.observations[0]["role"] == "tool" and r1.observations[0]["content"] == "7\n"
    )
    log += [r1.observations[0], {"role": "assistant", "content": "The sum is \\boxed{7}."}]
    r2 = env.step([log], r1.metadata)
    assert r2.done == [True] and r2.rewards == [1.0] and r2.info[0]["called_tool"]
    wrong = env.step([[*start.messages, {"role": "assistant", "content": "\\boxed{8}"}]], [start.metadata])
    assert wrong.rewards == [0.0]


def test_registered_and_tasks_are_seeded() -> None:
    e = make_environment("tool_python")
    assert isinstance(e, PythonToolEnvironment) and e._pool is None  # no sandbox until a call
    assert e.generate_tasks(5, 1) == e.generate_tasks(5, 1) != e.generate_tasks(5, 2)
