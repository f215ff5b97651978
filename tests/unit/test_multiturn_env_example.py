"""The multi-turn and tool examples of docs/environments.md: the page quotes examples/multiturn_env.py
exactly, the file runs, and its two environments play as the page says."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "multiturn_env.py"


def test_docs_quote_the_example_exactly() -> None:
    page = (REPO / "docs" / "environments.md").read_text()
    sections = page[
        page.index("## Write a multi-turn environment") : page.index("## Code and the Python tool")
    ]
    blocks = re.findall(r"```py\n(.*?)```", sections, re.S)
    assert len(blocks) == 4  # Nim (class and reset; step), the tool function, the tool environment
    example = EXAMPLE.read_text()
    for block in blocks:
        assert block in example


@pytest.mark.slow
def test_example_runs_as_a_script() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120, check=True, cwd=REPO
    ).stdout
    assert "user: I take 1. 3 stones left. Your move." in out
    assert out.count("reward 1.0, scored True") == 2
    assert "tool: 6" in out


def test_nim_plays_by_the_rules() -> None:
    example = runpy.run_path(str(EXAMPLE), run_name="multiturn_env_example")
    env = example["NimEnvironment"]()
    tasks = env.generate_tasks(3, seed=0)
    assert tasks == env.generate_tasks(3, seed=0) and all(5 <= t["stones"] <= 12 for t in tasks)
    starts = env.reset([{"stones": 6}, {"stones": 2}, {"stones": 0}, {"stones": 5}], [0] * 4)
    assert starts[0].stop_strings == ("</move>",) and starts[0].metadata == {"stones": 6}
    logs = [
        [*s.messages, {"role": "assistant", "content": c}]
        for s, c in zip(
            starts, ["<move>1", "<move>2</move>", "<move>1</move>", "<move>4</move>"], strict=True
        )
    ]
    result = env.step(logs, [s.metadata for s in starts])
    # 6 - 1 = 5, the environment takes 5 % 4 = 1, 4 left; 2 - 2 = 0 wins; a broken task is not
    # scored; taking 4 is illegal and loses
    assert result.observations[0] == {"role": "user", "content": "I take 1. 4 stones left. Your move."}
    assert result.metadata[0] == {"stones": 4}
    assert result.rewards == [0.0, 1.0, 0.0, 0.0]
    assert result.done == [False, True, True, True]
    assert result.scored == [True, True, False, True]
    assert result.stop_strings == [("</move>",), None, None, None]
    assert env.batch_metrics(result) == {"env/win_rate": 1 / 3}


def test_longer_word_uses_its_tool() -> None:
    example = runpy.run_path(str(EXAMPLE), run_name="multiturn_env_example")
    env = example["LongerWordEnvironment"]()
    [start] = env.reset([{"a": "fig", "b": "banana"}], [0])
    assert [s["function"]["name"] for s in start.tools] == ["word_length"]
    call = '<tool_call>{"name": "word_length", "arguments": {"word": "fig"}}</tool_call>'
    log = [*start.messages, {"role": "assistant", "content": call}]
    first = env.step([log], [start.metadata])
    assert first.observations == [{"role": "tool", "name": "word_length", "content": "3"}]
    log += [first.observations[0], {"role": "assistant", "content": "fig"}]
    final = env.step([log], first.metadata)
    assert final.rewards == [0.0] and final.done == [True] and final.info[0]["called_tool"] is True
