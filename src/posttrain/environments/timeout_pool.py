"""Call a function in persistent subprocesses, with a hard timeout per call.

Verifiers (math-verify/sympy, user reward functions) can hang or crash on adversarial model
output. `TimeoutPool.map` runs each call in one of `num_procs` long-lived worker processes, one
call in flight per process. A call that outlives `timeout_s` has its process killed (SIGKILL) and
replaced; a call that raises, or whose process dies, gets an error string. Either way that call
fails alone, and the rest of the batch goes on.

Cost on the happy path is one pipe round trip per call (tens of microseconds); a fresh process
(python start + imports) is paid only at start-up and after a timeout or crash, and its start
overlaps with the other workers' calls.

The workers are started with `subprocess` (not `multiprocessing`), so they never re-import the
parent's `__main__` (a Ray worker, pytest, a notebook). They get the parent's `sys.path`; the
function is sent with `pickle` (by reference: a module-level function) or, failing that,
`cloudpickle` (lambdas, closures). Workers exit when the pool is closed or garbage collected, or
within a second of the parent process dying.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

logger = logging.getLogger(__name__)

TIMEOUT = "timeout"


@dataclass
class CallOutcome:
    """The result of one call: `value` when `error` is None; else `error` is "timeout" or "exception: ..."."""

    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _dumps_fn(fn: Callable) -> bytes:
    """Pickle by reference when the worker can import it; else by value with cloudpickle.

    A function of `__main__` (a script, a notebook) or of a module the parent could not import
    by name pickles by reference but would not load in the worker, so it goes by value.
    """
    module = getattr(fn, "__module__", None)
    if module not in ("__main__", "__mp_main__", None):
        try:
            return pickle.dumps(fn)
        except Exception:  # noqa: BLE001 - lambdas, closures, bound methods of local classes
            pass
    try:
        import cloudpickle
    except ImportError:
        try:
            from ray import cloudpickle  # ray vendors it
        except ImportError as e:
            raise TypeError(
                f"{fn!r} must be sent to a verifier process by value, which needs cloudpickle "
                "(pip install cloudpickle); or define it at module level in an importable module"
            ) from e
    return cloudpickle.dumps(fn)


class _Worker:
    """One subprocess, its two pipe ends, and the call it is running."""

    def __init__(self, init_message: bytes, start_deadline_s: float) -> None:
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD_BOOT, str(task_r), str(result_w)],
                pass_fds=(task_r, result_w),
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        finally:
            os.close(task_r)
            os.close(result_w)
        self.send_conn = Connection(task_w, readable=False)
        self.recv_conn = Connection(result_r, writable=False)
        self.ready = False
        self.started = time.monotonic()
        self.start_deadline = self.started + start_deadline_s
        self.task: int | None = None
        self.deadline = float("inf")
        self.send_conn.send_bytes(init_message)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for conn in (self.send_conn, self.recv_conn):
            try:
                conn.close()
            except OSError:
                pass

    def stop(self) -> None:
        """Ask the process to exit; kill it if it does not within a second."""
        try:
            self.send_conn.send(None)
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        try:
            w.kill()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
    workers.clear()


class TimeoutPool:
    """`num_procs` persistent processes that run `fn(*args)` with a per-call timeout.

    Args:
        fn: a picklable callable (module-level function; closures need cloudpickle).
        timeout_s: wall-clock limit for one call, counted from when a ready process takes it.
        num_procs: processes working in parallel; also the number of hung calls that can be
            waited out at once (a batch with k hung calls takes about ceil(k / num_procs) * timeout_s).
        warmup_args: if given, each new process calls `fn(*warmup_args)` once before taking work
            (to pay imports such as sympy up front); its result and errors are ignored.
        start_timeout_s: a process that is not ready within this long is a fatal error.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        timeout_s: float,
        num_procs: int = 1,
        warmup_args: tuple | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if num_procs < 1:
            raise ValueError(f"num_procs must be >= 1, got {num_procs}")
        self.timeout_s = float(timeout_s)
        self.num_procs = num_procs
        self.start_timeout_s = start_timeout_s
        self._init_message = pickle.dumps((list(sys.path), _dumps_fn(fn), warmup_args))
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)
        self._failed_starts = 0
        self.restarts = 0
        for _ in range(num_procs):
            self._workers.append(self._spawn())

    def _spawn(self) -> _Worker:
        return _Worker(self._init_message, self.start_timeout_s)

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._workers[self._workers.index(w)] = self._spawn()
        self.restarts += 1

    def map(self, args_list: Sequence[tuple]) -> list[CallOutcome]:
        """Run `fn(*args)` for every args tuple; outcomes in input order. Never raises for one call."""
        if not self._workers:
            raise RuntimeError("the pool is closed")
        try:
            return self._map(args_list)
        except BaseException:
            # interrupted (Ctrl-C) or failed: processes still busy with this batch's calls are replaced
            for w in list(self._workers):
                if w.task is not None:
                    self._replace(w)
            raise

    def _map(self, args_list: Sequence[tuple]) -> list[CallOutcome]:
        outcomes: list[CallOutcome | None] = [None] * len(args_list)
        queue = deque(range(len(args_list)))
        while queue or any(w.task is not None for w in self._workers):
            now = time.monotonic()
            for w in list(self._workers):
                if w.ready and w.task is None and queue:
                    i = queue.popleft()
                    try:
                        w.send_conn.send((i, args_list[i]))
                    except (OSError, ValueError):  # the process died while idle: retry the call elsewhere
                        queue.appendleft(i)
                        self._replace(w)
                        continue
                    w.task, w.deadline = i, now + self.timeout_s
            deadlines = [w.deadline if w.ready else w.start_deadline for w in self._workers]
            wait([w.recv_conn for w in self._workers], timeout=max(0.0, min(deadlines) - time.monotonic()))
            for w in list(self._workers):
                self._poll(w, outcomes)
        return outcomes  # type: ignore[return-value]

    def _poll(self, w: _Worker, outcomes: list[CallOutcome | None]) -> None:
        """Take what `w` has sent; settle its call if it died or ran out of time."""
        try:
            while w.recv_conn.poll():
                message = w.recv_conn.recv()
                if message == "ready":
                    w.ready = True
                    self._failed_starts = 0
                    continue
                i, ok, value = message
                if i == w.task:
                    outcomes[i] = CallOutcome(value=value) if ok else CallOutcome(error=f"exception: {value}")
                    w.task, w.deadline = None, float("inf")
        except (EOFError, OSError):  # the process exited (crash, os._exit, OOM kill)
            code = w.proc.wait()
            if w.task is not None:
                outcomes[w.task] = CallOutcome(error=f"exception: verifier process died (exit code {code})")
            elif not w.ready:
                self._failed_starts += 1
                if self._failed_starts >= 3:
                    self.close()
                    raise RuntimeError(
                        f"verifier process failed to start 3 times (exit code {code}); its traceback is on stderr"
                    ) from None
            self._replace(w)
            return
        now = time.monotonic()
        if w.task is not None and now >= w.deadline:
            outcomes[w.task] = CallOutcome(error=TIMEOUT)
            logger.warning("verifier call timed out after %.1fs; restarting its process", self.timeout_s)
            self._replace(w)
        elif not w.ready and now >= w.start_deadline:
            self.close()
            raise RuntimeError(f"verifier process not ready within {self.start_timeout_s:.0f}s")

    def close(self) -> None:
        """Stop all processes (idempotent)."""
        for w in self._workers:
            w.stop()
        self._workers.clear()
        self._finalizer.detach()

    def __enter__(self) -> TimeoutPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The worker process: argv = [task_fd, result_fd]. Kept free of project imports so that it starts fast;
# the function's own module is imported when it is unpickled.
_CHILD_BOOT = r"""
import os, pickle, sys, threading, time
from multiprocessing.connection import Connection
task = Connection(int(sys.argv[1]), writable=False)
result = Connection(int(sys.argv[2]), readable=False)
parent = os.getppid()
def _watch_parent():
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)
threading.Thread(target=_watch_parent, daemon=True).start()
sys.argv = sys.argv[:1]
path, fn_bytes, warmup_args = pickle.loads(task.recv_bytes())
sys.path[:] = path
fn = pickle.loads(fn_bytes)
if warmup_args is not None:
    try:
        fn(*warmup_args)
    except BaseException:
        pass
result.send("ready")
while True:
    try:
        message = task.recv()
    except (EOFError, OSError):
        break
    if message is None:
        break
    i, args = message
    try:
        out = (i, True, fn(*args))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        try:
            text = f"{type(e).__name__}: {e}"[:500]
        except BaseException:
            text = type(e).__name__
        out = (i, False, text)
    try:
        result.send(out)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        result.send((i, False, f"result not picklable: {type(e).__name__}"))
"""
