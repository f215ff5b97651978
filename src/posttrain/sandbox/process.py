"""One sandboxed interpreter: start it, hand it code, collect its output within the limits, kill it."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Literal

from posttrain.sandbox.backends import (
    CHILD_SOURCE,
    WORKDIR,
    Launch,
    command,
    filesystem_ops,
    scrubbed_env,
)

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "killed"]
_READY_TIMEOUT_S = 30.0
_DRAIN_S = 0.5


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start a worker): not the code's fault, don't score it."""


@dataclass
class ExecResult:
    """How one run of untrusted code ended.

    status: "ok" (exit 0), "error" (exception or non-zero exit), "timeout" (wall clock or CPU
    limit), "memory" (MemoryError under the address-space limit), "output_limit" (a stream passed
    max_output_bytes; killed), "killed" (died by a signal, e.g. a segfault).
    stdout / stderr: decoded UTF-8 (invalid bytes replaced), each cut to max_output_bytes.
    exit_code: the exit status; minus the signal number when killed by one; None when we killed it.
    """

    status: Status
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    wall_s: float = 0.0
    truncated: bool = False
    exception: str | None = None

    @property
    def ok(self) -> bool:
        """Exit status 0 within every limit."""
        return self.status == "ok"


@dataclass
class Limits:
    """The numbers a child runs under (from SandboxConfig)."""

    timeout_s: float
    cpu_s: int
    memory_mb: int
    max_output_bytes: int
    max_processes: int
    max_open_files: int
    max_file_mb: int
    disk_mb: int

    def rlimits(self, session: bool) -> dict[str, list[int]]:
        """[soft, hard] per rlimit; a session's CPU hard limit covers many cells."""
        cpu_hard = self.cpu_s * 20 if session else self.cpu_s + 1
        mb = 1024 * 1024
        return {
            "cpu": [self.cpu_s, cpu_hard],
            "as": [self.memory_mb * mb] * 2,
            "fsize": [self.max_file_mb * mb] * 2,
            "nproc": [self.max_processes] * 2,
            "nofile": [self.max_open_files] * 2,
            "core": [0, 0],
        }


def frame(message: dict) -> bytes:
    """8-byte big-endian length + JSON (the request/response format of ``_child.py``)."""
    data = json.dumps(message).encode()
    return len(data).to_bytes(8, "big") + data


@dataclass
class _Streams:
    """Output collected from one run, capped."""

    cap: int
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    resp: bytearray = field(default_factory=bytearray)
    over: bool = False

    def add(self, which: str, data: bytes) -> None:
        """Append, keeping at most ``cap`` bytes per output stream (``over`` once one passes it)."""
        buf = getattr(self, which)
        if which == "resp":
            if len(buf) < 1 << 20:  # untrusted: the code can write here too
                buf += data
            return
        room = self.cap - len(buf)
        if len(data) > room:
            self.over = True
        buf += data[: max(room, 0)]

    def message(self) -> dict | None:
        """The first complete framed response, removed from the buffer (None if none yet)."""
        if len(self.resp) < 8:
            return None
        n = int.from_bytes(self.resp[:8], "big")
        if len(self.resp) < 8 + n:
            return None
        raw = bytes(self.resp[8 : 8 + n])
        del self.resp[: 8 + n]
        try:
            msg = json.loads(raw)
        except ValueError:
            return {"exit": 1, "exc": "garbled"}
        return msg if isinstance(msg, dict) else {"exit": 1, "exc": "garbled"}

    def reset(self) -> None:
        """Start a new cell (session)."""
        self.out.clear()
        self.err.clear()
        self.over = False


class SandboxProcess:
    """A started sandboxed interpreter, waiting for its request (``once`` or ``session`` mode)."""

    def __init__(self, launch: Launch, limits: Limits, uid: int, mode: str) -> None:
        """Spawn the child and wait until it reports ready (raises SandboxError otherwise)."""
        self.launch, self.limits, self.mode = launch, limits, mode
        self.host_dir: str | None = None
        self.streams = _Streams(limits.max_output_bytes)
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        try:
            self.popen = self._spawn(uid, req_r, resp_w)
        finally:
            os.close(req_r)
            os.close(resp_w)
        self.pidfd = _pidfd(self.popen.pid)
        for fd in (self.popen.stdout.fileno(), self.popen.stderr.fileno(), self.resp_r):
            os.set_blocking(fd, False)
        self._wait_ready()

    def _spawn(self, uid: int, req_r: int, resp_w: int) -> subprocess.Popen:
        """Popen the wrapper + interpreter with the spec for ``_child.main``."""
        launch = self.launch
        workdir = WORKDIR
        if launch.backend == "none":  # no private tmpfs: a host directory of its own
            self.host_dir = workdir = tempfile.mkdtemp(prefix="posttrain-sandbox-")
            if launch.child_drops_uid:
                os.chown(workdir, uid, uid)
        spec = {
            "req_fd": req_r,
            "resp_fd": resp_w,
            "mode": self.mode,
            "workdir": workdir,
            "uid": uid if launch.child_drops_uid else None,
            "no_new_privs": launch.no_new_privs,
            "limits": self.limits.rlimits(self.mode == "session"),
            "cell_cpu_s": self.limits.cpu_s,
            "layout": _layout(self.limits) if launch.child_builds_root else None,
            "init": launch.backend == "unshare",  # bwrap has an init of its own
        }
        argv = [*command(launch, self.limits.disk_mb << 20), "-c", CHILD_SOURCE, json.dumps(spec)]
        extra = {"user": uid, "group": uid, "extra_groups": []} if launch.wrapper_as_slot_uid else {}
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if self.mode == "once" else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(req_r, resp_w),
            env=scrubbed_env(workdir),
            cwd=self.host_dir or "/",
            start_new_session=True,
            **extra,
        )

    def _wait_ready(self) -> None:
        """Block until the child wrote ``R`` (set up and limited), else kill it and raise."""
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            ready = _select_read([self.resp_r, self.pidfd], left)
            if self.resp_r in ready:
                try:
                    if os.read(self.resp_r, 1) == b"R":
                        return
                except BlockingIOError:
                    continue
                break
            if self.pidfd in ready:
                break
        err = self._read_all_stderr()
        self.kill()
        raise SandboxError(
            f"the {self.launch.backend} sandbox did not start (exit {self.popen.returncode}): "
            f"{err.strip()[-2000:]}"
        )

    def _read_all_stderr(self) -> str:
        """Whatever the dead/failed child wrote to stderr (for the error message)."""
        try:
            self.popen.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.kill()
        try:
            return os.read(self.popen.stderr.fileno(), 65536).decode(errors="replace")
        except (BlockingIOError, OSError, ValueError):
            return ""

    def alive(self) -> bool:
        """Still running (a spare that died while waiting must be replaced)."""
        return self.popen.poll() is None

    def run_once(self, code: str, stdin: str, files: dict[str, str] | None, timeout_s: float) -> ExecResult:
        """Send the program, feed stdin, collect until it exits or a limit is hit; then kill all."""
        start = time.monotonic()
        request = frame({"code": code, "files": files or {}})
        try:
            _write_all(self.req_w, request)
            os.close(self.req_w)
        except OSError:
            pass
        self.req_w = -1
        reason = self._pump(start + timeout_s, stdin.encode(), want_response=False)
        self.kill()
        return self._result(reason, self.streams.message(), time.monotonic() - start)

    def run_cell(self, code: str, stdin: str, files: dict[str, str] | None, timeout_s: float) -> ExecResult:
        """Session: send one cell, collect until its response; kill the session on a limit."""
        start = time.monotonic()
        self.streams.reset()
        try:
            _write_all(self.req_w, frame({"code": code, "stdin": stdin, "files": files or {}}))
        except OSError:
            pass
        reason = self._pump(start + timeout_s, b"", want_response=True)
        msg = self.streams.message() if reason == "response" else None
        if reason != "response":
            self.kill()
            msg = msg or self.streams.message()
        return self._result(reason, msg, time.monotonic() - start)

    def _pump(self, deadline: float, stdin: bytes, want_response: bool) -> str:
        """Move bytes until: "response" (session cell done), "exited", "timeout" or "output_limit"."""
        sel = selectors.DefaultSelector()
        out_fd, err_fd = self.popen.stdout.fileno(), self.popen.stderr.fileno()
        names = {out_fd: "out", err_fd: "err", self.resp_r: "resp"}
        for fd in names:
            sel.register(fd, selectors.EVENT_READ)
        sel.register(self.pidfd, selectors.EVENT_READ)
        pending = memoryview(stdin)
        if self.mode == "once" and self.popen.stdin is not None:
            in_fd = self.popen.stdin.fileno()
            os.set_blocking(in_fd, False)
            if pending:
                sel.register(in_fd, selectors.EVENT_WRITE)
            else:
                self._close_stdin()
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                for key, _ in sel.select(left):
                    fd = key.fd
                    if fd == self.pidfd:
                        self._drain(names)
                        return "output_limit" if self.streams.over else "exited"
                    if fd in names:
                        if not self._read(fd, names[fd], sel):
                            continue
                        if self.streams.over:
                            return "output_limit"
                        if want_response and names[fd] == "resp" and self._has_message():
                            self._drain(names)
                            return "output_limit" if self.streams.over else "response"
                    else:  # stdin writable
                        pending = self._feed(in_fd, pending, sel)
        finally:
            sel.close()

    def _read(self, fd: int, name: str, sel: selectors.BaseSelector) -> bool:
        """Read what is there; unregister on EOF. Returns whether data came."""
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            sel.unregister(fd)
            return False
        self.streams.add(name, data)
        return True

    def _feed(self, in_fd: int, pending: memoryview, sel: selectors.BaseSelector) -> memoryview:
        """Write the next piece of stdin; close it when all is written or the reader is gone."""
        try:
            n = os.write(in_fd, pending[: 1 << 16])
            pending = pending[n:]
        except BlockingIOError:
            return pending
        except OSError:
            pending = pending[:0]
        if not pending:
            sel.unregister(in_fd)
            self._close_stdin()
        return pending

    def _close_stdin(self) -> None:
        """EOF on the child's stdin."""
        try:
            self.popen.stdin.close()
        except OSError:
            pass

    def _has_message(self) -> bool:
        """A complete framed response is buffered."""
        resp = self.streams.resp
        return len(resp) >= 8 and len(resp) >= 8 + int.from_bytes(resp[:8], "big")

    def _drain(self, names: dict[int, str]) -> None:
        """Take what is already in the pipes (written before the exit/response), briefly."""
        if self.mode == "once":
            self._kill_group()  # leftovers (none backend) must not hold the pipes open
        end = time.monotonic() + _DRAIN_S
        open_fds = set(names)
        while open_fds and time.monotonic() < end:
            ready = _select_read(list(open_fds), end - time.monotonic() if self.mode == "once" else 0)
            if not ready:
                break
            for fd in ready:
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    data = None
                except OSError:
                    data = b""
                if data:
                    self.streams.add(names[fd], data)
                elif data == b"":
                    open_fds.discard(fd)

    def _result(self, reason: str, msg: dict | None, wall_s: float) -> ExecResult:
        """Turn what happened into an ExecResult."""
        s = self.streams
        out = bytes(s.out).decode("utf-8", errors="replace")
        err = bytes(s.err).decode("utf-8", errors="replace")
        base = {"stdout": out, "stderr": err, "wall_s": wall_s, "truncated": s.over}
        if reason == "timeout":
            return ExecResult("timeout", **base)
        if reason == "output_limit":
            return ExecResult("output_limit", **base)
        if msg is not None:
            code, exc = int(msg.get("exit", 1)), msg.get("exc")
            status: Status = "ok" if code == 0 else "memory" if exc == "MemoryError" else "error"
            return ExecResult(status, exit_code=code, exception=exc, **base)
        rc = self.popen.wait()
        sig = -rc if rc < 0 else rc - 128 if rc > 128 else 0
        if sig:
            status = "timeout" if sig == signal.SIGXCPU else "killed"
            return ExecResult(status, exit_code=-sig, **base)
        return ExecResult("ok" if rc == 0 else "error", exit_code=rc, **base)

    def _kill_group(self) -> None:
        """SIGKILL the wrapper's process group (a pid namespace dies with its init)."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """Kill everything of this sandbox and reap the wrapper."""
        self._kill_group()
        try:
            self.popen.kill()
        except OSError:
            pass
        self.popen.wait()

    def close(self) -> None:
        """Kill, close every fd, remove the host directory (none backend)."""
        self.kill()
        for fd in (self.req_w, self.resp_r, self.pidfd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.req_w = self.resp_r = self.pidfd = -1
        for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()
        if self.host_dir:
            shutil.rmtree(self.host_dir, ignore_errors=True)


def _layout(limits: Limits) -> dict:
    """The root the ``unshare`` child builds (mount point: an empty directory of the host)."""
    return {"mountpoint": _mountpoint(), "ops": filesystem_ops(limits.disk_mb << 20)}


def _mountpoint() -> str:
    """An empty host directory to mount the new root on (only inside the child's mount ns)."""
    path = os.path.join(tempfile.gettempdir(), f"posttrain-sandbox-root-{os.geteuid()}")
    os.makedirs(path, mode=0o755, exist_ok=True)
    return path


def _pidfd(pid: int) -> int:
    """A pidfd for ``pid`` (readable when it exits; Linux >= 5.3)."""
    return os.pidfd_open(pid)


def _select_read(fds: list[int], timeout: float) -> list[int]:
    """The fds of ``fds`` readable within ``timeout`` seconds."""
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        return [key.fd for key, _ in sel.select(max(timeout, 0))]


def _write_all(fd: int, data: bytes) -> None:
    """Blocking write of all of ``data`` to a pipe."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
