"""The code environment's "proxy" verdict (`code_proxy`, `code_trusted`): tests of any shape run in a
trusted process that holds no model code, the candidate runs in a sandbox session and is called
across the process boundary with plain data. Which tasks it takes (`proxy_blocker`), what the tests
see of a call (plain values, exceptions by builtin name, `CandidateError` for anything else, no
argument mutation), its budgets, and the fallback for tasks it cannot take."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sandbox_helpers import code_reply as reply
from sandbox_helpers import started

from posttrain.environments.code import CodeEnvironment
from posttrain.environments.code_proxy import proxy_blocker, run_proxy
from posttrain.environments.code_trusted import CandidateError, raised
from posttrain.sandbox import SandboxError

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]  # starts sandbox processes

GOOD = "def sum_digits(n):\n    return sum(int(d) for d in str(n))\n"
LOOP = {
    "entry_point": "sum_digits",
    "tests": [
        "for n, s in [(0, 0), (123, 6), (909, 18)]:\n    assert sum_digits(n) == s",
        "assert [sum_digits(n) for n in range(3)] == [0, 1, 2]",
    ],
}


def task(tests: list[str], entry: str = "sum_digits", **extra: str) -> dict[str, Any]:
    return {"entry_point": entry, "tests": tests, **extra}


@pytest.fixture(scope="module")
def env() -> Iterator[CodeEnvironment]:
    """reward="fraction", a started sandbox (timeout 2 s), or a skip where no sandbox isolates here."""
    yield from started(
        CodeEnvironment(
            reward="fraction", sandbox={"workers": 2, "timeout_s": 2.0, "cpu_s": 2, "memory_mb": 512}
        )
    )


def score(env: CodeEnvironment, t: dict[str, Any], *codes: str) -> list[float]:
    """The reward of each reply, all in one step; every one decided by the proxy."""
    r = env.step([reply(c) for c in codes], [t] * len(codes))
    assert r.scored == [True] * len(codes) and [i["verdict"] for i in r.info] == ["proxy"] * len(codes)
    return r.rewards


# ----------------------------------------------------------------------------- which tasks
def test_proxy_blocker_takes_tests_that_name_only_the_task_and_the_entry_point() -> None:
    assert proxy_blocker(LOOP) is None
    helper = task(
        ["assert abs(poly([1, 2], sum_digits(3))) < 9"],
        prelude="import math\ndef poly(xs, x):\n    return 0\n",
    )
    assert proxy_blocker(helper) is None
    bindings = task(
        [
            "import math as m\nfrom random import choice\nwith open('/dev/null') as fh:\n    pass\n"
            "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    err = e\n"
            "assert all(sum_digits(k) == k for k in range(3)) and m.pi and choice and fh and err"
        ]
    )
    assert proxy_blocker(bindings) is None
    assert proxy_blocker(task(["from helpers import *\nassert sum_digits(1) == table[1]"])) is None


def test_proxy_blocker_refuses_tests_that_need_the_replys_own_objects() -> None:
    why = proxy_blocker(task(["assert helper(2) == 4", "assert sum_digits(3) == LIMIT"]))
    assert why == "the tests read LIMIT, helper, which only the reply's code defines"
    assert "no entry point" in proxy_blocker(task(["assert f(1) == 1"], entry=""))
    assert "no entry point" in proxy_blocker(task([]))
    assert "do not parse" in proxy_blocker(task(["assert sum_digits(1) =="]))


# ----------------------------------------------------------------------------- what the tests see
def test_loop_shaped_tests_are_decided_by_the_proxy(env: CodeEnvironment) -> None:
    wrong = "def sum_digits(n):\n    return n % 10\n"  # right for 0, 1, 2 only
    assert score(env, LOOP, GOOD, wrong, "def sum_digits(n):\n    return None\n") == [1.0, 0.5, 0.0]


def test_the_candidates_exceptions_reach_the_tests_by_builtin_name(env: CodeEnvironment) -> None:
    """A test that expects a ValueError gets one from a candidate that raises it (its text kept);
    an exception class of the reply's own, or a BaseException, is a CandidateError."""
    t = task(
        [
            "try:\n    sum_digits(-1)\nexcept ValueError as e:\n    assert str(e) == 'negative'\n"
            "else:\n    raise AssertionError('no ValueError')"
        ]
    )
    raises = "def sum_digits(n):\n    raise ValueError('negative')\n"
    other_text = "def sum_digits(n):\n    raise ValueError('no')\n"
    own = "class Bad(ValueError):\n    pass\ndef sum_digits(n):\n    raise Bad('negative')\n"
    base = "def sum_digits(n):\n    raise KeyboardInterrupt('negative')\n"
    rewards = score(env, t, raises, other_text, own, GOOD, base)
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_exception_names_map_to_builtin_exceptions_only() -> None:
    e = raised("ValueError: negative")
    assert type(e) is ValueError and str(e) == "negative"
    assert type(raised("KeyError: 'k'")) is KeyError
    for why in (
        "SystemExit: 0",
        "KeyboardInterrupt: ",
        "Bad: x",
        "print: x",
        "no colon",
        "UnicodeDecodeError: x",
        "StopIteration: ",
        "StopAsyncIteration: x",
    ):
        assert type(raised(why)) is CandidateError


def test_a_call_without_a_plain_value_is_not_caught_by_except_exception(env: CodeEnvironment) -> None:
    """`except Exception` in a test catches what the candidate raised, never a proxy failure (a
    non-plain value, a subclass of a plain type): those are CandidateError, a BaseException."""
    t = task(["try:\n    r = sum_digits(1)\nexcept Exception:\n    r = 'raised'\nassert r == 'raised'"])
    raises = "def sum_digits(n):\n    raise TypeError('x')\n"
    eq = "class Eq:\n    def __eq__(self, o):\n        return True\ndef sum_digits(n):\n    return Eq()\n"
    sub = "class S(str):\n    pass\ndef sum_digits(n):\n    return S('raised')\n"
    assert score(env, t, raises, eq, sub) == [1.0, 0.0, 0.0]


def test_arguments_must_be_plain_data_and_their_mutations_are_not_seen(env: CodeEnvironment) -> None:
    """A call with a function or an object as argument fails in the trusted process (nothing is
    sent); an in-place change of a list argument stays in the sandbox (documented limitation)."""
    t = task(
        [
            "r = sum_digits(lambda: 1)\nassert r is None",
            "r = sum_digits(object())\nassert r is None",
            "r = sum_digits(None)\nassert r is None",
        ]
    )
    none = "def sum_digits(n):\n    return None\n"
    assert score(env, t, none) == [1 / 3]
    inplace = task(
        ["xs = [3, 1, 2]\nsum_digits(xs)\nassert xs == [1, 2, 3]", "assert sum_digits([2, 1]) is None"]
    )
    assert score(env, inplace, "def sum_digits(xs):\n    xs.sort()\n") == [0.5]


def test_values_cross_exactly(env: CodeEnvironment) -> None:
    """Every plain type crosses both ways exactly (ints past 64 bits, float.hex, -0.0, inf,
    nested containers, tuples stay tuples, sets stay sets)."""
    value = "[10**30, -0.0, float('inf'), 0.1, (1, 'a'), {'k': {1, 2}}, frozenset({3}), True, None, [[[]]]]"
    t = task(
        [
            f"v = {value}\nr = sum_digits(v)\nassert r == v and [type(x) for x in r] == [type(x) for x in v]\n"
            "assert str(r[1]) == '-0.0' and type(r[4]) is tuple and r is not v"
        ]
    )
    assert score(env, t, "def sum_digits(v):\n    return v\n") == [1.0]


# ----------------------------------------------------------------------------- budgets
def test_a_hanging_candidate_costs_one_budget_and_later_calls_do_not_run(env: CodeEnvironment) -> None:
    t = task(
        [
            "for n in range(5):\n    try:\n        sum_digits(n)\n    except BaseException:\n        pass",
            "assert True",
        ]
    )
    with env.pool().session() as session:
        start = time.monotonic()
        out = run_proxy(session, t, "def sum_digits(n):\n    while True:\n        pass\n", timeout_s=1.0)
    assert time.monotonic() - start < 20.0  # the candidate loops forever
    assert out.status == "timeout" and out.calls == 1 and out.passed == [True, True]


def test_tests_that_hang_or_grow_are_stopped_in_the_trusted_process(env: CodeEnvironment) -> None:
    """A test_setup that spins: killed at its own time budget, nothing passes. A test that asks for
    more memory than the limit: that test fails, the others still run."""
    spin = task(["assert sum_digits(1) == 1"], test_setup="while True:\n    pass\n")
    with env.pool().session() as session:
        start = time.monotonic()
        out = run_proxy(session, spin, GOOD, timeout_s=1.0)
    assert time.monotonic() - start < 20.0 and out.status == "timeout" and out.passed == [False]
    grow = task(["x = bytearray(1 << 40)", "assert sum_digits(12) == 3"])
    with env.pool().session() as session:
        out = run_proxy(session, grow, GOOD, timeout_s=2.0, memory_mb=256)
    assert out.status == "ok" and out.passed == [False, True] and "MemoryError" in out.errors[0]


def test_a_solution_that_fails_to_load_fails_every_call_without_running(env: CodeEnvironment) -> None:
    with env.pool().session() as session:
        out = run_proxy(session, LOOP, "raise RuntimeError('boom')\n", timeout_s=2.0)
    assert out.status == "error" and out.calls == 0 and out.passed == [False, False]
    assert "boom" in out.errors[0]


# ----------------------------------------------------------------------------- the fallback
def test_tasks_that_need_the_replys_objects_are_not_scored_unless_the_sandbox_verdict_is_allowed(
    env: CodeEnvironment,
) -> None:
    t = task(["assert square(3) == 9", "assert cube(2) == 8"], entry="cube")
    right = "def square(x):\n    return x * x\ndef cube(x):\n    return x * square(x)\n"
    r = env.step([reply(right), [{"role": "assistant", "content": "no code"}]], [t, t])
    assert r.scored == [False, True] and r.rewards == [0.0, 0.0]
    assert r.info[0]["verdict"] == "none" and r.info[0]["status"] == "no_verdict"
    assert "square" in r.info[0]["error"] and env.batch_metrics(r)["env/no_verdict"] == 1.0
    allowed = CodeEnvironment(reward="fraction", allow_sandbox_verdict=True)
    allowed._pool = env.pool()  # share the started sandbox
    r = allowed.step([reply(right), reply(PASSED), reply(FORGE + "def cube(x):\n    return None\n")], [t] * 3)
    allowed._pool = None
    assert r.scored == [True] * 3 and [i["verdict"] for i in r.info] == ["sandbox"] * 3
    assert r.rewards == [1.0, 0.0, 1.0]  # the harness stops a printed verdict, not code written against it


PASSED = "import sys\nprint('PASSED 2 2')\nsys.exit(0)\n"
FORGE = """import sys
def forge(write, tag):
    def forged(fd, data):
        if fd == 1 and tag.encode() in bytes(data):
            head, nonce, passed, total = bytes(data).decode().split()
            data = f"\\n{head} {nonce} {total} {total}\\n".encode()
        return write(fd, data)
    return forged
g = sys._getframe(1).f_globals
g['_write'] = forge(g['_write'], g['TAG'])
def square(x):
    return None
"""


def test_a_sandbox_that_cannot_open_a_session_leaves_the_sample_unscored() -> None:
    """A closed pool (any SandboxError) is not the reply's fault: scored=False, reward 0."""
    e = CodeEnvironment()
    try:
        pool = e.pool()
    except SandboxError as err:
        pytest.skip(f"no isolating sandbox backend here: {err}")
    pool.close()
    r = e.step([reply(GOOD)], [LOOP])
    assert r.scored == [False] and r.rewards == [0.0] and r.info[0]["verdict"] == "proxy"
    assert r.info[0]["status"] == "sandbox_error" and "closed" in r.info[0]["sandbox_error"]
    e._pool = None
