"""`posttrain.sandbox`'s settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from posttrain.config.common import Strict


class SandboxConfig(Strict):
    """`posttrain.sandbox`: isolated execution of untrusted (model-written) Python code.

    Each run gets a fresh `python -I -S` in new namespaces with these limits; see docs/sandbox.md.
    """

    backend: Literal["auto", "bwrap", "unshare", "none"] = Field(
        "auto",
        description="Isolation: bubblewrap, util-linux unshare, or none (rlimits only; needs "
        "allow_unsafe). auto takes the first that passes a probe run.",
    )
    allow_unsafe: bool = Field(
        False,
        description="Run code even when network or filesystem isolation is unavailable (loud warning).",
    )
    workers: int = Field(2, gt=0, description="Pre-started sandboxed interpreters (parallel runs).")
    timeout_s: float = Field(10.0, gt=0, description="Wall clock per run; the whole sandbox is killed.")
    cpu_s: int = Field(10, gt=0, description="CPU seconds per run (RLIMIT_CPU).")
    memory_mb: int = Field(1024, ge=64, description="Address space per process (RLIMIT_AS).")
    max_output_bytes: int = Field(
        65536, gt=0, description="Per stream; past it the run is killed (status output_limit)."
    )
    max_processes: int = Field(
        16, gt=0, description="Processes of the sandbox's uid (RLIMIT_NPROC); each gets memory_mb."
    )
    max_open_files: int = Field(64, ge=16, description="RLIMIT_NOFILE.")
    max_file_mb: int = Field(16, gt=0, description="Largest file the code may write (RLIMIT_FSIZE).")
    disk_mb: int = Field(64, gt=0, description="Size of the in-memory working directory and of /tmp (each).")
    seccomp: bool = Field(
        True,
        description="Install the syscall filter (keyrings, ptrace, bpf, io_uring, namespaces... get "
        "EPERM). Off only to test the other layers alone; protections() then lists it as a problem.",
    )
