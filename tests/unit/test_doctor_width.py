"""`posttrain doctor`'s table is as wide as the terminal ($COLUMNS when set, 80 for a pipe), never a
forced 120 columns; below 50 columns it is a list of lines (issue #30, console)."""

from __future__ import annotations

import pytest

from posttrain.doctor import Check, print_table

DETAIL = "python 3.11.7, torch 2.9.0, transformers 4.57, ray 2.60.0, vllm not installed"
FIX = "run docker with --shm-size=3g or set generation.refit_transport=object_store"
CHECKS = [Check("versions", "ok", DETAIL), Check("/dev/shm", "fail", "1.0 GiB free, need 1.5 GiB", FIX, True)]


def printed(monkeypatch, capsys, columns: int | None) -> list[str]:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(columns))
    print_table(CHECKS, "posttrain doctor: default (grpo config)")
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("columns", [60, 200])
def test_the_table_fits_the_terminal(monkeypatch, capsys, columns):
    lines = printed(monkeypatch, capsys, columns)
    assert max(len(line) for line in lines) <= columns
    assert any("check" in line and "status" in line and "fix" in line for line in lines)  # a table
    one_line = any(DETAIL in line for line in lines) and any(FIX in line for line in lines)
    assert one_line == (columns == 200)  # wide: each cell on one line; narrow: folded, nothing cut


def test_a_pipe_without_columns_gets_80(monkeypatch, capsys):
    lines = printed(monkeypatch, capsys, None)  # pytest's stdout is not a terminal
    assert max(len(line) for line in lines) <= 80


def test_narrow_terminal_gets_a_list(monkeypatch, capsys):
    lines = printed(monkeypatch, capsys, 40)
    assert max(len(line) for line in lines) <= 40
    assert "versions: ok" in lines and "/dev/shm: FAIL" in lines
    text = " ".join(line.strip() for line in lines)
    assert "found: 1.0 GiB free, need 1.5 GiB" in text and "fix: run docker with --shm-size=3g" in text
