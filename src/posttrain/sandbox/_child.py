"""The program that runs INSIDE the sandbox: ``python -I -S -c <this file's source> <json spec>``.

Standalone (stdlib only, nothing of posttrain is importable in there). Steps:

1. (``unshare`` backend only) build the filesystem: a size-limited tmpfs root with read-only binds
   of the interpreter and system libraries, then ``pivot_root`` into it and detach the old root.
   It also sets its own hostname (bwrap does both with options).
2. Drop to the sandbox uid (when the parent is root), set ``no_new_privs``, join a fresh anonymous
   session keyring (nothing of the parent's keyrings stays reachable) and set the rlimits.
3. Install the seccomp filter the parent built (``seccomp.py``): after all of the above, which
   needs mount, pivot_root and keyctl; before any code of the request runs.
4. Write ``b"R"`` on the response fd: the worker is ready (pre-started, waiting for code).
5. ``once``: read one request (code, files, nonce) from the request fd, run it, reply how it
   ended, exit with its status. ``session``: loop over requests, keeping the globals between them.

The response fd carries untrusted data once model code runs (the code can write to it, and can
read the nonce: it runs in this very process). The parent takes a one-shot run's status from the
exit status, never from a reply; a reply only names the exception and delimits session cells.
"""

from __future__ import annotations

import json
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MNT_DETACH = 2
# statvfs f_flag bit -> mount flag that a read-only remount of a bind mount must keep ("locked").
_LOCKED_FLAGS = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}
_SYSCALL_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}


def _libc():
    """The C library through ctypes (imported lazily: the bwrap backend never needs it)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    """Raise OSError with errno when a libc call failed."""
    if ret != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, src, dst: str, fstype, flags: int, data) -> None:
    """mount(2) with str arguments (None allowed)."""
    enc = [None if s is None else s.encode() for s in (src, dst, fstype, data)]
    _check(libc.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {src} -> {dst}")


def _bind(libc, src: str, dst: str, writable: bool = False) -> None:
    """Bind ``src`` onto ``dst`` (created), read-only unless ``writable``."""
    if os.path.isdir(src):
        os.makedirs(dst, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
        open(dst, "a").close()
    _mount(libc, src, dst, None, MS_BIND | MS_REC, None)
    if not writable:
        locked = 0
        vfs = os.statvfs(dst).f_flag
        for bit, flag in _LOCKED_FLAGS.items():
            if vfs & bit:
                locked |= flag
        _mount(libc, None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | locked, None)


def build_root(layout: dict) -> None:
    """Make the sandbox filesystem (``unshare`` backend) and pivot into it.

    ``layout``: {"mountpoint": empty host dir, "ops": [[kind, ...], ...]} with kinds
    ``ro`` [src, dst], ``symlink`` [target, dst], ``dir`` [dst], ``tmpfs`` [dst, size_bytes, mode],
    ``proc`` [dst], ``dev`` [dst].
    """
    libc = _libc()
    new = layout["mountpoint"]
    _mount(libc, None, "/", None, MS_REC | (1 << 18), None)  # MS_PRIVATE: nothing leaks out
    _mount(libc, "tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for op in layout["ops"]:
        kind = op[0]
        dst = new + (op[2] if kind in ("ro", "symlink") else op[1])
        if kind == "ro":
            _bind(libc, op[1], dst)
        elif kind == "symlink":
            os.symlink(op[1], dst)
        elif kind == "dir":
            os.makedirs(dst, mode=0o755, exist_ok=True)
        elif kind == "tmpfs":
            os.makedirs(dst, mode=0o755, exist_ok=True)
            _mount(libc, "tmpfs", dst, "tmpfs", MS_NOSUID | MS_NODEV, f"size={op[2]},mode={op[3]:o}")
        elif kind == "proc":
            os.makedirs(dst, mode=0o555, exist_ok=True)
            try:  # refused in some containers (a partly masked /proc): Python runs without it
                _mount(libc, "proc", dst, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
            except OSError:
                pass
        elif kind == "dev":
            for node in ("null", "zero", "full", "random", "urandom"):
                _bind(libc, "/dev/" + node, dst + "/" + node, writable=True)
    os.makedirs(new + "/.oldroot", exist_ok=True)
    nr = _SYSCALL_PIVOT_ROOT[os.uname().machine]
    _check(libc.syscall(nr, new.encode(), (new + "/.oldroot").encode()), "pivot_root")
    os.chdir("/")
    _check(libc.umount2(b"/.oldroot", MNT_DETACH), "umount old root")
    os.rmdir("/.oldroot")
    _mount(libc, None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


def set_hostname(name: str) -> None:
    """sethostname(2) in the new uts namespace (``unshare`` backend; bwrap has ``--hostname``)."""
    data = name.encode()
    _check(_libc().sethostname(data, len(data)), "sethostname")


def join_fresh_session_keyring(keyctl_nr: int | None) -> None:
    """keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL): a new anonymous session keyring of our own.

    The inherited one (the parent's: systemd services, ``su -l`` and containers have one) is no
    longer ours to search. ENOSYS (no keyrings in this kernel) and EPERM (keyctl already filtered
    by the host's seccomp profile) leave the code without keyrings at all: nothing to do.
    """
    if keyctl_nr is None:
        return
    import ctypes

    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(keyctl_nr), ctypes.c_long(1), None) < 0:
        err = ctypes.get_errno()
        if err not in (1, 38):
            raise OSError(err, f"keyctl(KEYCTL_JOIN_SESSION_KEYRING): {os.strerror(err)}")


def install_seccomp(program_hex: str | None) -> None:
    """prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, program) with ``no_new_privs`` set first."""
    if not program_hex:
        return
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    program = bytes.fromhex(program_hex)
    buf = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = _libc()
    _check(libc.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _check(libc.prctl(22, 2, ctypes.byref(prog), 0, 0), "prctl(PR_SET_SECCOMP)")


def drop_privileges(uid: int | None, no_new_privs: bool) -> None:
    """Become ``uid`` (all capabilities go with root) and forbid gaining privileges by exec."""
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if no_new_privs:
        _check(_libc().prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def set_limits(limits: dict) -> None:
    """Apply the rlimits {"cpu", "as", "fsize", "nproc", "nofile", "core"}: each [soft, hard]."""
    import resource

    names = {
        "cpu": resource.RLIMIT_CPU,
        "as": resource.RLIMIT_AS,
        "fsize": resource.RLIMIT_FSIZE,
        "nproc": resource.RLIMIT_NPROC,
        "nofile": resource.RLIMIT_NOFILE,
        "core": resource.RLIMIT_CORE,
    }
    for key, (soft, hard) in limits.items():
        resource.setrlimit(names[key], (soft, hard))


def read_exactly(fd: int, n: int) -> bytes:
    """Read n bytes from fd (b"" on EOF before the first byte)."""
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            if got == 0:
                return b""
            raise EOFError("truncated request")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_request(fd: int) -> dict | None:
    """One request: an 8-byte big-endian length, then that many bytes of JSON (None on EOF)."""
    head = read_exactly(fd, 8)
    if not head:
        return None
    return json.loads(read_exactly(fd, int.from_bytes(head, "big")))


def write_message(fd: int, message: dict) -> None:
    """A response: 8-byte big-endian length, then JSON."""
    data = json.dumps(message).encode()
    os.write(fd, len(data).to_bytes(8, "big") + data)


def reply(fd: int, request: dict, code: int, exc: str | None) -> None:
    """The reply to ``request``: its nonce, the exit code and the exception's type name."""
    write_message(fd, {"nonce": request.get("nonce", ""), "exit": code, "exc": exc})


def write_files(files: dict) -> None:
    """Write the request's files (relative paths, inside the working directory)."""
    for name, text in files.items():
        if os.path.isabs(name) or ".." in name.split("/"):
            raise ValueError(f"file name must be relative and stay inside the directory: {name!r}")
        if os.path.dirname(name):
            os.makedirs(os.path.dirname(name), exist_ok=True)
        with open(name, "w", encoding="utf-8") as fh:
            fh.write(text)


def run_code(code: str, namespace: dict) -> tuple[int, str | None]:
    """Execute ``code`` in ``namespace``; returns (exit code, exception type name or None)."""
    import traceback

    try:
        exec(compile(code, "<sandbox>", "exec"), namespace)
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            return 0, None
        if isinstance(exc.code, int):
            return exc.code & 0xFF or 1, "SystemExit"
        print(exc.code, file=sys.stderr)
        return 1, "SystemExit"
    except BaseException as exc:  # noqa: BLE001 - model code may raise anything
        try:  # the traceback without this file's frame
            traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        except MemoryError:
            print(type(exc).__name__, file=sys.stderr)
        return 1, type(exc).__name__
    return 0, None


def flush() -> None:
    """Flush Python's stdout/stderr (model code may have replaced or closed them)."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def serve_once(req_fd: int, resp_fd: int) -> None:
    """Run one program as ``__main__`` and exit with its status."""
    request = read_request(req_fd)
    os.close(req_fd)
    if request is None:
        os._exit(0)
    try:
        write_files(request.get("files") or {})
    except (OSError, ValueError) as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        flush()
        reply(resp_fd, request, 1, type(err).__name__)
        os._exit(1)
    code, exc = run_code(request["code"], {"__name__": "__main__", "__builtins__": __builtins__})
    flush()
    try:
        reply(resp_fd, request, code, exc)
    except OSError:
        pass
    os._exit(code)


def serve_session(req_fd: int, resp_fd: int, cpu_s: int) -> None:
    """Run cells one after another in one namespace until the request fd closes."""
    import io
    import resource

    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    while True:
        request = read_request(req_fd)
        if request is None:
            os._exit(0)
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime) + cpu_s
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        resource.setrlimit(resource.RLIMIT_CPU, (min(soft, hard), hard))
        sys.stdin = io.StringIO(request.get("stdin", ""))
        try:
            write_files(request.get("files") or {})
            code, exc = run_code(request["code"], namespace)
        except (OSError, ValueError) as err:
            print(f"{type(err).__name__}: {err}", file=sys.stderr)
            code, exc = 1, type(err).__name__
        flush()
        reply(resp_fd, request, code, exc)


def become_init(req_fd: int, resp_fd: int) -> None:
    """Fork; the child returns (and runs the code), this process stays as the namespace's pid 1.

    pid 1 ignores signals it has no handler for and its death kills the namespace; code should not
    run as it. It exits like the code: its exit status, or 128 + the signal that killed it.
    """
    pid = os.fork()
    if pid == 0:
        return
    os.close(req_fd)
    os.close(resp_fd)
    while True:
        try:
            wpid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if wpid == pid:
            os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def main(spec: dict) -> None:
    """Set up, announce readiness, then serve ``spec["mode"]``."""
    req_fd, resp_fd = spec["req_fd"], spec["resp_fd"]
    if spec.get("layout"):
        build_root(spec["layout"])
    if spec.get("hostname"):
        set_hostname(spec["hostname"])
    os.chdir(spec["workdir"])
    drop_privileges(spec.get("uid"), spec.get("no_new_privs", False))
    join_fresh_session_keyring(spec.get("keyctl_nr"))
    set_limits(spec["limits"])
    if spec.get("init"):
        become_init(req_fd, resp_fd)
    install_seccomp(spec.get("seccomp"))
    os.set_inheritable(req_fd, False)
    os.set_inheritable(resp_fd, False)
    sys.argv = ["<sandbox>"]
    os.write(resp_fd, b"R")
    if spec["mode"] == "session":
        serve_session(req_fd, resp_fd, spec["cell_cpu_s"])
    else:
        serve_once(req_fd, resp_fd)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
