"""What machine a benchmark ran on, and how loaded it was, for its printout."""

from __future__ import annotations

import os
import platform
from pathlib import Path

MATMUL_LEVELS = (
    ("amx_bf16", "AMX"),
    ("avx512_bf16", "AVX-512 BF16"),
    ("avx512f", "AVX-512"),
    ("avx2", "AVX2"),
)
"""CPU flags, best first, that decide how fast fp32 and bf16 matmuls run (bf16 is no faster than fp32
without AVX-512 BF16 or AMX: docs/benchmarks.md)."""


def cpu_fields() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    """The CPU's model name, family and best matmul instructions: "AMD EPYC (family 26 model 2, AVX-512
    BF16)". Two "AMD EPYC" machines differ in what bf16 costs, so the printout says which."""
    fields = cpu_fields()
    name = fields.get("model name") or platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    level = next((label for flag, label in MATMUL_LEVELS if flag in flags), None)
    details = [f"family {fields['cpu family']} model {fields['model']}"] if "cpu family" in fields else []
    details += [level] if level else []
    return f"{name} ({', '.join(details)})" if details else name


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages ("n/a" where the system has none)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"
