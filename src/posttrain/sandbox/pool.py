"""SandboxPool: pre-started sandboxed interpreters, one fresh process per run, and sessions."""

from __future__ import annotations

import asyncio
import atexit
import collections
import fcntl
import functools
import os
import queue
import secrets
import stat
import tempfile
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from posttrain.config.rollout import SandboxConfig
from posttrain.sandbox.backends import UID_BASE
from posttrain.sandbox.probe import select
from posttrain.sandbox.process import ExecResult, Limits, SandboxError, SandboxProcess

_LIVE: weakref.WeakSet = weakref.WeakSet()
_UID_SPAN = 500_000_000  # uids UID_BASE .. UID_BASE + _UID_SPAN - 1
_UID_BLOCK = 64  # numbers a process takes from the machine-wide counter at a time
_UID_LOCK = threading.Lock()
_uid_block = [0, 0, 0]  # [owner pid, next number, end]: a forked child must not reuse its parent's


def _counter_files() -> list[str]:
    """Where the machine-wide uid counter lives: /run (cleared at boot, with the kernel's keyrings)."""
    return [
        "/run/posttrain-sandbox-uids",
        os.path.join(tempfile.gettempdir(), f"posttrain-uids-{os.geteuid()}"),
    ]


def _reserve(n: int) -> int | None:
    """Take ``n`` consecutive numbers from the counter file under ``flock``; None if none is usable.

    The file must be a regular file owned by us (no symlink, nobody else's): the numbers handed
    out are then distinct across every process of this machine until the counter wraps.
    """
    for path in _counter_files():
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)
            start = int(os.pread(fd, 64, 0).strip() or b"0")
            os.pwrite(fd, b"%020d\n" % ((start + n) % _UID_SPAN), 0)
            return start
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
    return None


def next_uid() -> int:
    """A host uid no other run, session or process of this machine has had since boot.

    Numbers come in blocks from a counter file shared by every process (``_reserve``); only if no
    counter file can be used, a random block (distinct with high probability, not certainty).
    """
    with _UID_LOCK:
        pid = os.getpid()
        if _uid_block[0] != pid or _uid_block[1] >= _uid_block[2]:
            start = _reserve(_UID_BLOCK)
            if start is None:
                start = secrets.randbelow(_UID_SPAN // _UID_BLOCK) * _UID_BLOCK
            _uid_block[:] = [pid, start, start + _UID_BLOCK]
        n = _uid_block[1]
        _uid_block[1] += 1
    return UID_BASE + n % _UID_SPAN


def _limits(config: SandboxConfig) -> Limits:
    """The child's limits from the config."""
    fields = Limits.__dataclass_fields__
    return Limits(**{k: getattr(config, k) for k in fields})


class _Slot:
    """One worker: the next pre-started interpreter, each with a uid of its own (``next_uid``)."""

    def __init__(self, pool: SandboxPool) -> None:
        """Owned by ``pool``; starts empty (call ``refill``)."""
        self.pool = pool
        self.future: Future | None = None

    def refill(self) -> None:
        """Start the next interpreter in the background, under a fresh uid."""
        pool = self.pool
        self.future = pool._spawner.submit(SandboxProcess, pool.launch, pool.limits, pool._uid(), "once")

    def take(self) -> SandboxProcess:
        """The pre-started interpreter (restarted if it failed or died waiting)."""
        proc = None
        if self.future is not None:
            try:
                proc = self.future.result()
            except (SandboxError, OSError):
                proc = None
            self.future = None
        if proc is not None and not proc.alive():
            proc.close()
            proc = None
        if proc is None:
            proc = SandboxProcess(self.pool.launch, self.pool.limits, self.pool._uid(), "once")
        return proc

    def discard(self) -> None:
        """Kill the spare (pool shutdown)."""
        future, self.future = self.future, None
        if future is not None:
            future.add_done_callback(_close_future)


def _close_future(future: Future) -> None:
    """Close the process a spawn future made, if it made one."""
    if future.exception() is None:
        future.result().close()


class SandboxPool:
    """Runs untrusted Python code, each run in a fresh sandboxed interpreter.

    ``workers`` interpreters are kept pre-started (already isolated and limited, waiting for
    their code); a run takes one, and a replacement starts in the background once it is done.
    The constructor probes the backends and raises ``SandboxUnsafeError`` unless network and
    filesystem isolation are in force (or ``allow_unsafe``). Close it (or use ``with``).
    """

    def __init__(self, config: SandboxConfig | None = None, **overrides: object) -> None:
        """``overrides``: SandboxConfig fields, e.g. ``SandboxPool(workers=4, timeout_s=5)``."""
        config = config or SandboxConfig()
        if overrides:
            config = SandboxConfig(**{**config.model_dump(), **overrides})
        self.config = config
        self.limits = _limits(config)
        self.launch, protections = select(config.backend, config.allow_unsafe, self.limits, next_uid())
        self._protections = {**protections, "rlimits": {**protections["rlimits"], **_rl(config)}}
        self._closed = False
        self._spawner = ThreadPoolExecutor(config.workers, thread_name_prefix="sandbox-spawn")
        self._runner = ThreadPoolExecutor(config.workers, thread_name_prefix="sandbox-run")
        self._sessions: weakref.WeakSet = weakref.WeakSet()
        self._uids: collections.deque[int] = collections.deque(maxlen=4096)
        self._slots = [_Slot(self) for _ in range(config.workers)]
        self._idle: queue.Queue[_Slot] = queue.Queue()
        for slot in self._slots:
            slot.refill()
            self._idle.put(slot)
        _LIVE.add(self)

    # ------------------------------------------------------------------ running code
    def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float | None = None,
        files: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``code`` as ``__main__`` in a fresh sandbox; ``files`` are written to its directory first."""
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        slot = self._idle.get()
        try:
            proc = slot.take()
            try:
                return proc.run_once(code, stdin, files, timeout_s or self.config.timeout_s)
            finally:
                proc.close()
        finally:
            if not self._closed:
                slot.refill()
            self._idle.put(slot)

    def run_many(
        self,
        codes: Sequence[str],
        *,
        stdin: str | Sequence[str] = "",
        timeout_s: float | None = None,
        files: dict[str, str] | None = None,
    ) -> list[ExecResult]:
        """Run every program (``workers`` at a time); results in the order of ``codes``."""
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        stdins = [stdin] * len(codes) if isinstance(stdin, str) else list(stdin)
        if len(stdins) != len(codes):
            raise ValueError(f"{len(stdins)} stdin strings for {len(codes)} programs")
        run = functools.partial(self.run, timeout_s=timeout_s, files=files)
        futures = [self._runner.submit(run, c, stdin=s) for c, s in zip(codes, stdins, strict=True)]
        return [f.result() for f in futures]

    async def arun(self, code: str, **kwargs: object) -> ExecResult:
        """``run`` for asyncio callers (on the pool's threads; the event loop is not blocked)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._runner, functools.partial(self.run, code, **kwargs))

    def session(self) -> SandboxSession:
        """A persistent interpreter (globals carry over between ``run`` calls); close it at episode end."""
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        session = SandboxSession(self)
        self._sessions.add(session)
        return session

    def _uid(self) -> int:
        """A fresh uid for one interpreter (a run, a session), remembered for ``recent_uids``."""
        uid = next_uid()
        self._uids.append(uid)
        return uid

    def recent_uids(self) -> set[int]:
        """The host uids of the last 4096 interpreters this pool started (runs and sessions)."""
        return set(self._uids)

    # ------------------------------------------------------------------ reporting
    def protections(self) -> dict:
        """What is in force, as measured by the probe run (backend, isolation, uid, rlimits...)."""
        return dict(self._protections)

    def describe(self) -> str:
        """One line per protection, for logs and ``posttrain doctor``."""
        return describe(self._protections)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Kill the spares and open sessions; runs in flight finish. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for session in list(self._sessions):
            session.close()
        for slot in self._slots:
            slot.discard()
        self._runner.shutdown(wait=True)
        self._spawner.shutdown(wait=True)
        _LIVE.discard(self)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Sandbox = SandboxPool  # the same thing; a one-worker sandbox is ``Sandbox(workers=1)``


class SandboxSession:
    """One persistent sandboxed interpreter for an episode: state carries over between runs.

    Each ``run`` has the pool's limits (wall clock, CPU for that cell). A run that hits a limit
    kills the session; the next ``run`` starts a fresh interpreter and says so on stderr.
    """

    def __init__(self, pool: SandboxPool) -> None:
        """Start the interpreter now (it waits for the first cell)."""
        self.pool = pool
        self._proc: SandboxProcess | None = self._start()
        self._lock = threading.Lock()
        self.closed = False

    def _start(self) -> SandboxProcess:
        """A fresh session interpreter under a fresh uid (a restart gets another one too)."""
        return SandboxProcess(self.pool.launch, self.pool.limits, self.pool._uid(), "session")

    def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float | None = None,
        files: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run one cell in the session's namespace (``stdin`` becomes ``sys.stdin`` for it)."""
        with self._lock:
            if self.closed:
                raise SandboxError("the sandbox session is closed")
            note = ""
            if self._proc is None or not self._proc.alive():
                if self._proc is not None:
                    self._proc.close()
                    note = "[sandbox: the session was restarted after a limit; earlier state is lost]\n"
                self._proc = self._start()
            result = self._proc.run_cell(code, stdin, files, timeout_s or self.pool.config.timeout_s)
            if note:
                result.stderr = note + result.stderr
            return result

    def close(self) -> None:
        """Kill the interpreter. Idempotent."""
        self.closed = True
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.close()

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rl(config: SandboxConfig) -> dict:
    """The configured rlimits, for ``protections()``."""
    return {
        "cpu_s": config.cpu_s,
        "memory_mb": config.memory_mb,
        "max_file_mb": config.max_file_mb,
        "max_processes": config.max_processes,
        "max_open_files": config.max_open_files,
    }


def describe(p: dict) -> str:
    """Human-readable summary of a protections dict."""
    yes = {True: "yes", False: "NO"}
    rl = p["rlimits"]
    uid_note = "unprivileged" if p["uid_dropped"] else "ROOT"
    if p["host_uid"] >= UID_BASE:
        uid_note += "; a uid of its own per run and per session"
    fs_note = " (read-only /usr and interpreter, tmpfs /sandbox and /tmp)" if p["filesystem_isolated"] else ""
    lines = [
        f"sandbox backend: {p['backend']} ({'safe' if p['safe'] else 'UNSAFE'})",
        f"  network isolated:    {yes[p['network_isolated']]}",
        f"  filesystem isolated: {yes[p['filesystem_isolated']]}{fs_note}",
        f"  pid namespace:       {yes[p['pid_namespace']]}",
        f"  user namespace:      {yes[p['user_namespace']]}",
        f"  host uid of code:    {p['host_uid']} ({uid_note})",
        f"  no_new_privs:        {yes[p['no_new_privs']]}",
        f"  scrubbed env:        {yes[p['env_scrubbed']]}",
        f"  rlimits:             cpu {rl['cpu_s']} s, address space {rl['memory_mb']} MB, "
        f"file {rl['max_file_mb']} MB, {rl['max_processes']} processes, {rl['max_open_files']} files",
        f"  seccomp:             {yes[p['seccomp']]}",
    ]
    lines += [f"  problem: {x}" for x in p["problems"]]
    return "\n".join(lines)


@atexit.register
def _close_all() -> None:
    """Close every pool still open at interpreter exit (no stray sandboxes)."""
    for pool in list(_LIVE):
        pool.close()
