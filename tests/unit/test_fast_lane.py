"""The fast lane (`python -m pytest tests/unit -m "not slow and not ray and not vllm"`, docs/development.md)
holds no test that pulls or loads a model or starts Ray: a unit test that needs the SmolLM2 folder, its
tokenizer, a tiny model or a Ray cluster carries the `slow` (or `ray`) marker. These tests collect tests/unit
in a pytest process of their own (15-35 s), unless this session collected all of them unfiltered (the default
suite and CI do): they are `slow` themselves, and the default suite and CI run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY_FIXTURES = {"smollm_dir", "tokenizer", "tiny_model_dir", "ray_cluster"}
"""tests/conftest.py fixtures that pull SmolLM2 (a download and conversion on a fresh machine), build a
model or start Ray."""

PLUGIN = """
import json, os

def pytest_collection_finish(session):
    rows = [
        {"id": item.nodeid, "fixtures": sorted(getattr(item, "fixturenames", [])),
         "markers": sorted({m.name for m in item.iter_markers()})}
        for item in session.items
    ]
    with open(os.environ["FAST_LANE_OUT"], "w") as f:
        json.dump(rows, f)
"""


def lane_items(tmp_path: Path, *args: str) -> list[dict]:
    """The tests that `pytest --collect-only *args` selects, each with every fixture it requests (transitively)."""
    (tmp_path / "lane_plugin.py").write_text(PLUGIN)
    out = tmp_path / "items.json"
    env = {
        **os.environ,
        "FAST_LANE_OUT": str(out),
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--collect-only",
        "-q",
        "-p",
        "lane_plugin",
        "-p",
        "no:cacheprovider",
        *args,
    ]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(out.read_text())


pytestmark = pytest.mark.slow


def rows_of(items) -> list[dict]:
    """What PLUGIN writes, for pytest items."""
    return [
        {
            "id": item.nodeid,
            "fixtures": sorted(getattr(item, "fixturenames", [])),
            "markers": sorted({m.name for m in item.iter_markers()}),
        }
        for item in items
    ]


def session_unit_items(session: pytest.Session) -> list | None:
    """This session's tests/unit items when it collected every file there with nothing filtered
    (no -m, -k or --deselect), else None. (A pytest-xdist worker collects the whole suite too.)"""
    option = session.config.option
    if option.markexpr or option.keyword or getattr(option, "deselect", None):
        return None
    items = [item for item in session.items if item.nodeid.startswith("tests/unit/")]
    files = {item.nodeid.split("::")[0] for item in items}
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "unit").rglob("test_*.py")}
    return items if files == on_disk else None


@pytest.fixture(scope="module")
def unit_items(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    items = session_unit_items(request.session)
    if items is not None:
        return rows_of(items)
    return lane_items(tmp_path_factory.mktemp("lane"), "tests/unit")


def test_this_sessions_items_read_as_a_collection_of_their_own(request, tmp_path):
    """The shortcut above reads what the subprocess's plugin reads."""
    here = [item for item in request.session.items if item.nodeid.startswith("tests/unit/test_fast_lane.py")]
    assert rows_of(here) == lane_items(tmp_path, "tests/unit/test_fast_lane.py")


def in_lane(row: dict) -> bool:
    """What `-m "not slow and not ray and not vllm"` selects."""
    return not {"slow", "ray", "vllm"} & set(row["markers"])


def test_the_fast_lane_needs_no_model_and_no_ray(unit_items):
    lane = [row for row in unit_items if in_lane(row)]
    assert len(lane) > 500  # the lane is the bulk of tests/unit
    heavy = {row["id"]: sorted(HEAVY_FIXTURES & set(row["fixtures"])) for row in lane}
    assert not {k: v for k, v in heavy.items() if v}


def test_the_heavy_unit_tests_are_still_in_the_default_suite(unit_items):
    """Marking moves a test out of the lane, not out of `python -m pytest`."""
    ids = {row["id"]: in_lane(row) for row in unit_items}
    assert ids["tests/unit/test_judge.py::test_a_real_transformers_judge"] is False
    assert any(i.startswith("tests/unit/test_sandbox_escapes.py::") and not lane for i, lane in ids.items())


def test_no_two_test_files_share_a_name():
    """pytest's default import mode imports a test file by its basename: two tests/**/test_x.py files
    make the whole suite's collection fail ("import file mismatch"), not only the second file."""
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
