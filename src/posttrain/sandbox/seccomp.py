"""The sandbox's syscall filter: a small classic-BPF program, built here, installed by ``_child.py``.

Why hand-written and not libseccomp: the child runs ``python -I -S`` in a minimal root where no
site-packages (``pyseccomp``, Debian's ``seccomp`` module) are importable, and the filter must be
installed after the sandbox's own setup (mount / pivot_root, setuid, keyring) by that child. The
program below is 50-odd instructions of plain data (bytes), built on the host with ``struct`` and
handed to the child in its spec; the child installs it with ``prctl(PR_SET_SECCOMP)`` through
ctypes. No dependency, nothing to load inside the sandbox. The syscall numbers are checked
against libseccomp's own tables by ``test_syscall_numbers_match_libseccomp`` where libseccomp
is installed.

What it does, for the native architecture only (x86_64 and aarch64; elsewhere no filter is
built and ``pool.protections()["seccomp"]`` says so):

- any other architecture (i386 via ``int 0x80``) and x86_64's x32 numbers: ``EPERM``;
- ``DENIED`` syscalls: ``EPERM`` (code gets an ordinary ``OSError``, the process lives);
- ``clone`` with any ``CLONE_NEW*`` flag (a namespace): ``EPERM``;
- ``clone3``: ``ENOSYS`` (its flags sit behind a pointer BPF cannot read; glibc then falls back
  to ``clone`` for threads, ``fork`` and ``posix_spawn``);
- everything else: allowed.
"""

from __future__ import annotations

import os
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little endian).
_OFF_NR, _OFF_ARCH, _OFF_ARG0_LOW = 0, 4, 16
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
EPERM, ENOSYS = 1, 38
X32_SYSCALL_BIT = 0x40000000
# CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: all in the low word.
CLONE_NEW_FLAGS = 0x80 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # AUDIT_ARCH_* of <linux/audit.h>
# Numbers of <asm/unistd.h>; from io_uring_setup (425) on, every architecture shares them.
_SHARED = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "pidfd_getfd": 438,
    "process_madvise": 440,
    "mount_setattr": 442,
    "open_tree_attr": 467,
}
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "kcmp": 312,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "bpf": 321,
        "unshare": 272,
        "setns": 308,
        "clone": 56,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "chroot": 161,
        "name_to_handle_at": 303,
        "open_by_handle_at": 304,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "acct": 163,
        "quotactl": 179,
        "fanotify_init": 300,
        "lookup_dcookie": 212,
        **_SHARED,
    },
    "aarch64": {
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "kcmp": 272,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "bpf": 280,
        "unshare": 97,
        "setns": 268,
        "clone": 220,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "chroot": 51,
        "name_to_handle_at": 264,
        "open_by_handle_at": 265,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "swapon": 224,
        "swapoff": 225,
        "reboot": 142,
        "acct": 89,
        "quotactl": 60,
        "fanotify_init": 262,
        "lookup_dcookie": 18,
        **_SHARED,
    },
}
# Refused with EPERM whatever their arguments: kernel keyrings, tracing and other processes'
# memory, perf, io_uring, userfaultfd, bpf, namespaces, mounts, modules, kexec, swap, reboot.
DENIED = tuple(name for name in SYSCALLS["x86_64"] if name not in ("clone", "clone3"))


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    """One ``struct sock_filter`` {u16 code; u8 jt; u8 jf; u32 k} in native byte order."""
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(machine: str) -> bytes | None:
    """The filter program for ``machine`` (``os.uname().machine``), or None where there is no table.

    Layout: arch check, [x32 check], one ``jeq`` per denied number (-> EPERM), ``clone3``
    (-> ENOSYS), ``clone`` (-> its flags), ALLOW, EPERM, ENOSYS. Jumps are forward offsets.
    """
    if machine not in SYSCALLS:
        return None
    nrs = SYSCALLS[machine]
    denied = [nrs[name] for name in DENIED]
    head = [(_LD_W_ABS, _OFF_ARCH, 0, 0), (_JEQ_K, ARCH[machine], 1, 0), (_RET_K, RET_ERRNO | EPERM, 0, 0)]
    head.append((_LD_W_ABS, _OFF_NR, 0, 0))
    body: list[tuple[int, int, str, str]] = []  # (code, k, jt label, jf label); "" = next
    if machine == "x86_64":
        body.append((_JGE_K, X32_SYSCALL_BIT, "eperm", ""))
    body += [(_JEQ_K, nr, "eperm", "") for nr in denied]
    body.append((_JEQ_K, nrs["clone3"], "enosys", ""))
    body.append((_JEQ_K, nrs["clone"], "", "allow"))
    body.append((_LD_W_ABS, _OFF_ARG0_LOW, "", ""))
    body.append((_JSET_K, CLONE_NEW_FLAGS, "eperm", "allow"))
    start = len(head)
    labels = {"allow": start + len(body), "eperm": start + len(body) + 1, "enosys": start + len(body) + 2}
    program = [_op(*op) for op in head]
    for i, (code, k, jt, jf) in enumerate(body, start):
        program.append(_op(code, k, labels[jt] - i - 1 if jt else 0, labels[jf] - i - 1 if jf else 0))
    program += [_op(_RET_K, RET_ALLOW), _op(_RET_K, RET_ERRNO | EPERM), _op(_RET_K, RET_ERRNO | ENOSYS)]
    return b"".join(program)


MACHINE = os.uname().machine
FILTER: bytes | None = build_filter(MACHINE)
NUMBERS: dict[str, int] = SYSCALLS.get(MACHINE, {})
