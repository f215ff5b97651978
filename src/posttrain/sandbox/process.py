"""One sandboxed interpreter: start it, hand it code, collect its output within the limits, kill it."""

from __future__ import annotations

import collections
import hmac
import json
import os
import secrets
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
from posttrain.sandbox.seccomp import FILTER, NUMBERS

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "killed"]
_READY_TIMEOUT_S = 30.0
_DRAIN_S = 0.5
MAX_FRAME = 4096  # a reply is {"nonce", "exit", "exc"}: anything longer is not one
_RESP_CAP = 1 << 20  # bytes of the response pipe kept; the rest is read and dropped
BAD_FRAMES_NOTE = "[sandbox: unexpected data on the response pipe; the run counts as an error]\n"


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start a worker): not the code's fault, don't score it."""


@dataclass
class ExecResult:
    """How one run of untrusted code ended.

    status: "ok" (exit status 0 from ``wait()``), "error" (exception, non-zero exit, or data on the
    response pipe that is not exactly the run's one well-formed reply), "timeout" (wall clock or CPU
    limit), "memory" (a non-zero exit whose reply names MemoryError), "output_limit" (a stream
    passed max_output_bytes; killed), "killed" (died by a signal, e.g. a segfault).
    A session cell has no exit status of its own: its status is what the session's interpreter
    replied (see docs/sandbox.md, "What a result can be trusted for").
    stdout / stderr: decoded UTF-8 (invalid bytes replaced), each cut to max_output_bytes.
    exit_code: the exit status; minus the signal number when killed by one; None when we killed it.
    exception: the type name the interpreter reported: data from the sandbox, never a verdict.
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
        """Exit status 0 within every limit, and nothing malformed on the response pipe."""
        return self.status == "ok"


@dataclass(frozen=True)
class Reply:
    """A validated reply frame of the child: its exit code (0..255) and exception type name."""

    exit: int
    exc: str | None


def parse_reply(raw: bytes) -> tuple[str, Reply] | None:
    """``raw`` as (the nonce it answers, the reply), or None if it is not a well-formed reply.

    A reply is the JSON object {"nonce": str of at most 64 characters, "exit": int 0..255, "exc":
    None or an identifier of at most 100 characters} with exactly these keys. Never raises.
    """
    try:
        msg = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(msg, dict) or set(msg) != {"nonce", "exit", "exc"}:
        return None
    nonce, code, exc = msg["nonce"], msg["exit"], msg["exc"]
    if not isinstance(nonce, str) or len(nonce) > 64:
        return None
    if type(code) is not int or not 0 <= code <= 255:
        return None
    if exc is not None and not (isinstance(exc, str) and len(exc) <= 100 and exc.isidentifier()):
        return None
    return nonce, Reply(code, exc)


def reply_to(raw: bytes, nonce: str) -> Reply | None:
    """``raw`` as the reply to the request carrying ``nonce`` (None: anything else)."""
    parsed = parse_reply(raw)
    return parsed[1] if parsed is not None and hmac.compare_digest(parsed[0], nonce) else None


def split_frames(buf: bytearray) -> tuple[list[bytes], bool]:
    """Take the complete frames off the front of ``buf``; True if its framing is broken.

    Broken: a length header over ``MAX_FRAME`` (no reply is that long; nothing after it can be
    delimited). An incomplete frame stays in ``buf``.
    """
    frames = []
    while len(buf) >= 8:
        n = int.from_bytes(buf[:8], "big")
        if n > MAX_FRAME:
            return frames, True
        if len(buf) < 8 + n:
            break
        frames.append(bytes(buf[8 : 8 + n]))
        del buf[: 8 + n]
    return frames, False


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
    seccomp: bool = True

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
            if len(buf) < _RESP_CAP:  # untrusted: the code can write here too
                buf += data
            return
        room = self.cap - len(buf)
        if len(data) > room:
            self.over = True
        buf += data[: max(room, 0)]

    def reset(self) -> None:
        """Start a new cell (session): nothing collected before it is kept."""
        self.out.clear()
        self.err.clear()
        self.resp.clear()
        self.over = False


class SandboxProcess:
    """A started sandboxed interpreter, waiting for its request (``once`` or ``session`` mode)."""

    def __init__(self, launch: Launch, limits: Limits, uid: int, mode: str) -> None:
        """Spawn the child and wait until it reports ready (raises SandboxError otherwise)."""
        self.launch, self.limits, self.mode, self.uid = launch, limits, mode, uid
        self.host_dir: str | None = None
        self.reply: Reply | None = None  # the current cell's reply (session)
        self.old_nonces: collections.deque[str] = collections.deque(maxlen=256)  # earlier cells'
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
            "hostname": "sandbox" if launch.child_builds_root else None,  # bwrap: --hostname
            "init": launch.backend == "unshare",  # bwrap has an init of its own
            "keyctl_nr": NUMBERS.get("keyctl"),
            "seccomp": FILTER.hex() if FILTER is not None and self.limits.seccomp else None,
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
        """Send the program, feed stdin, collect until it exits or a limit is hit; then kill all.

        The status comes from the wrapper's exit status (``wait()``); the reply frame only adds
        the exception's name, and only when it is the one well-formed reply and agrees with it.
        """
        start = time.monotonic()
        nonce = secrets.token_hex(16)
        request = frame({"code": code, "files": files or {}, "nonce": nonce})
        try:
            _write_all(self.req_w, request)
            os.close(self.req_w)
        except OSError:
            pass
        self.req_w = -1
        reason = self._pump(start + timeout_s, stdin.encode(), None)
        self.kill()
        return self._result(reason, nonce, time.monotonic() - start)

    def run_cell(self, code: str, stdin: str, files: dict[str, str] | None, timeout_s: float) -> ExecResult:
        """Session: send one cell with a fresh nonce, collect until its reply; kill on a limit.

        Whatever the pipes hold before the cell is sent (late output or frames of an earlier
        cell's threads) is dropped; later, a valid reply to an earlier cell is skipped and any
        other frame than this cell's reply makes it an error (``_scan_replies``).
        """
        start = time.monotonic()
        self._discard_pending()
        nonce = secrets.token_hex(16)
        try:
            _write_all(
                self.req_w, frame({"code": code, "stdin": stdin, "files": files or {}, "nonce": nonce})
            )
        except OSError:
            pass
        reason = self._pump(start + timeout_s, b"", nonce)
        self.old_nonces.append(nonce)
        if reason != "response":
            self.kill()
        return self._result(reason, nonce, time.monotonic() - start)

    def _discard_pending(self, fds: tuple[int, ...] | None = None) -> None:
        """Read and drop what the pipes hold now (all three, or ``fds``), and what was collected."""
        if fds is None:
            fds = (self.popen.stdout.fileno(), self.popen.stderr.fileno(), self.resp_r)
        for fd in fds:
            for _ in range(64):  # at most 4 MiB per pipe; a writer that keeps going loses the rest
                try:
                    if not os.read(fd, 1 << 16):
                        break
                except OSError:  # BlockingIOError: empty
                    break
        if len(fds) == 3:
            self.streams.reset()
            self.reply = None
        else:
            self.streams.out.clear()
            self.streams.err.clear()

    def _scan_replies(self, nonce: str) -> str | None:
        """Session: "response" once this cell's valid reply is in; None: keep waiting.

        A valid reply to an earlier cell (its thread, or its real reply after it forged one) is
        stale: skipped, and the output collected before it is dropped as that cell's. Anything
        else (garbage, an unknown nonce, broken framing) is "malformed".
        """
        frames, broken = split_frames(self.streams.resp)
        for raw in frames:
            parsed = parse_reply(raw)
            if parsed is not None and hmac.compare_digest(parsed[0], nonce):
                self.reply = parsed[1]
                return "response"
            if parsed is None or parsed[0] not in self.old_nonces:
                return "malformed"
            self._discard_pending((self.popen.stdout.fileno(), self.popen.stderr.fileno()))
        return "malformed" if broken else None

    def _pump(self, deadline: float, stdin: bytes, nonce: str | None) -> str:
        """Move bytes until: "response" / "malformed" (session cell), "exited", "timeout" or
        "output_limit". ``nonce``: the session cell's (None for a one-shot run)."""
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
                        if nonce is not None and names[fd] == "resp":
                            if (done := self._scan_replies(nonce)) is not None:
                                self._drain(names)
                                return "output_limit" if self.streams.over else done
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

    def _result(self, reason: str, nonce: str, wall_s: float) -> ExecResult:
        """Turn what happened into an ExecResult (never raises on what the sandbox wrote)."""
        s = self.streams
        out = bytes(s.out).decode("utf-8", errors="replace")
        err = bytes(s.err).decode("utf-8", errors="replace")
        base = {"stdout": out, "stderr": err, "wall_s": wall_s, "truncated": s.over}
        if reason in ("timeout", "output_limit"):
            return ExecResult(reason, **base)  # type: ignore[arg-type]
        if reason == "response":  # a session cell: what the session's interpreter replied
            reply = self.reply
            status: Status = "ok" if reply.exit == 0 else "memory" if reply.exc == "MemoryError" else "error"
            return ExecResult(status, exit_code=reply.exit, exception=reply.exc, **base)
        if reason == "malformed":  # a session cell; the session was killed
            base["stderr"] = BAD_FRAMES_NOTE + base["stderr"]
            return ExecResult("error", **base)
        return self._exit_result(self.popen.wait(), nonce, base)

    def _exit_result(self, rc: int, nonce: str, base: dict) -> ExecResult:
        """The result of a process that exited with wrapper status ``rc`` (``wait()``).

        The reply frame is believed only if it is the response pipe's one and only content, a valid
        reply with ``nonce``, and its exit code is ``rc``; then it names the exception. Any other
        data there makes an exit-0 run an error (nothing written can turn a failure into "ok").
        """
        sig = -rc if rc < 0 else rc - 128 if rc > 128 else 0
        if sig:
            status: Status = "timeout" if sig == signal.SIGXCPU else "killed"
            return ExecResult(status, exit_code=-sig, **base)
        frames, broken = split_frames(self.streams.resp)
        data = bool(frames) or broken or bool(self.streams.resp)
        reply = reply_to(frames[0], nonce) if len(frames) == 1 and not (broken or self.streams.resp) else None
        if reply is None or reply.exit != rc:
            if data:
                base["stderr"] = BAD_FRAMES_NOTE + base["stderr"]
            return ExecResult("ok" if rc == 0 and not data else "error", exit_code=rc, **base)
        status = "ok" if rc == 0 else "memory" if reply.exc == "MemoryError" else "error"
        return ExecResult(status, exit_code=rc, exception=reply.exc, **base)

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
