"""The floors of docs/architecture.md hold: the import-linter contracts in pyproject.toml (`lint-imports`)
pass on the package, and they fail on a copy of it with one forbidden import added, so they can catch one.
`import posttrain.algorithms` loads no ray, vllm or transformers (checked at run time too)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("importlinter", reason="import-linter is not installed (pip install 'posttrain[dev]')")


def lint_imports(root: Path, src: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with `root`'s pyproject.toml, on the `posttrain` package found under `src`."""
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_contracts_hold():
    result = lint_imports(ROOT, ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the repository's pyproject.toml and src/posttrain, to break on purpose."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    shutil.copytree(
        ROOT / "src" / "posttrain", root / "src" / "posttrain", ignore=shutil.ignore_patterns("__pycache__")
    )
    return root


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        (
            "models/policy.py",
            "import posttrain.generation.sampling",
            "training and sampling sides are independent",
        ),
        (
            "generation/worker.py",
            "import posttrain.models.policy",
            "training and sampling sides are independent",
        ),
        ("modeling/loading.py", "import posttrain.models.policy", "floors"),
        ("environments/math.py", "import posttrain.rollout.rollout", "floors"),
        ("algorithms/metrics.py", "import transformers", "algorithms: pure math"),
        ("algorithms/metrics.py", "import posttrain.config.common", "algorithms: pure math"),
        ("modeling/attention.py", "import posttrain.modeling.loading", "no import circles"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(package_copy: Path, module: str, line: str, contract: str):
    path = package_copy / "src" / "posttrain" / module
    original = path.read_text()
    try:
        path.write_text(original + f"\n{line}  # added by test_import_contracts\n")
        result = lint_imports(package_copy, package_copy / "src")
    finally:
        path.write_text(original)
    broken = [row for row in result.stdout.splitlines() if row.endswith("BROKEN") or " BROKEN (" in row]
    assert result.returncode == 1, result.stdout + result.stderr
    assert any(row.startswith(contract) for row in broken), result.stdout


def test_import_posttrain_algorithms_loads_no_ray_vllm_or_transformers():
    code = (
        "import sys, posttrain.algorithms\n"
        "heavy = [m for m in ('ray', 'vllm', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
