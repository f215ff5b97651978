"""The trusted process of the code environment's "proxy" verdict (see `code_proxy`).

`code_proxy.run_proxy` starts this file as a script (`python -I code_trusted.py`): a process that
holds the task's text only (its prelude, test_setup and tests), never a line of model code. It runs
the tests as written, with the entry point bound to `candidate_proxy`: each call encodes its
arguments as tagged plain data (`code_checks`' encoding; anything else fails the call), asks the
parent to run the call in the sandbox, and decodes the answer strictly (`code_checks.decode_output`).
So every value a test sees is a plain Python value made here, and every helper it calls (the
prompt's `poly`, `math.fabs`, `random`) is the real one.

A call that did not produce a plain value (a non-plain or malformed output, the candidate timed out
or its session died, arguments that are not plain data) raises `CandidateError`, a BaseException, so
that a test's `except Exception` cannot swallow it. An exception the candidate raised is raised here
as the builtin Exception class of the same name (`ValueError`, ...), with its message as text; any
other (a class of its own, SystemExit, StopIteration: it would end a test's `map()` loop with
nothing checked, ...) as `CandidateError`.

Protocol, on fds 0 (from the parent) and 1 (to it), moved away at start so that the tests' prints
go to /dev/null; each message is an 8-byte big-endian length and JSON:
  parent -> here: {"prelude", "test_setup", "tests", "entry_point", "memory_mb", "cpu_s"} (first)
  here -> parent: {"call": [<tagged tuple of args>, <tagged dict of kwargs>]}, answered by
  parent -> here: {"output": <the tagged value the sandbox wrote>} or {"failed": <why>}
  here -> parent: {"done": {"passed": [bool per test], "errors": [str, ...]}} (the last message)
"""

from __future__ import annotations

import builtins
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

MAX_MESSAGE = 1 << 26  # bytes of one message from the parent


class CandidateError(BaseException):
    """A call of the candidate that produced no plain value (see the module docstring)."""


def checks_module() -> ModuleType:
    """`code_checks`, loaded from its file beside this one (the posttrain package is not imported:
    its `__init__` pulls torch, a second of start-up per sample)."""
    name = "posttrain.environments.code_checks"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("code_checks.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def read_message(fd: int) -> Any:
    """The next message on `fd` (8-byte length + JSON); EOFError when the pipe ends first."""
    head = _read_exactly(fd, 8)
    size = int.from_bytes(head, "big")
    if size > MAX_MESSAGE:
        raise EOFError("a message longer than MAX_MESSAGE")
    return json.loads(_read_exactly(fd, size))


def _read_exactly(fd: int, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError("the parent closed the pipe")
        data += chunk
    return bytes(data)


def write_message(fd: int, message: Any) -> None:
    """One message on `fd`: 8-byte big-endian length, then JSON."""
    view = memoryview(json.dumps(message).encode())
    view = memoryview(len(view).to_bytes(8, "big") + bytes(view))
    while view:
        view = view[os.write(fd, view) :]


_ITERATION_ENDS = (StopIteration, StopAsyncIteration)


def raised(why: str) -> BaseException:
    """The exception for a call the candidate answered with `["X", why]` (why: "Name: message"):
    the builtin Exception class `Name` (not BaseException-only ones), else CandidateError. Never
    StopIteration / StopAsyncIteration (CandidateError instead): raised through `map()`, `filter()`
    or an iterator a test consumes, they would end the test's loop with nothing checked, a pass."""
    name, _, message = why.partition(": ")
    cls = getattr(builtins, name, None) if name.isidentifier() else None
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, _ITERATION_ENDS):
        try:
            return cls(message)
        except Exception:  # a class that needs other arguments (UnicodeDecodeError)
            pass
    return CandidateError(f"the candidate raised {why[:300]}")


def candidate_proxy(entry: str, ask: Callable[[Any], Any], checks: ModuleType) -> Callable[..., Any]:
    """The function the tests get for the entry point: `ask(tagged arguments)` returns the parent's
    answer ({"output": tagged} or {"failed": why}); the output is decoded strictly."""
    encoder: dict[str, Any] = {"MAX_DEPTH": checks.MAX_DEPTH, "MAX_HEX_DIGITS": checks.MAX_HEX_DIGITS}
    exec(checks.ENCODER, encoder)
    enc = encoder["_enc"]

    def candidate(*args: Any, **kwargs: Any) -> Any:
        try:
            tagged = [enc(args, 0, [1_000_000]), enc(kwargs, 0, [1_000_000])]
        except ValueError as e:
            raise CandidateError(f"the arguments are not plain data: {e}") from None
        try:
            answer = ask(tagged)
        except Exception as e:  # noqa: BLE001 - the parent is gone or its answer did not parse
            raise CandidateError(f"no answer for the call ({type(e).__name__})") from None
        if type(answer) is not dict or "output" not in answer:
            why = answer.get("failed") if type(answer) is dict else None
            raise CandidateError(str(why or "no output")[:500])
        try:
            value = checks.decode_output(answer["output"])
        except Exception as e:  # noqa: BLE001 - malformed data from the sandbox, any way it breaks
            raise CandidateError(f"a malformed output ({type(e).__name__})") from None
        if isinstance(value, checks.Failed):
            raise raised(value.why)
        return value

    candidate.__name__ = candidate.__qualname__ = entry
    return candidate


def run_tests(spec: dict[str, Any], ask: Callable[[Any], Any], checks: ModuleType) -> dict[str, Any]:
    """{"passed": [bool per test], "errors": [...]}: the prelude, then the entry point bound to the
    proxy, then test_setup, then each test (passes when it raises nothing), all in one namespace."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    errors: list[str] = []
    tests = [str(t) for t in spec["tests"]]
    for name, code in (("prelude", spec.get("prelude") or ""), ("test_setup", spec.get("test_setup") or "")):
        if name == "test_setup":
            namespace[spec["entry_point"]] = candidate_proxy(spec["entry_point"], ask, checks)
        try:
            exec(compile(code, f"{name}.py", "exec"), namespace)
        except BaseException as e:  # noqa: BLE001 - the task's code may raise anything
            return {"passed": [False] * len(tests), "errors": [f"the task's {name} failed: {_describe(e)}"]}
    passed = []
    for test in tests:
        try:
            exec(compile(test, "tests.py", "exec"), namespace)
            passed.append(True)
        except BaseException as e:  # noqa: BLE001
            passed.append(False)
            errors.append(f"FAILED {test[:200]!r}: {_describe(e)}")
    return {"passed": passed, "errors": errors[:5]}


def _describe(e: BaseException) -> str:
    try:
        return f"{type(e).__name__}: {e}"[:300]
    except BaseException:  # noqa: BLE001
        return type(e).__name__


def _limit(memory_mb: int, cpu_s: int) -> None:
    """Address space and CPU limits for this process (a test that grows or spins is stopped)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))


def main() -> None:
    """Serve one task's tests (module docstring: the protocol), then exit."""
    from_parent, to_parent = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    spec = read_message(from_parent)
    _limit(int(spec["memory_mb"]), int(spec["cpu_s"]))
    checks = checks_module()

    lock = threading.Lock()  # a test that calls from threads: one exchange at a time

    def ask(tagged: Any) -> Any:
        with lock:
            write_message(to_parent, {"call": tagged})
            return read_message(from_parent)

    try:
        done = run_tests(spec, ask, checks)
    except BaseException as e:  # noqa: BLE001 - the pipe broke, out of memory, ...
        done = {"passed": None, "errors": [f"the trusted checker failed: {_describe(e)}"]}
    write_message(to_parent, {"done": done})
    os._exit(0)


if __name__ == "__main__":
    main()
