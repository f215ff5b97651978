"""Host-side verdicts for the code environment: the expected values never enter the sandbox.

A test of the form `assert f(args) == expected` is split on the host (with `ast`) into the call's
argument expressions, which go to the sandbox, and the expected value, which stays here. The
sandbox program (`outputs_program`) evaluates the arguments (before the model's code runs), calls
the entry point once per check (each call isolated), and writes one result frame:

    \\n__POSTTRAIN_CODE_OUTPUTS__ <JSON list, one tagged value per call>\\n

The tagged encoding keeps Python's plain types apart, exactly:
`["N"]` None, `["B", true]` bool, `["I", "-0x1f"]` int (hex: no digit limit), `["F", "0x1.8p+1"]`
float (`float.hex`: exact, inf and nan included), `["S", "..."]` str, `["L", [...]]` list,
`["T", [...]]` tuple, `["E", [...]]` set, `["Z", [...]]` frozenset, `["D", [[k, v], ...]]` dict, and
`["X", "why"]` for a call that raised or returned anything else (an object of another type, a
subclass of a plain type, so nothing with its own `__eq__` crosses). The proxy verdict
(`code_proxy`) carries each call's arguments and output in the same encoding.

The host (`parse_outputs`) reads only the LAST frame line of stdout; it must end with a newline,
parse as JSON, hold exactly one value per call, and each value must decode under the size and
depth limits with exact types and no more than MAX_SAME_HASH set elements or dict keys of one
hash (`decode_output`: no quadratic hash flood); a malformed value fails its call, a malformed
or missing frame fails every call, and nothing raises. The comparison (`check_passes`) is plain
Python on plain values. The process in the sandbox can write any bytes to stdout, so all it can
forge is its outputs; right outputs are what the task asks for.

Supported shapes (`host_checks`): per test `assert f(...) == <constant>`, `assert f(...) is
True/False/None`, `assert f(...)`, `assert not f(...)`, `assert abs(f(...) - <constant>) < <constant>`;
HumanEval's `check(candidate)` when its body holds only those (with `candidate`), `assert True`
and bare names/strings, and its module only `METADATA = ...` beside `check`. A constant is what
`ast.literal_eval` accepts, or + - * / // % ** of numbers in tuples and lists (`2.0 / 3.0`).
Arguments may be any expression that does not name the entry point or `candidate`; they are
evaluated in the sandbox in a namespace of the task's prelude only.
"""

from __future__ import annotations

import ast
import collections
import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

OUTPUTS_TAG = "__POSTTRAIN_CODE_OUTPUTS__"
ARGS_FN = "__posttrain_args__"
MAX_DEPTH = 40  # nesting of one output
MAX_HEX_DIGITS = 20_000  # an int of up to 80 000 bits
MAX_FRAME_CHARS = 8_000_000
MAX_SAME_HASH = 64  # set elements / dict keys of one output sharing one hash value

CheckKind = Literal["eq", "is", "true", "false", "close"]


@dataclass(frozen=True)
class Check:
    """One call of the entry point and what its output must satisfy on the host.

    call: source text `__posttrain_args__(<the call's arguments>)`, evaluated in the sandbox.
    kind: "eq" (output == expected), "is" (output is expected: True/False/None), "true" / "false"
        (bool(output)), "close" (abs(output - expected) < tol, output an int or float).
    text: the assert statement, for error messages.
    """

    call: str
    kind: CheckKind
    expected: Any = None
    tol: float = 0.0
    text: str = ""


@dataclass(frozen=True)
class Failed:
    """The output of a call that raised, returned a non-plain value, or came back malformed."""

    why: str


class Unsupported(ValueError):
    """A test the host cannot decide (the proxy verdict, `code_proxy`, takes it instead)."""


_FOLD = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def constant(node: ast.AST) -> Any:
    """The value of a constant expression: a literal (`ast.literal_eval`), or + - * / // % ** of
    numbers (exponents up to 64 in magnitude) inside tuples and lists. Raises Unsupported otherwise."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [constant(e) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.BinOp) and type(node.op) in _FOLD:
        left, right = constant(node.left), constant(node.right)
        numbers = all(type(v) in (int, float) for v in (left, right))
        if not numbers or (isinstance(node.op, ast.Pow) and abs(right) > 64):
            raise Unsupported(f"not a constant: {ast.unparse(node)[:80]}")
        try:
            return _FOLD[type(node.op)](left, right)
        except (ArithmeticError, ValueError) as e:
            raise Unsupported(str(e)) from None
    raise Unsupported(f"not a constant: {ast.unparse(node)[:80]}")


def _call_source(node: ast.AST, callee: str, forbidden: set[str]) -> str:
    """`__posttrain_args__(<args>)` for a call of `callee`; Unsupported when `node` is not one or its
    arguments name the entry point (their value must not depend on the model's code)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == callee):
        raise Unsupported("not a call of the entry point")
    parts = [*node.args, *(k.value for k in node.keywords)]
    if any(isinstance(n, ast.Name) and n.id in forbidden for p in parts for n in ast.walk(p)):
        raise Unsupported("the arguments name the entry point")
    return ast.unparse(ast.Call(func=ast.Name(ARGS_FN, ast.Load()), args=node.args, keywords=node.keywords))


def _assert_check(stmt: ast.Assert, callee: str, forbidden: set[str]) -> Check:
    """The Check of one supported assert (module docstring: the shapes); Unsupported otherwise."""
    test, text = stmt.test, ast.unparse(stmt)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return Check(_call_source(test.operand, callee, forbidden), "false", text=text)
    if not isinstance(test, ast.Compare):
        return Check(_call_source(test, callee, forbidden), "true", text=text)
    if len(test.ops) != 1:
        raise Unsupported("a chained comparison")
    op, left, right = test.ops[0], test.left, test.comparators[0]
    if isinstance(op, ast.Eq):
        return Check(_call_source(left, callee, forbidden), "eq", constant(right), text=text)
    if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value in (True, False, None):
        return Check(_call_source(left, callee, forbidden), "is", right.value, text=text)
    if isinstance(op, ast.Lt) and isinstance(left, ast.Call) and isinstance(left.func, ast.Name):
        inner = left.args[0] if left.func.id == "abs" and len(left.args) == 1 and not left.keywords else None
        if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Sub):
            tol, expected = constant(right), constant(inner.right)
            if type(tol) in (int, float) and type(expected) in (int, float):
                return Check(_call_source(inner.left, callee, forbidden), "close", expected, tol, text)
    raise Unsupported(f"an assert of another shape: {text[:80]}")


def _statements_checks(body: list[ast.stmt], callee: str, forbidden: set[str]) -> list[Check]:
    """The checks of a block of statements: supported asserts; `assert <truthy constant>`, bare
    names and strings are skipped; anything else is Unsupported."""
    checks = []
    for stmt in body:
        if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant) and stmt.test.value:
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, (ast.Constant, ast.Name)):
            continue
        if not isinstance(stmt, ast.Assert):
            raise Unsupported(f"a statement of another kind: {ast.unparse(stmt)[:80]}")
        checks.append(_assert_check(stmt, callee, forbidden))
    return checks


def _humaneval_checks(test_setup: str, entry: str) -> list[Check]:
    """The checks of a HumanEval-style `check(candidate)` (its module: METADATA and `check` only)."""
    checks: list[Check] | None = None
    for node in ast.parse(test_setup).body:
        if isinstance(node, ast.Assign) and all(
            isinstance(t, ast.Name) and t.id == "METADATA" for t in node.targets
        ):
            continue
        if not (isinstance(node, ast.FunctionDef) and node.name == "check" and checks is None):
            raise Unsupported("test_setup holds more than METADATA and one check()")
        a = node.args
        if (
            node.decorator_list
            or [x.arg for x in a.args] != ["candidate"]
            or a.defaults
            or a.vararg
            or a.kwarg
        ):
            raise Unsupported("check() is not check(candidate)")
        if a.kwonlyargs or a.posonlyargs:
            raise Unsupported("check() is not check(candidate)")
        checks = _statements_checks(node.body, "candidate", {"candidate", entry})
    if checks is None:
        raise Unsupported("test_setup defines no check()")
    return checks


def host_checks(task: dict[str, Any]) -> list[list[Check]] | None:
    """The checks of each of the task's tests when every test can be decided on the host (see the
    module docstring), else None (the tests then go to the proxy verdict, `code_proxy`). Every test
    has >= 1 check."""
    entry, tests = task.get("entry_point") or "", list(task.get("tests") or [])
    setup = task.get("test_setup") or ""
    if not entry.isidentifier() or not tests:
        return None
    try:
        if not setup.strip():
            plan = [_statements_checks(ast.parse(t).body, entry, {entry, "candidate"}) for t in tests]
        elif tests == [f"check({entry})"]:
            plan = [_humaneval_checks(setup, entry)]
        else:
            return None
    except (Unsupported, SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None
    return plan if all(plan) else None


# ----------------------------------------------------------------------------- the sandbox side
ENCODER = r'''
_KINDS = ((type(None), "N"), (bool, "B"), (int, "I"), (float, "F"), (str, "S"),
          (list, "L"), (tuple, "T"), (set, "E"), (frozenset, "Z"), (dict, "D"))


def _enc(value, depth, budget):
    """The tagged form of a plain value; ValueError for another type, too deep or too large."""
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0:
        raise ValueError("the value is nested too deep or too large")
    kind = type(value)
    tag = next((t for k, t in _KINDS if kind is k), None)
    if tag is None:
        raise ValueError(f"returned a {kind.__name__}, not a plain Python value")
    if tag == "N":
        return ["N"]
    if tag == "B" or tag == "S":
        return [tag, value]
    if tag == "I":
        if value.bit_length() > 4 * MAX_HEX_DIGITS:
            raise ValueError("the int is too large")
        return ["I", hex(value)]
    if tag == "F":
        return ["F", value.hex()]
    if tag == "D":
        return ["D", [[_enc(k, depth + 1, budget), _enc(v, depth + 1, budget)] for k, v in value.items()]]
    return [tag, [_enc(v, depth + 1, budget) for v in value]]


def _encode(value):
    """The tagged form of one output, or ["X", why] when it is not made of plain values."""
    try:
        return _enc(value, 0, [1_000_000])
    except BaseException as e:
        return ["X", _describe(e)]


def _describe(e):
    try:
        return f"{type(e).__name__}: {e}"[:300]
    except BaseException:
        return "an exception that cannot be described"
'''

_HARNESS = r'''
import json as _json, os as _os, sys as _sys
_write, _exit = _os.write, _os._exit


def __posttrain_args__(*args, **kwargs):
    return args, kwargs


def _arguments():
    """Every call's (args, kwargs), from the task's text, before the model's code has run."""
    namespace = {"__name__": "__posttrain_arguments__"}
    try:
        exec(PRELUDE, namespace)
    except BaseException:
        pass
    namespace[ARGS_FN] = __posttrain_args__
    calls = []
    for call in CALLS:
        try:
            calls.append(eval(call, namespace))
        except BaseException as e:
            calls.append((None, "the arguments failed: " + _describe(e)))
    return calls


def _outputs(calls):
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(SOLUTION, "solution.py", "exec"), namespace)
        entry = namespace.get(ENTRY_POINT)
        if not callable(entry):
            raise NameError(f"the solution does not define {ENTRY_POINT}")
    except BaseException as e:
        why = "solution failed: " + _describe(e)
        _write(2, (why + "\n").encode(errors="replace"))
        return [["X", why]] * len(calls)
    outputs = []
    for args, kwargs in calls:
        if args is None:
            outputs.append(["X", kwargs])
            continue
        try:
            outputs.append(_encode(entry(*args, **kwargs)))
        except BaseException as e:
            outputs.append(["X", _describe(e)])
    return outputs


_frame = memoryview(("\n" + TAG + " " + _json.dumps(_outputs(_arguments())) + "\n").encode())
try:
    _sys.stdout.flush()
except BaseException:
    pass
while _frame:
    _frame = _frame[_write(1, _frame):]
_exit(0)
'''


def outputs_program(solution: str, task: dict[str, Any], checks: list[Check]) -> str:
    """The sandbox program that calls the entry point of `solution` once per check and writes the
    outputs frame (module docstring). It holds the arguments, never an expected value."""
    header = (
        f"SOLUTION = {solution!r}\nPRELUDE = {task.get('prelude') or ''!r}\n"
        f"ENTRY_POINT = {task['entry_point']!r}\nCALLS = {[c.call for c in checks]!r}\n"
        f"TAG = {OUTPUTS_TAG!r}\nARGS_FN = {ARGS_FN!r}\nMAX_DEPTH = {MAX_DEPTH}\n"
        f"MAX_HEX_DIGITS = {MAX_HEX_DIGITS}\n"
    )
    return header + ENCODER + _HARNESS


# ----------------------------------------------------------------------------- the host side
_HEX_INT = re.compile(rf"-?0x[0-9a-f]{{1,{MAX_HEX_DIGITS}}}")
_HEX_FLOAT = re.compile(r"-?(0x[01]\.[0-9a-f]{1,13}p[+-][0-9]{1,4}|inf|nan)")  # what float.hex writes
_CONTAINERS = {"L": list, "T": tuple, "E": set, "Z": frozenset}


def _refuse_hash_floods(keys: list[Any]) -> None:
    """ValueError when more than MAX_SAME_HASH of `keys` share one hash: a set or dict of them
    costs quadratic time to build (ints k * (2**61 - 1) all hash to 0; 32 000 of them, 1 MB of
    output, take ~9 s, 8 MB minutes), in the host's decoder and the trusted process's alike.
    TypeError for an unhashable key."""
    counts = collections.Counter(hash(k) for k in keys)
    if counts and max(counts.values()) > MAX_SAME_HASH:
        raise ValueError("too many set elements or dict keys of one hash")


def decode_output(data: Any, depth: int = 0) -> Any:
    """The plain value of one tagged output (exact types, nesting <= MAX_DEPTH); a top-level
    `["X", why]` is `Failed(why)`. Raises ValueError when `data` is malformed."""
    if type(data) is not list or not data or type(data[0]) is not str or depth > MAX_DEPTH:
        raise ValueError("malformed output")
    tag, rest = data[0], data[1:]
    if tag == "N" and not rest:
        return None
    if len(rest) != 1:
        raise ValueError("malformed output")
    payload, kind = rest[0], type(rest[0])
    if tag == "X" and depth == 0 and kind is str:
        return Failed(payload[:500])
    if (tag == "B" and kind is bool) or (tag == "S" and kind is str):
        return payload
    if tag == "I" and kind is str and _HEX_INT.fullmatch(payload):
        return int(payload, 16)
    if tag == "F" and kind is str and _HEX_FLOAT.fullmatch(payload):
        try:
            return float.fromhex(payload)
        except OverflowError:
            raise ValueError("malformed float") from None
    if tag in _CONTAINERS and kind is list:
        items = [decode_output(v, depth + 1) for v in payload]
        if tag in "EZ":
            _refuse_hash_floods(items)
        value = _CONTAINERS[tag](items)
        if tag in "EZ" and len(value) != len(items):
            raise ValueError("duplicate set elements")
        return value
    if tag == "D" and kind is list:
        if not all(type(p) is list and len(p) == 2 for p in payload):
            raise ValueError("malformed dict")
        pairs = [(decode_output(k, depth + 1), decode_output(v, depth + 1)) for k, v in payload]
        _refuse_hash_floods([k for k, _ in pairs])
        d = dict(pairs)
        if len(d) != len(payload):
            raise ValueError("duplicate dict keys")
        return d
    raise ValueError("malformed output")


def frame_values(stdout: str, count: int) -> list[Any] | None:
    """The `count` tagged values (JSON, not yet decoded) of the last outputs frame of `stdout`, or
    None when the last frame is missing, cut (no newline), not JSON, too large or holds another
    number of values. Never raises."""
    start = stdout.rfind(f"\n{OUTPUTS_TAG} ")
    end = stdout.find("\n", start + 1) if start >= 0 else -1
    if end < 0 or end - start > MAX_FRAME_CHARS:
        return None
    try:
        values = json.loads(stdout[start + len(OUTPUTS_TAG) + 2 : end])
    except Exception:  # hostile text: RecursionError, ValueError, ...; all mean "no frame"
        return None
    return values if type(values) is list and len(values) == count else None


def parse_outputs(stdout: str, count: int) -> list[Any] | None:
    """The `count` outputs of the last outputs frame of `stdout` (a malformed value becomes
    `Failed`), or None when there is no valid frame (`frame_values`). Never raises."""
    values = frame_values(stdout, count)
    if values is None:
        return None
    outputs: list[Any] = []
    for value in values:
        try:
            outputs.append(decode_output(value))
        except Exception as e:  # unhashable set elements (TypeError), RecursionError, ...
            outputs.append(Failed(f"malformed output ({type(e).__name__})"))
    return outputs


def check_passes(check: Check, output: Any) -> bool:
    """Whether a decoded output satisfies `check`, compared as plain Python values. Never raises."""
    if isinstance(output, Failed):
        return False
    try:
        if check.kind == "eq":
            return bool(output == check.expected)
        if check.kind == "is":
            return output is check.expected
        if check.kind in ("true", "false"):
            return bool(output) is (check.kind == "true")
        if type(output) not in (int, float, bool):
            return False
        return bool(abs(output - check.expected) < check.tol)
    except Exception:  # e.g. OverflowError: an int too large for a float
        return False


TRIVIAL_OUTPUTS: tuple[Any, ...] = (None, True, False, 0, 1, -1, "", [], (), {}, set())
"""What a constant reply returns, for `trivial_tests`: a reply that reads nothing of its input."""


def _call_arguments(call: str) -> list[Any]:
    """The arguments of a check's call (`__posttrain_args__(...)`), positional then by keyword, up
    to the first that is not a constant (`constant`)."""
    node = ast.parse(call, mode="eval").body
    if not isinstance(node, ast.Call):
        return []
    values = []
    for arg in [*node.args, *(k.value for k in node.keywords)]:
        try:
            values.append(constant(arg))
        except Unsupported:
            break
    return values


def shown_tests(task: dict[str, Any], plan: list[list[Check]]) -> list[bool]:
    """Per test, whether the prompt shows it as an example: every call of the test is a `>>> f(...)`
    line of the task's prelude or messages (compared as parsed calls). A reply can pass such a test
    by a lookup of the prompt, without doing the task."""
    entry = task.get("entry_point") or ""
    texts = [task.get("prelude") or ""] + [str(m.get("content", "")) for m in task.get("messages") or []]
    shown = set()
    for line in "\n".join(texts).splitlines():
        line = line.strip()
        if not line.startswith(">>> "):
            continue
        try:
            node = ast.parse(line[4:], mode="eval").body
        except SyntaxError:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry:
            shown.add(ast.unparse(ast.Call(ast.Name(ARGS_FN, ast.Load()), node.args, node.keywords)))
    return [all(ast.unparse(ast.parse(c.call, mode="eval").body) in shown for c in checks) for checks in plan]


def trivial_passes(plan: list[list[Check]], counted: list[bool] | None = None) -> int:
    """How many of the task's tests (those `counted`, default all) the best trivial reply passes: one
    that returns the same constant on every call (any of `TRIVIAL_OUTPUTS` or of the values the task's
    checks expect), or one of its arguments unchanged (the i-th, on every call). `assert
    most_frequent([]) == None` passes `return None`; a yes/no task's `True` or `False` passes every
    test of its answer; the commonest expected value passes every test that expects it. Such passes
    show nothing about whether the reply does the task: the code environment's
    `reward="beyond_trivial"` pays only the tests passed beyond this count."""
    counted = [True] * len(plan) if counted is None else counted
    arguments = [[_call_arguments(c.call) for c in checks] for checks in plan]
    width = min((len(args) for per_test in arguments for args in per_test), default=0)
    outputs = list(TRIVIAL_OUTPUTS) + [c.expected for checks in plan for c in checks if c.kind != "true"]
    candidates: list[Callable[[list[Any]], Any]] = [lambda _args, out=out: out for out in outputs]
    candidates += [lambda args, i=i: args[i] for i in range(width)]
    best = 0
    for reply in candidates:
        passed = sum(
            all(check_passes(c, reply(args)) for c, args in zip(checks, per_test, strict=True))
            for checks, per_test, count in zip(plan, arguments, counted, strict=True)
            if count
        )
        best = max(best, passed)
    return best


def credit(task: dict[str, Any], plan: list[list[Check]]) -> dict[str, Any]:
    """What the code environment's `reward="beyond_trivial"` counts on a host-decided task:
    "credited_tests" (per test: not shown in the prompt as an example, `shown_tests`) and
    "trivial_passes" (how many of those the best trivial reply passes, `trivial_passes`)."""
    credited = [not shown for shown in shown_tests(task, plan)]
    return {"credited_tests": credited, "trivial_passes": trivial_passes(plan, credited)}


def describe_output(output: Any) -> str:
    """A short description of an output for error messages."""
    if isinstance(output, Failed):
        return output.why[:200]
    try:
        return f"returned {output!r}"[:200]
    except ValueError:  # an int past str()'s digit limit
        return f"returned an int of {output.bit_length()} bits" if type(output) is int else "returned a value"
