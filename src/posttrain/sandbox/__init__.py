"""Isolated execution of untrusted (model-written) Python code.

    from posttrain.sandbox import SandboxPool
    with SandboxPool(workers=2, timeout_s=5) as pool:
        print(pool.describe())                       # what is in force on this machine
        r = pool.run("print(input()[::-1])", stdin="abc")   # ExecResult(status="ok", stdout="cba\\n")
        rs = pool.run_many(["print(1)", "1/0"])      # [ok, error]
        with pool.session() as s:                    # one persistent interpreter per episode
            s.run("x = 41"); s.run("print(x + 1)")

Each run gets a fresh `python -I -S` with a scrubbed environment, in new pid / network / mount /
ipc / uts / cgroup namespaces (bubblewrap or util-linux unshare) with an allowlisted read-only
root, a tmpfs working directory, an unprivileged uid of its own, a fresh session keyring, rlimits
and a seccomp filter. A run's status comes from its exit status (``wait()``), never from what the
sandboxed process writes. See docs/sandbox.md.
"""

from __future__ import annotations

from posttrain.sandbox.pool import Sandbox, SandboxPool, SandboxSession, describe
from posttrain.sandbox.probe import SandboxUnsafeError
from posttrain.sandbox.process import ExecResult, SandboxError

__all__ = [
    "ExecResult",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "SandboxSession",
    "SandboxUnsafeError",
    "describe",
]
