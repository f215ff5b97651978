"""The layout rule of docs/architecture.md: no module in src/ is longer than 600 lines (a longer one
is split by what it holds, as code_docstring's templates and sliding_puzzle's board were)."""

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_LINES = 600


def test_no_module_in_src_is_over_600_lines() -> None:
    modules = sorted(SRC.rglob("*.py"))
    assert len(modules) > 100  # the tree was found
    lengths = {str(p.relative_to(SRC)): len(p.read_text().splitlines()) for p in modules}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
