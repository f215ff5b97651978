"""The code environment's "proxy" verdict: tests of any shape, decided where model code cannot reach.

The task's tests run in a trusted process (`code_trusted.py`, a plain `python -I` of its own that
holds the task's prelude, test_setup and tests, never model code), with the entry point bound to a
proxy. The model's code runs in a sandbox session (`SandboxPool.session()`): its first cell runs
the solution (`setup_cell`), and each call of the proxy is one more cell (`call_cell`) that decodes
the arguments, calls the entry point and writes one outputs frame in `code_checks`' tagged
encoding. This process relays: the trusted process asks for a call, the session answers, the
trusted process decodes the answer strictly and the test goes on with a plain value:

    trusted process (tests) <-pipes, length-prefixed JSON-> this process <-cells-> sandbox session

What holds (`tests/unit/test_code_redteam.py`, `tests/unit/test_code_proxy.py`):
- The tests, their expected values and the helpers they call (`poly`, `math.fabs`, `random`) live
  in a process that runs no model code; the sandbox gets arguments only, and all it can choose is
  each call's output, as plain data. Right outputs are the task.
- Budgets: the session's cells share `timeout_s` of wall clock (a call past it fails, and so does
  every later one without running); the trusted process gets `timeout_s` of its own time (not
  counting the calls), `memory_mb` of address space and CPU seconds; past them it is killed and no
  test passes. A cell that ends in anything but "ok" fails its call and ends the session.
- A candidate call that mutates its arguments is not seen by the tests (they keep their own copy).
  The candidate is a function of plain data: a test that needs another object of the reply's (a
  helper, a class, a global; `proxy_blocker`) cannot be run this way.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.environments.code_checks import (
    ENCODER,
    MAX_DEPTH,
    MAX_HEX_DIGITS,
    OUTPUTS_TAG,
    decode_output,
    frame_values,
)

TRUSTED_SCRIPT = Path(__file__).with_name("code_trusted.py")
MAX_MESSAGE = 1 << 26  # bytes of one message from the trusted process
_BUILTIN_NAMES = frozenset(dir(builtins))


def _names(source: str) -> tuple[set[str], set[str], bool]:
    """(names bound, names read, whether a star import is there) anywhere in `source`."""
    bound, read, star = set(), set(), False
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            star |= node.name == "*"
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return bound, read, star


def proxy_blocker(task: dict[str, Any]) -> str | None:
    """Why the task's tests cannot run beside a proxy of its entry point, or None when they can.

    They cannot when there is no entry point (an identifier), no tests, a part does not parse, or
    the tests read a name that neither the task's prelude, test_setup and tests nor the builtins
    bind: that name can only be the reply's (a helper, a class, a constant), and the trusted process
    has none of the reply's objects. A star import counts as binding anything.
    """
    entry, tests = task.get("entry_point") or "", [str(t) for t in task.get("tests") or []]
    if not entry.isidentifier() or not tests:
        return "the task has no entry point or no tests"
    bound, read, star = set(), set(), False
    try:
        for source in (task.get("prelude") or "", task.get("test_setup") or "", *tests):
            b, r, s = _names(source)
            bound, read, star = bound | b, read | r, star or s
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "the task's prelude, test_setup or tests do not parse"
    free = sorted(read - bound - _BUILTIN_NAMES - {entry})
    if free and not star:
        return f"the tests read {', '.join(free[:5])}, which only the reply's code defines"
    return None


# ----------------------------------------------------------------------------- the sandbox side
_SESSION = r'''
import json as _json, os as _os


def __posttrain_dec__(d):
    """A tagged value (code_checks' encoding, written by the trusted process) as a Python value."""
    tag = d[0]
    if tag == "N":
        return None
    if tag in ("B", "S"):
        return d[1]
    if tag == "I":
        return int(d[1], 16)
    if tag == "F":
        return float.fromhex(d[1])
    if tag == "D":
        return {__posttrain_dec__(k): __posttrain_dec__(v) for k, v in d[1]}
    return {"L": list, "T": tuple, "E": set, "Z": frozenset}[tag](__posttrain_dec__(v) for v in d[1])


def __posttrain_call__(text):
    """Call the entry point with the arguments in `text`; write one outputs frame."""
    try:
        args, kwargs = (__posttrain_dec__(p) for p in _json.loads(text))
        value = __posttrain_entry__(*args, **kwargs)
        try:
            out = _enc(value, 0, [1_000_000])
        except BaseException as e:
            out = ["X", "NotPlainData: " + _describe(e)]
    except BaseException as e:
        out = ["X", _describe(e)]
    frame = memoryview(("\n" + TAG + " " + _json.dumps([out]) + "\n").encode())
    while frame:
        frame = frame[_os.write(1, frame):]


__posttrain_ns__ = {"__name__": "__main__"}
exec(compile(SOLUTION, "solution.py", "exec"), __posttrain_ns__)
__posttrain_entry__ = __posttrain_ns__.get(ENTRY_POINT)
if not callable(__posttrain_entry__):
    raise NameError(f"the solution does not define {ENTRY_POINT}")
'''


def setup_cell(solution: str, entry: str) -> str:
    """The session's first cell: the encoder and the call function in the session's globals, then
    the solution in a namespace of its own (its names cannot clobber the helpers by accident); the
    cell raises when the solution raises or defines no callable entry point."""
    header = (
        f"SOLUTION = {solution!r}\nENTRY_POINT = {entry!r}\nTAG = {OUTPUTS_TAG!r}\n"
        f"MAX_DEPTH = {MAX_DEPTH}\nMAX_HEX_DIGITS = {MAX_HEX_DIGITS}\n"
    )
    return header + ENCODER + _SESSION


def call_cell(tagged: Any) -> str:
    """One call's cell: `tagged` is [tagged args tuple, tagged kwargs dict] from the trusted process."""
    return f"__posttrain_call__({json.dumps(tagged)!r})\n"


# ----------------------------------------------------------------------------- the relay
@dataclass
class ProxyOutcome:
    """How one sample's proxy run ended.

    passed: per test, whether it passed (all False when the trusted process did not finish).
    status: "ok" (the tests ran to the end), "timeout" (a budget ran out: the calls' or the trusted
        process's), "error" (the solution failed in its first cell, or the trusted process failed).
    errors: why tests failed (the first few), for `info["error"]`.
    calls / call_s: the calls run in the session (one cell each; a call after the session ended
        fails without running) and the wall time of all cells, the setup cell included.
    """

    passed: list[bool]
    status: str = "ok"
    errors: list[str] = field(default_factory=list)
    calls: int = 0
    call_s: float = 0.0


class _Caller:
    """The sandbox side of one sample: the session, the shared call budget, and whether it broke."""

    def __init__(self, session: Any, solution: str, entry: str, budget_s: float) -> None:
        """Run the setup cell now (a failed setup: every call fails without running)."""
        self.session, self.left, self.calls, self.spent = session, budget_s, 0, 0.0
        self.why: str | None = None
        self.timed_out = False
        result = self._cell(setup_cell(solution, entry))
        if result.status != "ok" and self.why is None:
            self.why = "solution failed: " + (result.stderr.strip()[-300:] or result.status)

    def _cell(self, code: str) -> Any:
        """Run one cell within what is left of the budget; a cell that ends in anything but "ok"
        ends the session for this sample (`why`)."""
        start = time.monotonic()
        result = self.session.run(code, timeout_s=self.left)
        took = time.monotonic() - start
        self.spent, self.left = self.spent + took, self.left - took
        if result.status == "timeout":
            self.timed_out, self.why = True, "the candidate's time ran out"
        return result

    def call(self, tagged: Any) -> dict[str, Any]:
        """The answer for the trusted process: {"output": tagged value} or {"failed": why}."""
        if self.why is None and self.left <= 0:
            self.timed_out, self.why = True, "the candidate's time ran out"
        if self.why is not None:
            return {"failed": self.why}
        self.calls += 1
        result = self._cell(call_cell(tagged))
        if result.status != "ok":
            self.why = self.why or f"a call ended with status {result.status}; the session is over"
            return {"failed": self.why}
        return _answer(frame_values(result.stdout, 1))


def _answer(values: list[Any] | None) -> dict[str, Any]:
    """The answer for a call's frame values: the tagged output when it decodes (so it is at most
    MAX_DEPTH deep and relays safely; the trusted process decodes it again), else why not."""
    if values is None:
        return {"failed": "no outputs frame"}
    try:
        decode_output(values[0])
    except Exception as e:  # noqa: BLE001 - hostile data, any way it breaks
        return {"failed": f"a malformed output ({type(e).__name__})"}
    return {"output": values[0]}


class _Trusted:
    """The trusted process: started, sent the task, read with a deadline of its own time, killed."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-I", str(TRUSTED_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.buf = bytearray()
        try:
            self.send(spec)
        except BaseException:
            self.close()
            raise

    def send(self, message: Any) -> None:
        """One message to the process (it is reading: it waits for the task or a call's answer)."""
        data = json.dumps(message).encode()
        self.popen.stdin.write(len(data).to_bytes(8, "big") + data)
        self.popen.stdin.flush()

    def receive(self, timeout_s: float) -> Any:
        """The next message, or None when it does not come within `timeout_s`, the process ends or
        its framing is broken."""
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                if len(self.buf) >= 8:
                    size = int.from_bytes(self.buf[:8], "big")
                    if size > MAX_MESSAGE:
                        return None
                    if len(self.buf) >= 8 + size:
                        data, self.buf = bytes(self.buf[8 : 8 + size]), self.buf[8 + size :]
                        return json.loads(data)
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return None
                self.buf += chunk

    def close(self) -> None:
        """Kill the process group and reap."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.popen.wait()
        for stream in (self.popen.stdin, self.popen.stdout):
            try:
                stream.close()
            except OSError:
                pass


def run_proxy(
    session: Any, task: dict[str, Any], solution: str, timeout_s: float, memory_mb: int = 1024
) -> ProxyOutcome:
    """Run the task's tests in a trusted process against `solution` in `session` (module docstring).

    `session`: a `SandboxSession` (its `run(code, timeout_s=...)`); the caller opens and closes it.
    Raises OSError only when the trusted process cannot be started (not the reply's fault).
    """
    tests = [str(t) for t in task["tests"]]
    spec = {
        "prelude": task.get("prelude") or "",
        "test_setup": task.get("test_setup") or "",
        "tests": tests,
        "entry_point": task["entry_point"],
        "memory_mb": memory_mb,
        "cpu_s": max(1, int(timeout_s + 1)),
    }
    trusted = _Trusted(spec)
    try:
        caller = _Caller(session, solution, task["entry_point"], timeout_s)
        done, timed_out = _relay(trusted, caller, timeout_s, len(tests))
    finally:
        trusted.close()
    status = "timeout" if timed_out or caller.timed_out else "ok" if done is not None else "error"
    if done is None:
        why = "the tests did not finish within the time limit" if timed_out else "the trusted checker failed"
        done = {"passed": [False] * len(tests), "errors": [why]}
    if status == "ok" and caller.why is not None and caller.why.startswith("solution failed"):
        status = "error"
    errors = ([caller.why] if caller.why else []) + [str(e)[:500] for e in done["errors"][:5]]
    return ProxyOutcome(done["passed"], status, errors, caller.calls, caller.spent)


def _relay(trusted: _Trusted, caller: _Caller, budget_s: float, count: int) -> tuple[dict | None, bool]:
    """Relay the trusted process's calls to the session until it reports; (its report, whether its
    own time ran out). The report is None when the process failed or sent anything malformed."""
    start = time.monotonic()
    while True:
        own_left = budget_s - (time.monotonic() - start - caller.spent)
        try:
            message = trusted.receive(own_left)
        except ValueError:  # not JSON
            return None, False
        if type(message) is not dict or len(message) != 1:
            return None, message is None and budget_s - (time.monotonic() - start - caller.spent) <= 0
        if "done" in message:
            return _report(message["done"], count), False
        if "call" not in message:
            return None, False
        try:
            trusted.send(caller.call(message["call"]))
        except OSError:  # the trusted process is gone
            return None, False


def _report(done: Any, count: int) -> dict | None:
    """The trusted process's report, checked: one bool per test and a list of strings."""
    if type(done) is not dict or type(done.get("passed")) is not list or len(done["passed"]) != count:
        return None
    if not all(type(p) is bool for p in done["passed"]) or type(done.get("errors")) is not list:
        return None
    return done
