"""benchmarks/machine.py names the CPU with what decides bf16 speed (AVX2 alone, AVX-512 BF16, AMX)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import machine  # noqa: E402


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("fpu sse2 avx2 fma", "AMD EPYC (family 25 model 1, AVX2)"),
        ("avx2 avx512f avx512bw", "AMD EPYC (family 25 model 1, AVX-512)"),
        ("avx2 avx512f avx512_bf16", "AMD EPYC (family 25 model 1, AVX-512 BF16)"),
        ("avx2 avx512f avx512_bf16 amx_tile amx_bf16", "AMD EPYC (family 25 model 1, AMX)"),
        ("sse2", "AMD EPYC (family 25 model 1)"),
    ],
)
def test_cpu_model_names_the_best_matmul_instructions(monkeypatch, flags, expected):
    fields = {"model name": "AMD EPYC", "cpu family": "25", "model": "1", "flags": flags}
    monkeypatch.setattr(machine, "cpu_fields", lambda: fields)
    assert machine.cpu_model() == expected


def test_cpu_model_without_cpuinfo_is_the_platform_name(monkeypatch):
    monkeypatch.setattr(machine, "cpu_fields", dict)
    assert machine.cpu_model()  # platform.processor() or the machine type, never empty
