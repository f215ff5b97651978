"""The tree is ruff-clean: `ruff check` and `ruff format --check` (pyproject.toml's settings) pass on the
repository, and the same two commands fail on a file that breaks them, so the check can fail. ruff is
pinned in the dev extra: a new release's formatting changes are taken on purpose, not by CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("ruff", reason="ruff is not installed (pip install 'posttrain[dev]')")


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_the_repository_passes_ruff_check_and_format():
    # --no-cache: a stale .ruff_cache once passed this test here on a file CI's clean clone reformats
    lint = ruff("check", "--no-cache", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = ruff("format", "--no-cache", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_ruff_fails_on_a_file_that_breaks_it(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\nx=[1,\n2]\n")  # an unused import, unformatted
    assert ruff("check", ".", cwd=tmp_path).returncode == 1
    assert ruff("format", "--check", ".", cwd=tmp_path).returncode == 1
