"""Escape suite: untrusted code tries to get out; each attempt must come back as an error result,
leave nothing behind on the host, and the pool must keep working.

Runs on every isolating backend this machine has (bubblewrap, util-linux unshare); a backend
that cannot isolate here is skipped with the probe's reason. On a cluster node:
    python -m pytest tests/unit/test_sandbox_escapes.py -q
"""

from __future__ import annotations

import os
import secrets
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import (
    ISOLATING_BACKENDS,
    LIMITS,
    assert_healthy,
    leftovers,
    open_pool,
    wait_gone,
)

from posttrain.sandbox import SandboxPool
from posttrain.sandbox.probe import _allowed_children, sensitive_dirs

pytestmark = pytest.mark.timeout(60)
PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=ISOLATING_BACKENDS)
def pool(request: pytest.FixtureRequest) -> Iterator[SandboxPool]:
    """One pool per backend for the whole suite: every attack runs against the same workers."""
    p = open_pool(request.param)
    assert p.protections()["backend"] == request.param
    prot = p.protections()
    # The attacks include kill(-1): never run them without pid namespace and uid drop.
    assert prot["safe"] and prot["pid_namespace"] and prot["uid_dropped"], p.describe()
    yield p
    uids = {s.uid for s in p._slots}
    p.close()
    assert wait_gone(uids) == [], "sandbox processes left after the pool closed"


@pytest.fixture(autouse=True)
def healthy_after(pool: SandboxPool) -> Iterator[None]:
    """After every attack: the next call works and no sandboxed process is left over."""
    yield
    assert_healthy(pool)
    assert leftovers(pool) == [], "processes of an attack outlived it"


def run(pool: SandboxPool, code: str, **kwargs: object):
    """pool.run with dedented code."""
    return pool.run(textwrap.dedent(code), **kwargs)


# ------------------------------------------------------------------ time, memory, processes
def test_infinite_loop_times_out(pool: SandboxPool) -> None:
    r = run(pool, "while True:\n    pass\n", timeout_s=1.5)
    assert r.status == "timeout", r
    assert r.exit_code is None


def test_cpu_limit_stops_a_busy_loop_even_with_a_long_wall_clock(pool: SandboxPool) -> None:
    # cpu_s=3 (RLIMIT_CPU): SIGXCPU long before the 30 s wall clock.
    r = run(pool, "while True:\n    pass\n", timeout_s=30)
    assert r.status == "timeout", r
    assert r.exit_code is not None and r.exit_code < 0  # killed by the kernel, not by us


def test_10gb_allocation_is_a_memory_error(pool: SandboxPool) -> None:
    r = run(pool, "x = bytearray(10 * 1024**3)\nprint('allocated', len(x))")
    assert r.status == "memory", r
    assert "allocated" not in r.stdout
    assert "MemoryError" in r.stderr


def test_fork_bomb_is_contained(pool: SandboxPool) -> None:
    code = """
    import os
    while True:
        try:
            os.fork()
        except OSError:
            pass
    """
    r = run(pool, code, timeout_s=2)
    assert r.status in ("timeout", "error", "killed"), r


def test_fork_bomb_does_not_starve_a_concurrent_run(pool: SandboxPool) -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    # Forks while the bomb holds its whole process quota: each worker slot has a uid of its own.
    fine = textwrap.dedent(
        """
        import os, time
        time.sleep(0.5)
        pids = [os.fork() or os._exit(0) for _ in range(4)]
        print(sorted(os.waitpid(p, 0)[1] for p in pids))
        """
    )
    bomb_result, fine_result = pool.run_many([bomb, fine], timeout_s=4)
    assert bomb_result.status != "ok", bomb_result
    assert (fine_result.status, fine_result.stdout) == ("ok", "[0, 0, 0, 0]\n"), fine_result


def test_process_count_is_limited(pool: SandboxPool) -> None:
    code = """
    import os, time
    n = 0
    try:
        while n < 1000:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
            n += 1
    except OSError as e:
        print(n, type(e).__name__)
        raise
    """
    r = run(pool, code)
    assert r.status == "error", r
    forked = int(r.stdout.split()[0])
    assert forked < LIMITS["max_processes"], r.stdout


# ------------------------------------------------------------------ filesystem
@pytest.fixture
def host_targets(tmp_path: Path) -> Iterator[list[Path]]:
    """Host paths the code will try to create: the test's dir, the project, home, /usr, /etc."""
    name = f"sandbox-escape-{secrets.token_hex(4)}"
    targets = [
        tmp_path / name,
        PROJECT / name,
        Path(os.path.expanduser("~")) / name,
        Path("/usr") / name,
        Path("/etc") / name,
        Path("/dev/shm") / name,
    ]
    yield targets
    for t in targets:
        t.unlink(missing_ok=True)


def test_writes_outside_the_directory_fail_and_never_reach_the_host(
    pool: SandboxPool, host_targets: list[Path]
) -> None:
    for target in host_targets:
        r = run(pool, f"open({str(target)!r}, 'w').write('escaped')")
        assert r.status == "error", (target, r)
        assert r.exception in ("PermissionError", "FileNotFoundError", "OSError"), (target, r)
        assert not target.exists(), f"the sandbox wrote {target} on the host"


def test_writes_inside_the_directory_work_and_stay_there(pool: SandboxPool) -> None:
    name = f"sandbox-inside-{secrets.token_hex(4)}"
    r = run(pool, f"open({name!r}, 'w').write('x'); open('/tmp/{name}', 'w').write('y'); print('ok')")
    assert r.status == "ok", r
    assert not any((Path(d) / name).exists() for d in ("/tmp", "/sandbox", str(PROJECT)))


@pytest.fixture
def secret_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[Path]]]:
    """A fake ~/.ssh key in a HOME-like dir of the test (HOME points there) and one in the project."""
    secret = f"secret-{secrets.token_hex(8)}"
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_rsa"
    key.write_text(secret)
    monkeypatch.setenv("HOME", str(home))
    in_project = PROJECT / f".sandbox-test-secret-{secrets.token_hex(4)}"
    in_project.write_text(secret)
    try:
        yield secret, [key, in_project]
    finally:
        in_project.unlink(missing_ok=True)


def test_reading_ssh_keys_and_project_secrets_fails(
    pool: SandboxPool, secret_files: tuple[str, list[Path]]
) -> None:
    secret, paths = secret_files
    for path in paths:
        for code in (
            f"print(open({str(path)!r}).read())",
            "print(open(os.path.expanduser('~/.ssh/id_rsa')).read())",
        ):
            r = run(pool, "import os\n" + code)
            assert r.status == "error", (path, r)
            assert secret not in r.stdout + r.stderr


def test_project_and_home_are_not_visible(pool: SandboxPool) -> None:
    for path in (
        PROJECT / "pyproject.toml",
        PROJECT / "src" / "posttrain" / "__init__.py",
        Path("/etc/shadow"),
    ):
        r = run(pool, f"print(open({str(path)!r}).read())")
        assert r.status == "error", (path, r)
    # The parent's home, /root, /home, the project and the parent's cwd show nothing of the host
    # (only the directories leading to the interpreter's read-only prefix, if it lives there).
    for d in sensitive_dirs():
        r = run(pool, f"import os\nprint(os.listdir({d!r}) if os.path.isdir({d!r}) else [])")
        assert r.status in ("ok", "error"), r
        seen = set(eval(r.stdout)) if r.status == "ok" else set()  # noqa: S307 - a list literal
        host = set(os.listdir(d))
        assert (seen & host) <= _allowed_children(d), (d, seen & host)


# ------------------------------------------------------------------ network
def test_connect_to_a_listening_localhost_socket_fails(pool: SandboxPool) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        r = run(
            pool, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')"
        )
        assert r.status == "error", r
        assert r.exception in ("ConnectionRefusedError", "OSError", "TimeoutError"), r
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing reached the host's loopback


def test_connect_to_an_outside_address_has_no_route(pool: SandboxPool) -> None:
    # 192.0.2.1 is TEST-NET-1 (documentation only); with no route nothing is sent anywhere.
    r = run(pool, "import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=5)")
    assert r.status == "error", r
    assert "unreachable" in r.stderr.lower(), r.stderr


def test_dns_and_udp_fail(pool: SandboxPool) -> None:
    r = run(pool, "import socket\nsocket.getaddrinfo('pypi.org', 443)")
    assert r.status == "error", r
    r = run(
        pool,
        "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('192.0.2.1', 53))",
    )
    assert r.status == "error", r


# ------------------------------------------------------------------ processes of the host
def test_killing_the_parent_does_not_hurt_the_pool(pool: SandboxPool) -> None:
    r = run(
        pool,
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\nraise SystemExit(3)",
    )
    assert r.status in ("error", "killed"), r


def test_killing_pool_workers_by_pid_fails(pool: SandboxPool) -> None:
    with pool.session() as session:
        assert session.run("x = 1").ok
        pids = [os.getpid(), session._proc.popen.pid]
        pids += [s.future.result().popen.pid for s in pool._slots if s.future is not None]
        code = "import os, signal\nfor pid in PIDS:\n    os.kill(pid, signal.SIGKILL)\n"
        r = run(pool, code.replace("PIDS", repr(pids)))
        assert r.status == "error", r
        assert r.exception in ("ProcessLookupError", "PermissionError"), r
        for pid in pids[:2]:  # (one of the spares was the process that ran the attack)
            os.kill(pid, 0)  # still alive
        assert session.run("print(x)").stdout == "1\n"


# ------------------------------------------------------------------ output, environment, crashes
def test_printing_100mb_is_cut_and_killed(pool: SandboxPool) -> None:
    r = run(pool, "import sys\nsys.stdout.write('x' * 100_000_000)")
    assert r.status == "output_limit", r.status
    assert r.truncated and len(r.stdout) == LIMITS["max_output_bytes"]


def test_printing_forever_to_stderr_is_cut_and_killed(pool: SandboxPool) -> None:
    r = run(pool, "import sys\nwhile True:\n    print('y' * 1000, file=sys.stderr)")
    assert r.status == "output_limit", r.status
    assert len(r.stderr) == LIMITS["max_output_bytes"]


def test_environment_secrets_are_not_visible(pool: SandboxPool, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"secret-{secrets.token_hex(8)}"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    if True:  # a pool started after the secrets were set
        with open_pool(pool.config.backend, workers=1) as fresh:
            r = fresh.run("import os\nprint(os.environ['HF_TOKEN'])")
            assert r.status == "error" and r.exception == "KeyError", r
            dump = (
                "import os, glob\nprint(dict(os.environ))\n"
                "for f in glob.glob('/proc/*/environ'):\n"
                "    try:\n        print(open(f, 'rb').read())\n    except OSError:\n        pass\n"
            )
            r = fresh.run(dump)
            assert r.status == "ok", r
            assert secret not in r.stdout + r.stderr
            assert "HF_TOKEN" not in r.stdout


def test_segfault_in_a_c_call_is_a_killed_result(pool: SandboxPool) -> None:
    r = run(pool, "import ctypes\nctypes.string_at(0)")
    assert r.status == "killed", r
    assert r.exit_code == -11
