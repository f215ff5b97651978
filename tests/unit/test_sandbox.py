"""SandboxPool's API: results, stdin, files, exit codes, batches, asyncio, sessions, config, refusal."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pydantic
import pytest
from sandbox_helpers import ISOLATING_BACKENDS, open_pool

from posttrain.config.schema import SandboxConfig
from posttrain.sandbox import SandboxError, SandboxPool, SandboxUnsafeError
from posttrain.sandbox import probe as probe_mod
from posttrain.sandbox.backends import Launch

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    """The pool the config's defaults give (backend auto)."""
    p = open_pool("auto")
    yield p
    p.close()


def test_an_isolating_backend_runs_here() -> None:
    """In CI (CI=true) the sandbox must really run: no silent skip of the whole suite."""
    try:
        with SandboxPool(workers=1) as p:
            prot = p.protections()
    except SandboxError as err:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no isolating sandbox backend on this machine: {err}")
    assert prot["safe"] and prot["network_isolated"] and prot["filesystem_isolated"]
    assert prot["backend"] in ISOLATING_BACKENDS


def test_protections_and_describe(pool: SandboxPool) -> None:
    prot = pool.protections()
    assert prot["backend"] in ISOLATING_BACKENDS and prot["env_scrubbed"] and prot["uid_dropped"]
    assert prot["rlimits"]["max_processes"] == 16
    text = pool.describe()
    assert prot["backend"] in text and "network isolated:    yes" in text


def test_stdout_stdin_and_files(pool: SandboxPool) -> None:
    r = pool.run("print(input()[::-1])", stdin="abc\n")
    assert (r.status, r.stdout, r.exit_code) == ("ok", "cba\n", 0)
    r = pool.run("print(open('data/in.txt').read().upper())", files={"data/in.txt": "hello"})
    assert r.stdout == "HELLO\n"
    r = pool.run("print(1)", files={"/etc/x": "no"})
    assert r.status == "error" and "relative" in r.stderr


def test_large_stdin_is_fed_fully(pool: SandboxPool) -> None:
    data = "x" * 1_000_000
    r = pool.run("import sys\nprint(len(sys.stdin.read()))", stdin=data)
    assert r.stdout == "1000000\n"


@pytest.mark.parametrize(
    ("code", "status", "exit_code", "exception"),
    [
        ("raise SystemExit(0)", "ok", 0, None),
        ("raise SystemExit(3)", "error", 3, "SystemExit"),
        ("raise SystemExit('bad input')", "error", 1, "SystemExit"),
        ("import os\nos._exit(5)", "error", 5, None),
        ("1/0", "error", 1, "ZeroDivisionError"),
        ("def f(:\n  pass", "error", 1, "SyntaxError"),
    ],
)
def test_exit_codes_and_exceptions(
    pool: SandboxPool, code: str, status: str, exit_code: int, exception: str | None
) -> None:
    r = pool.run(code)
    assert (r.status, r.exit_code, r.exception) == (status, exit_code, exception), r


def test_traceback_shows_the_code_not_the_launcher(pool: SandboxPool) -> None:
    r = pool.run("x = 1\nraise ValueError('boom')")
    assert 'File "<sandbox>", line 2' in r.stderr and "ValueError: boom" in r.stderr
    assert "_child" not in r.stderr and "run_code" not in r.stderr


def test_invalid_utf8_output_is_replaced(pool: SandboxPool) -> None:
    r = pool.run("import sys\nsys.stdout.buffer.write(b'a\\xffb')")
    assert r.stdout == "a\ufffdb"


def test_run_many_keeps_order_and_isolates_runs(pool: SandboxPool) -> None:
    codes = [f"import os\nprint({i}, os.listdir('.'))\nopen('f{i}', 'w').close()" for i in range(8)]
    codes[3] = "1/0"
    results = pool.run_many(codes, stdin="")
    assert [r.status for r in results] == ["ok"] * 3 + ["error"] + ["ok"] * 4
    for i, r in enumerate(results):
        if i != 3:
            assert r.stdout == f"{i} []\n"  # a fresh, empty directory every time


def test_run_many_per_program_stdin(pool: SandboxPool) -> None:
    results = pool.run_many(["print(input())"] * 3, stdin=["a", "b", "c"])
    assert [r.stdout for r in results] == ["a\n", "b\n", "c\n"]
    with pytest.raises(ValueError):
        pool.run_many(["print(1)"], stdin=["a", "b"])


def test_arun(pool: SandboxPool) -> None:
    async def main() -> list[str]:
        results = await asyncio.gather(*(pool.arun(f"print({i})") for i in range(4)))
        return [r.stdout for r in results]

    assert asyncio.run(main()) == ["0\n", "1\n", "2\n", "3\n"]


@pytest.mark.parametrize("backend", ISOLATING_BACKENDS)
def test_session_keeps_state_and_recovers_from_a_timeout(backend: str) -> None:
    with open_pool(backend, workers=1) as p, p.session() as s:
        assert s.run("import math\nx = 41").ok
        r = s.run("print(x + 1, input())", stdin="hi")
        assert (r.status, r.stdout) == ("ok", "42 hi\n")
        r = s.run("raise KeyError('k')")
        assert r.status == "error" and r.exception == "KeyError"
        assert s.run("print(math.pi > 3)").stdout == "True\n"  # an error keeps the state
        assert s.run("while True:\n    pass", timeout_s=1).status == "timeout"
        r = s.run("print('x' in dir())")
        assert r.stdout == "False\n" and "restarted" in r.stderr
        assert s.run("print(2)").stdout == "2\n"
    with pytest.raises(SandboxError):
        s.run("print(1)")


def test_session_output_limit_and_files(pool: SandboxPool) -> None:
    with pool.session() as s:
        assert s.run("print(open('a.txt').read())", files={"a.txt": "A"}).stdout == "A\n"
        r = s.run("print('y' * 100_000)")
        assert r.status == "output_limit" and len(r.stdout) == 65536


def test_closed_pool_refuses() -> None:
    p = open_pool("auto", workers=1)
    p.close()
    p.close()  # idempotent
    with pytest.raises(SandboxError):
        p.run("print(1)")


def test_config_is_strict() -> None:
    with pytest.raises(pydantic.ValidationError):
        SandboxConfig(timeout=3)  # the field is timeout_s
    with pytest.raises(pydantic.ValidationError):
        SandboxConfig(workers=0)
    with pytest.raises(pydantic.ValidationError):
        SandboxConfig(backend="docker")


def _fake_selection(monkeypatch: pytest.MonkeyPatch, safe: bool, uid_dropped: bool) -> Launch:
    """Make ``select`` see one candidate with the given probe outcome (no code runs)."""
    launch = Launch("none", (), False, uid_dropped, False, True, False)
    prot = {"safe": safe, "uid_dropped": uid_dropped, "problems": ["network not isolated"]}
    monkeypatch.setattr(probe_mod, "candidates", lambda backend: [launch])
    monkeypatch.setattr(probe_mod, "probe", lambda launch, limits, uid: prot)
    return launch


def test_unsafe_backend_is_refused_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = _fake_selection(monkeypatch, safe=False, uid_dropped=True)
    with pytest.raises(SandboxUnsafeError, match="allow_unsafe"):
        probe_mod.select("auto", False, None, 0)
    with pytest.warns(RuntimeWarning, match="UNSAFE"):
        assert probe_mod.select("auto", True, None, 0)[0] == launch


def test_code_never_runs_as_host_root_even_when_unsafe_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_selection(monkeypatch, safe=False, uid_dropped=False)
    with pytest.raises(SandboxError, match="not even unsafely"):
        probe_mod.select("auto", True, None, 0)


def test_output_just_over_the_limit_at_exit_is_output_limit(pool: SandboxPool) -> None:
    r = pool.run("import sys\nsys.stdout.write('z' * 65537)")
    assert (r.status, r.truncated, len(r.stdout)) == ("output_limit", True, 65536)
    r = pool.run("import sys\nsys.stdout.write('z' * 65536)")
    assert (r.status, r.truncated, len(r.stdout)) == ("ok", False, 65536)
