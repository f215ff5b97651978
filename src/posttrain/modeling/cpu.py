"""What this machine's CPU can do for a run: its flags, and which of them make bf16 matmuls fast."""

from __future__ import annotations

from pathlib import Path

BF16_MATMUL_FLAGS = ("amx_bf16", "avx512_bf16")
"""CPU flags of bf16 matrix instructions: with neither, a bf16 matmul is no faster than fp32's."""


def cpu_flags() -> set[str]:
    """The first processor's flags in /proc/cpuinfo (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
