"""Escape suite: untrusted code tries to get out; each attempt must come back as an error result,
leave nothing behind on the host, and the pool must keep working.

Runs on every isolating backend this machine has (bubblewrap, util-linux unshare); a backend
that cannot isolate here is skipped with the probe's reason. On a cluster node:
    python -m pytest tests/unit/test_sandbox_escapes.py -q
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import (
    ISOLATING_BACKENDS,
    LIMITS,
    assert_healthy,
    forger_code,
    leftovers,
    open_pool,
    syscall_code,
    syscall_numbers,
    wait_gone,
)

from posttrain.sandbox import SandboxPool
from posttrain.sandbox.backends import UID_BASE
from posttrain.sandbox.probe import _allowed_children, sensitive_dirs

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]  # starts sandbox processes
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
    uids = p.recent_uids()
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
    # Forks while the bomb holds its whole process quota: each run has a uid of its own.
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


# ------------------------------------------------------------------ kernel keyrings (#29 item 13)
STORE_KEYS = """
for ring, spec in (("session", -3), ("user", -4)):  # KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING
    print(ring, *sys_call("add_key", b"user", (DESC + ring).encode(), b"payload", 7, spec))
"""
FIND_KEYS = """
found = []
for ring, spec in (("session", -3), ("user", -4)):
    for name in ("session", "user"):
        if sys_call("keyctl", 10, spec, b"user", (DESC + name).encode(), 0)[0] >= 0:  # KEYCTL_SEARCH
            found.append([ring, name])
try:
    if DESC in open("/proc/keys").read():
        found.append("/proc/keys")
except OSError:
    pass
print(json.dumps(found))
"""


def test_keys_of_one_run_are_not_seen_by_later_runs_or_another_pool(pool: SandboxPool) -> None:
    # The keyring layer alone (seccomp off, or keyctl is simply refused): a run stores a key in
    # its session and its user keyring; no later run of the pool (both worker slots, a session)
    # and no run of another pool finds either.
    desc = f"DESC = 'posttrain-leak-{secrets.token_hex(4)}-'\n"
    with (
        open_pool(pool.config.backend, seccomp=False) as p,
        open_pool(pool.config.backend, seccomp=False, workers=1) as other,
    ):
        r = p.run(syscall_code(desc + STORE_KEYS))
        stored = [line.split() for line in r.stdout.splitlines()]
        assert r.status == "ok" and [(x[0], int(x[1]) > 0) for x in stored] == [
            ("session", True),
            ("user", True),
        ], r
        find = syscall_code(desc + FIND_KEYS)
        results = [p.run(find) for _ in range(4)] + [other.run(find)]
        with p.session() as s:
            results.append(s.run(find))
        for r in results:
            assert (r.status, json.loads(r.stdout)) == ("ok", []), r


PARENT_WITH_A_KEYRING = """
import ctypes, json, sys
from posttrain.sandbox import SandboxPool
nr = json.loads(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
assert libc.syscall(L(nr["keyctl"]), L(1), None) > 0  # KEYCTL_JOIN_SESSION_KEYRING: one of its own
key = libc.syscall(L(nr["add_key"]), b"user", b"posttrain-parent-secret", b"s3cret-payload", L(14), L(-3))
ring = libc.syscall(L(nr["keyctl"]), L(0), L(-3), L(0))  # KEYCTL_GET_KEYRING_ID
assert key > 0 and ring > 0
code = sys.argv[3].replace("KEY_SERIAL", str(key))
with SandboxPool(backend=sys.argv[1], workers=1, seccomp=False) as pool:
    r = pool.run(code)
print(json.dumps({"ring": ring, "status": r.status, "stdout": r.stdout, "stderr": r.stderr}))
"""
REACH_PARENT_KEY = """
buf = ctypes.create_string_buffer(64)
out = {
    "ring": sys_call("keyctl", 0, -3, 0)[0],
    "read": sys_call("keyctl", 11, KEY_SERIAL, buf, 64)[0],  # KEYCTL_READ
    "search": sys_call("keyctl", 10, -3, b"user", b"posttrain-parent-secret", 0)[0],
    "payload": buf.value.decode(errors="replace"),
}
try:
    out["proc_keys"] = "posttrain-parent-secret" in open("/proc/keys").read()
except OSError:
    out["proc_keys"] = False
print(json.dumps(out))
"""


def test_the_parents_session_keyring_is_not_reachable(pool: SandboxPool) -> None:
    # A parent process with a session keyring (systemd services, su -l, containers have one)
    # holding a secret key starts a pool: the sandbox has a session keyring of its own and can
    # neither read, find nor list the parent's key.
    argv = [sys.executable, "-c", PARENT_WITH_A_KEYRING, pool.config.backend]
    argv += [json.dumps(syscall_numbers()), syscall_code(REACH_PARENT_KEY)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent = json.loads(proc.stdout.splitlines()[-1])
    assert parent["status"] == "ok", parent
    inside = json.loads(parent["stdout"])
    assert inside["ring"] > 0 and inside["ring"] != parent["ring"], inside
    assert (inside["read"], inside["search"], inside["proc_keys"]) == (-1, -1, False), inside
    assert "s3cret" not in parent["stdout"] + parent["stderr"]


def test_every_run_and_session_has_a_uid_of_its_own(pool: SandboxPool) -> None:
    get_uid = "import os\nprint(os.getuid())"
    uids = [int(pool.run(get_uid).stdout) for _ in range(4)]
    uids += [int(r.stdout) for r in pool.run_many([get_uid] * 4)]
    with pool.session() as s:
        uids.append(int(s.run(get_uid).stdout))
    with open_pool(pool.config.backend, workers=1) as other:
        uids.append(int(other.run(get_uid).stdout))
    assert len(set(uids)) == len(uids), uids


# ------------------------------------------------------------------ syscall filter (#29 item 14)
# Arguments that an unfiltered kernel would answer with success or another errno where it can
# (a raw clone is followed by _exit in the child, should it ever succeed).
DENIED_CALLS = """
args = {
    "keyctl": (0, -3, 0),  # KEYCTL_GET_KEYRING_ID of the session keyring: works unfiltered
    "add_key": (b"user", b"posttrain-probe", b"x", 1, -3),
    "request_key": (b"user", b"posttrain-no-such-key", None, 0),
    "ptrace": (2, 999999, 0, 0),  # PTRACE_PEEKDATA of no process: ESRCH unfiltered
    "userfaultfd": (1,),  # UFFD_USER_MODE_ONLY: allowed to anyone unfiltered
    "unshare": (0x10000000,),  # CLONE_NEWUSER: a nested user namespace unfiltered
    "setns": (-1, 0),
    "io_uring_setup": (1, None),
    "io_uring_enter": (-1, 0, 0, 0, None, 0),
    "io_uring_register": (-1, 0, None, 0),
    "perf_event_open": (None, 0, -1, -1, 0),
}
errnos = {name: sys_call(name, *args.get(name, (0, 0, 0, 0, 0)))[1] for name in DENIED}
for flag in (0x80, 0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
    ret, err = sys_call("clone", flag | 17, 0, 0, 0, 0)  # CLONE_NEW* | SIGCHLD
    if ret == 0:
        os._exit(0)
    if ret > 0:
        os.waitpid(ret, 0)
    errnos[f"clone {flag:#x}"] = err
errnos["clone3"] = sys_call("clone3", None, 0)[1]
errnos["seccomp mode"] = [x for x in open("/proc/self/status") if x.startswith("Seccomp:")][0].split()[1]
print(json.dumps(errnos))
"""


def test_denied_syscalls_get_eperm_and_clone3_enosys(pool: SandboxPool) -> None:
    from posttrain.sandbox.seccomp import DENIED

    r = run(pool, syscall_code(f"DENIED = {list(DENIED)!r}\n" + DENIED_CALLS))
    assert r.status == "ok", r
    got = json.loads(r.stdout)
    want = {name: 1 for name in DENIED} | {k: 1 for k in got if k.startswith("clone 0x")}
    want |= {"clone3": 38, "seccomp mode": "2"}  # ENOSYS: glibc falls back to clone
    assert got == want
    assert pool.protections()["seccomp"] is True
    assert "seccomp:             yes" in pool.describe()


def test_no_nested_user_namespace(pool: SandboxPool) -> None:
    code = """
    import os
    if hasattr(os, "unshare"):  # Python 3.12+
        os.unshare(os.CLONE_NEWUSER)
    else:
        ret, err = sys_call("unshare", 0x10000000)
        if ret < 0:
            raise PermissionError(err, os.strerror(err))
    print(open("/proc/self/uid_map").read())
    """
    r = run(pool, syscall_code(code))
    assert (r.status, r.exception) == ("error", "PermissionError"), r
    assert "Operation not permitted" in r.stderr


def test_threads_subprocesses_and_fork_still_work_under_the_filter(pool: SandboxPool) -> None:
    code = """
    import multiprocessing, subprocess, sys, threading
    from concurrent.futures import ThreadPoolExecutor
    seen = []
    t = threading.Thread(target=seen.append, args=(1,))
    t.start()
    t.join()
    with ThreadPoolExecutor(2) as ex:
        seen += list(ex.map(abs, [-2, -3]))
    out = subprocess.run([sys.executable, "-I", "-S", "-c", "print(6 * 7)"], capture_output=True, text=True)
    ctx = multiprocessing.get_context("fork")
    a, b = ctx.Pipe()
    child = ctx.Process(target=lambda conn: conn.send(sum(range(10))), args=(b,))
    child.start()
    got = a.recv()
    child.join()
    print(seen, out.stdout.strip(), got, child.exitcode)
    """
    r = run(pool, code)
    assert (r.status, r.stdout) == ("ok", "[1, 2, 3] 42 45 0\n"), r


# ------------------------------------------------------------------ forged verdicts (#29 item 15)
def test_a_forged_ok_reply_does_not_hide_the_exit_status(pool: SandboxPool) -> None:
    forged = 'os.write(FD, frame({"nonce": NONCE, "exit": 0, "exc": None}))\n'
    r = run(pool, forger_code(forged + "os._exit(7)"))
    assert (r.status, r.exit_code, r.exception) == ("error", 7, None), r
    r = run(pool, forger_code(forged + "raise SystemExit(3)"))
    assert (r.status, r.exit_code) == ("error", 3), r
    r = run(pool, forger_code(forged + "import ctypes\nctypes.string_at(0)"))
    assert (r.status, r.exit_code) == ("killed", -11), r


MALFORMED = {
    "no length header": "os.write(FD, b'\\xff' * 40)",
    "not json": "os.write(FD, frame(b'not json {'))",
    "exit is a string": "os.write(FD, frame({'nonce': NONCE, 'exit': '0', 'exc': None}))",
    "exit is a list": "os.write(FD, frame({'nonce': NONCE, 'exit': [0], 'exc': None}))",
    "exit is a bool": "os.write(FD, frame({'nonce': NONCE, 'exit': True, 'exc': None}))",
    "exit is infinite": 'os.write(FD, frame(b\'{"nonce": "%s", "exit": 1e999, "exc": null}\' % str(NONCE).encode()))',
    "exit is huge": "os.write(FD, frame({'nonce': NONCE, 'exit': 10**30, 'exc': None}))",
    "4300-digit int": "os.write(FD, frame(b'{\"exit\": ' + b'9' * 4300 + b'}'))",
    "nested 4000 deep": "os.write(FD, frame(b'[' * 4000))",
    "a list": "os.write(FD, frame([0, 'ok']))",
    "fields missing": "os.write(FD, frame({'nonce': NONCE}))",
    "exc is a dict": "os.write(FD, frame({'nonce': NONCE, 'exit': 0, 'exc': {'a': 1}}))",
    "length 2**63": "os.write(FD, (2**63).to_bytes(8, 'big') + b'{}')",
    "a second reply": "os.write(FD, frame({'nonce': NONCE, 'exit': 0, 'exc': None}))",
}


def test_malformed_replies_are_an_ordinary_error_result(pool: SandboxPool) -> None:
    # Each program writes its bad frame, then ends normally (exit 0, the launcher's own reply
    # follows). run_many must return, not raise; each is an error; the good program is not.
    codes = [forger_code(body + "\nprint('done')") for body in MALFORMED.values()] + ["print('done')"]
    results = pool.run_many(codes)
    for name, r in zip([*MALFORMED, "good"], results, strict=True):
        expected = ("ok", 0) if name == "good" else ("error", 0)
        assert (r.status, r.exit_code, r.stdout) == (*expected, "done\n"), (name, r)
        assert ("response pipe" in r.stderr) == (name != "good"), (name, r)


def test_malformed_session_replies_are_an_error_and_the_session_recovers(pool: SandboxPool) -> None:
    with pool.session() as s:
        for name in ("exit is a string", "exit is infinite", "nested 4000 deep", "length 2**63"):
            assert s.run("x = 1").ok
            r = s.run(forger_code(MALFORMED[name]))
            assert (r.status, r.exit_code) == ("error", None) and "response pipe" in r.stderr, (name, r)
            r = s.run("print('x' in dir())")  # the session was killed: a fresh interpreter
            assert (r.status, r.stdout) == ("ok", "False\n") and "restarted" in r.stderr, (name, r)


def test_stale_frames_of_an_earlier_cell_do_not_decide_a_later_one(pool: SandboxPool) -> None:
    with pool.session() as s:
        # Cell 1 forges its own reply (it can: the session's interpreter is its own), so the real
        # reply arrives after it: cell 2 must get its own verdict, not that leftover.
        r = s.run(forger_code('os.write(FD, frame({"nonce": NONCE, "exit": 0, "exc": None}))\n1/0'))
        assert r.status == "ok"  # documented: a session cell reports about itself
        r = s.run("raise SystemExit(3)")
        assert (r.status, r.exit_code, r.exception) == ("error", 3, "SystemExit"), r
        # A thread of cell 3 writes an "ok" reply with cell 3's nonce while cell 4 runs.
        late = """
        import threading, time
        def later():
            time.sleep(0.5)
            print("late output")
            os.write(FD, frame({"nonce": NONCE, "exit": 0, "exc": None}))
        threading.Thread(target=later, daemon=True).start()
        """
        assert s.run(forger_code(late)).ok
        r = s.run("import time\ntime.sleep(1.5)\nprint('cell 4')\nraise SystemExit(3)")
        assert (r.status, r.exit_code, r.exception) == ("error", 3, "SystemExit"), r
        assert r.stdout.endswith("cell 4\n")  # (the thread's buffered print may be flushed with it)
        # A frame that answers no cell of this session is not a stale one: the cell is an error.
        r = s.run(forger_code('os.write(FD, frame({"nonce": "0" * 32, "exit": 0, "exc": None}))'))
        assert (r.status, r.exit_code) == ("error", None) and "response pipe" in r.stderr, r


# ------------------------------------------------------------------ hostname and cgroups (#29 item 16)
def test_hostname_and_cgroup_namespace_are_the_sandboxes_own(pool: SandboxPool) -> None:
    r = run(pool, "import socket\nprint(socket.gethostname())\nprint(open('/proc/self/cgroup').read())")
    assert r.status == "ok", r
    hostname, *cgroups = [line for line in r.stdout.splitlines() if line]
    assert hostname == "sandbox" != socket.gethostname()
    assert cgroups and all(line.endswith(":/") for line in cgroups), cgroups  # "0::/" on cgroup v2


def test_code_has_no_capabilities(pool: SandboxPool) -> None:
    # Both CI launches (root parent) drop to a uid of their own: no capability is left to use,
    # and none can be regained (no_new_privs, no nested user namespace: see the seccomp tests).
    r = run(pool, "print(*[x for x in open('/proc/self/status') if x.startswith(('CapEff', 'CapPrm'))])")
    assert pool.protections()["host_uid"] >= UID_BASE, pool.describe()
    assert r.stdout.split() == ["CapPrm:", "0000000000000000", "CapEff:", "0000000000000000"], r
