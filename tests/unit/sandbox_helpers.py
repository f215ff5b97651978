"""Shared by the sandbox tests: a pool per isolating backend, and a scan for leftover processes."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest

from posttrain.sandbox import SandboxError, SandboxPool, SandboxUnsafeError
from posttrain.sandbox.backends import UID_BASE

ISOLATING_BACKENDS = ["bwrap", "unshare"]
LIMITS = dict(workers=2, timeout_s=3.0, cpu_s=3, memory_mb=512, max_output_bytes=65536, max_processes=16)


def open_pool(backend: str, **overrides: object) -> SandboxPool:
    """A pool on ``backend``, or a skip saying why this machine cannot isolate with it."""
    try:
        return SandboxPool(backend=backend, **{**LIMITS, **overrides})
    except (SandboxError, SandboxUnsafeError) as err:
        pytest.skip(f"sandbox backend {backend} is not usable here: {str(err)[:500]}")


def sandbox_pids(uids: set[int] | None = None) -> list[int]:
    """Host pids of processes running under a sandbox uid (or one of ``uids``)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                uid = os.stat(f"/proc/{name}").st_uid
            except OSError:
                continue
            if uid in uids if uids is not None else UID_BASE <= uid < UID_BASE + 500_000_000:
                out.append(int(name))
    return out


def wait_gone(uids: set[int], timeout_s: float = 10.0) -> list[int]:
    """Wait (bounded) until no process runs under ``uids``; return what is left."""
    end = time.monotonic() + timeout_s
    while (pids := sandbox_pids(uids)) and time.monotonic() < end:
        time.sleep(0.05)
    return pids


def _ppid(pid: int) -> int:
    """The parent pid of ``pid`` (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def leftovers(pool: SandboxPool, timeout_s: float = 10.0) -> list[int]:
    """Processes of the pool's uids that are not (under) one of its waiting spares (bounded wait)."""
    spares = {s.future.result().popen.pid for s in pool._slots if s.future is not None}
    uids = pool.recent_uids()
    end = time.monotonic() + timeout_s
    while True:
        stray = []
        for pid in sandbox_pids(uids):
            chain, p = set(), pid
            for _ in range(8):
                p = _ppid(p)
                chain.add(p)
            if not chain & spares:
                stray.append(pid)
        if not stray or time.monotonic() > end:
            return stray
        time.sleep(0.05)


def assert_healthy(pool: SandboxPool) -> None:
    """The next call works: a fresh interpreter computes and prints."""
    result = pool.run("print(6 * 7)")
    assert result.status == "ok", result
    assert result.stdout == "42\n"


@functools.cache
def syscall_numbers() -> dict[str, int]:
    """This machine's syscall numbers, from libseccomp where it is installed (independent of the
    table posttrain's filter is built from), else from that table."""
    from posttrain.sandbox.seccomp import NUMBERS

    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return dict(NUMBERS)
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    found = {name: lib.seccomp_syscall_resolve_name(name.encode()) for name in NUMBERS}
    return {name: nr if nr >= 0 else NUMBERS[name] for name, nr in found.items()}  # newer than it


_SYSCALL_PRELUDE = """
import ctypes, json, os
NR = json.loads(%r)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sys_call(name, *args):
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(NR[name]), *conv)
    return ret, (ctypes.get_errno() if ret < 0 else 0)
"""


def syscall_code(body: str) -> str:
    """Sandbox code with ``sys_call(name, *args) -> (return value, errno)`` for raw syscalls."""
    return _SYSCALL_PRELUDE % json.dumps(syscall_numbers()) + textwrap.dedent(body)


_REPLY_PIPE_PRELUDE = """
import json, os, sys
def reply_pipe():
    # What hostile code can find by walking its own frames: the fd the launcher replies on and
    # the request it is answering (with its nonce, if it has one).
    fd, nonce, f = None, None, sys._getframe()
    while f is not None:
        for name, value in f.f_locals.items():
            if name == "resp_fd":
                fd = value
            if isinstance(value, dict) and "nonce" in value:
                nonce = value["nonce"]
        f = f.f_back
    return fd, nonce
def frame(message):
    data = message if isinstance(message, bytes) else json.dumps(message).encode()
    return len(data).to_bytes(8, "big") + data
FD, NONCE = reply_pipe()
"""


def forger_code(body: str) -> str:
    """Sandbox code with ``FD`` (the reply pipe), ``NONCE`` (the request's) and ``frame(msg)``."""
    return _REPLY_PIPE_PRELUDE + textwrap.dedent(body)


def started(env: Any) -> Iterator[Any]:
    """Yield ``env`` (a sandboxed environment) with its pool started, then close it; a skip where no
    sandbox backend isolates here, and a failure in CI, where one always must."""
    try:
        env.pool()
    except SandboxError as err:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no isolating sandbox backend here: {err}")
    yield env
    env.close()


def code_reply(code: str) -> list[dict]:
    """A conversation whose assistant turn is ``code`` in a ```python block."""
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"```python\n{code}```"}]
