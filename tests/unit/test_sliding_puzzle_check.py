"""The sliding puzzle player that writes its check (`written_check`, `greedy_move`,
`checked_transcript`): the check worked by hand on one board, every line of it true of the board it
was written for, what the greedy rule solves, and the transcripts replayed through the environment."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import pytest

from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment, checked_transcript
from posttrain.environments.sliding_puzzle_board import (
    DIRECTIONS,
    Grid,
    apply_action,
    boards_near_goal,
    hidden_from_training,
    is_heldout,
    is_solved,
    legal_directions,
    render,
    render_board,
    render_cells,
    task_grid,
)
from posttrain.environments.sliding_puzzle_check import brings_closer, greedy_move, written_check

SCRIPT = Path(__file__).parents[2] / "examples" / "sliding_puzzle_transcripts.py"
REPORT = Path(__file__).parents[2] / "examples" / "sliding_puzzle_check_report.py"
ENV = {"min_size": 3, "max_size": 3, "max_shuffle_moves": 9, "max_moves": 6, "redraw_board": True}


def grid_of(key: tuple[int, ...], n: int = 3) -> Grid:
    return [list(key[r * n : (r + 1) * n]) for r in range(n)]


def manhattan(grid: Grid) -> int:
    """Sum over tiles of the row and column distance to the tile's home (tile t at (t-1)//n, (t-1)%n)."""
    n = len(grid)
    return sum(
        abs(r - (v - 1) // n) + abs(c - (v - 1) % n)
        for r, row in enumerate(grid)
        for c, v in enumerate(row)
        if v
    )


def test_the_check_worked_by_hand() -> None:
    # 1 2 3 / 4 5 6 / 7 _ 8: the empty square at row 3, column 2. `up` has no tile below it; `down`
    # moves 5 (home row 2) from row 2 to row 3: farther; `left` moves 8 (home column 2) from column 3 to
    # column 2: closer (home); `right` moves 7 (home column 1) from column 1 to 2: farther.
    board = [[1, 2, 3], [4, 5, 6], [7, 0, 8]]
    assert written_check(board) == (
        "Empty square: row 3, column 2.\n"
        "up: none.\n"
        "down: tile 5, row 2 to 3, belongs in row 2: farther.\n"
        "left: tile 8, column 3 to 2, belongs in column 2: closer.\n"
        "right: tile 7, column 1 to 2, belongs in column 1: farther."
    )
    assert greedy_move(board) == "left" and is_solved(apply_action(board, "left")[0])
    # 1 2 3 / 4 _ 5 / 7 8 6: `up` moves 8 (home row 3) up from row 3: farther; `down` moves 2 (home
    # row 1) down: farther; `left` moves 5 (home column 2) from column 3 to 2: closer; `right` moves 4
    # (home column 1) to column 2: farther.
    board = [[1, 2, 3], [4, 0, 5], [7, 8, 6]]
    assert [brings_closer(board, d) for d in DIRECTIONS] == [False, False, True, False]
    assert greedy_move(board) == "left"
    # no move brings a tile closer: the first legal direction
    corner = [[0, 2], [3, 1]]  # 2x2: `up` moves 3 (home row 2) to row 1, `left` moves 2 (home column 2) to 1
    assert [brings_closer(corner, d) for d in DIRECTIONS] == [False, None, False, None]
    assert greedy_move(corner) == "up"


def test_a_board_written_cell_by_cell() -> None:
    # [[1, 0], [3, 2]]: reading order, 1-based coordinates, `_` for the empty square
    board = [[1, 0], [3, 2]]
    assert (
        render_cells(board)
        == "row 1, column 1: 1\nrow 1, column 2: _\nrow 2, column 1: 3\nrow 2, column 2: 2"
    )
    # relabelled: tile t shows as labels[t - 1] (1 -> 3, 2 -> 1, 3 -> 2); the empty square stays `_`
    assert render_cells(board, [3, 1, 2]).split("\n") == [
        "row 1, column 1: 3",
        "row 1, column 2: _",
        "row 2, column 1: 2",
        "row 2, column 2: 1",
    ]
    assert render_board(board, board_format="cells") == render_cells(board)
    assert render_board(board) == render(board)
    with pytest.raises(ValueError, match="unknown board_format"):
        render_board(board, board_format="table")
    with pytest.raises(ValueError, match="unknown board_format"):
        SlidingPuzzleEnvironment(board_format="table")


def test_the_cells_check_names_the_cell_it_reads() -> None:
    # the hand-worked board above (1 2 3 / 4 5 6 / 7 _ 8): each line as before, after the cell of the
    # tile it moves: `down` reads row 2, column 2 (above the empty square), `left` row 3, column 3
    board = [[1, 2, 3], [4, 5, 6], [7, 0, 8]]
    assert written_check(board, cells=True) == (
        "Empty square: row 3, column 2.\n"
        "up: none.\n"
        "down: row 2, column 2: tile 5, row 2 to 3, belongs in row 2: farther.\n"
        "left: row 3, column 3: tile 8, column 3 to 2, belongs in column 2: closer.\n"
        "right: row 3, column 1: tile 7, column 1 to 2, belongs in column 1: farther."
    )
    # every cell a check names is written word for word on the board it was written for (the lookup a
    # player makes), and the rest of each line is the grid check's
    cell = re.compile(r"(\w+): (row \d, column \d): tile (\d+), ")
    for key, d in boards_near_goal(3, 8).items():
        if d == 0:
            continue
        board = grid_of(key)
        shown = render_cells(board).split("\n")
        for with_cell, without in zip(
            written_check(board, cells=True).split("\n"), written_check(board).split("\n"), strict=True
        ):
            match = cell.match(with_cell)
            if match is None:
                assert with_cell == without
                continue
            direction, where, tile = match.groups()
            assert f"{where}: {tile}" in shown
            assert with_cell.replace(f"{where}: ", "", 1) == without


def test_every_line_of_the_check_is_true_of_its_board() -> None:
    """Each line read back against the board: the empty square's cell, the tile each direction moves,
    its row or column before and after, its home, and closer exactly when the board's Manhattan
    distance drops (checked by its own sum, not by `brings_closer`)."""
    line = re.compile(
        r"(\w+): tile (\d+), (row|column) (\d) to (\d), belongs in (row|column) (\d): (closer|farther)\."
    )
    for key, d in boards_near_goal(3, 8).items():
        if d == 0:
            continue
        board = grid_of(key)
        first, *rest = written_check(board).split("\n")
        er, ec = next((r, c) for r in range(3) for c in range(3) if board[r][c] == 0)
        assert first == f"Empty square: row {er + 1}, column {ec + 1}."
        assert [x.split(":")[0] for x in rest] == list(DIRECTIONS)
        for text in rest:
            direction = text.split(":")[0]
            if direction not in legal_directions(board):
                assert text == f"{direction}: none."
                continue
            name, tile, axis, frm, to, axis2, home, verdict = line.fullmatch(text).groups()
            after = apply_action(board, direction)[0]
            r, c = next((r, c) for r in range(3) for c in range(3) if board[r][c] == int(tile))
            assert after[er][ec] == int(tile) and axis == axis2
            assert (int(frm), int(to), int(home)) == (
                (r + 1, er + 1, (int(tile) - 1) // 3 + 1)
                if axis == "row"
                else (c + 1, ec + 1, (int(tile) - 1) % 3 + 1)
            )
            assert (verdict == "closer") == (manhattan(after) == manhattan(board) - 1)
            assert manhattan(after) in (manhattan(board) - 1, manhattan(board) + 1)


def test_what_the_greedy_rule_solves() -> None:
    """On 3x3 boards the first move that brings a tile closer is a shortest solution's move on every
    board within 4 moves of solved, and 17 of the 20 boards 5 moves away are solved within 6 moves
    (the evaluation's budget)."""
    near = {k: d for k, d in boards_near_goal(3, 5).items() if d <= 5}  # the cache may hold more
    solved_in_6 = {d: 0 for d in range(1, 6)}
    for key, d in near.items():
        if d == 0:
            continue
        board, moves = grid_of(key), 0
        while not is_solved(board) and moves < 6:
            before = near.get(tuple(v for row in board for v in row), 99)
            board = apply_action(board, greedy_move(board))[0]
            moves += 1
            if d <= 4:  # every move one closer
                assert near[tuple(v for row in board for v in row)] == before - 1
        solved_in_6[d] += is_solved(board)
    counts = {d: sum(1 for v in near.values() if v == d) for d in range(1, 6)}
    assert counts == {1: 2, 2: 4, 3: 8, 4: 16, 5: 20}
    assert solved_in_6 == {1: 2, 2: 4, 3: 8, 4: 16, 5: 17}


@pytest.mark.parametrize("board_format", ["grid", "cells"])
def test_checked_transcripts_replay_through_the_environment(board_format: str) -> None:
    env = SlidingPuzzleEnvironment(**ENV, board_format=board_format)
    cells = board_format == "cells"
    heldout_renders = [
        render_board(grid_of(k), board_format=board_format)
        for k, d in boards_near_goal(3, 9).items()
        if d and is_heldout(grid_of(k))
    ]
    endings = {"solved": 0, "cut": 0, "budget": 0}
    for task in env.generate_tasks(80, seed=4, split="train"):
        messages = checked_transcript(env, task)
        [start] = env.reset([task], [0])
        assert messages[: len(start.messages)] == start.messages
        log, meta = list(start.messages), start.metadata
        turns = messages[len(start.messages) :]
        for k in range(0, len(turns), 2):
            check, action = turns[k]["content"].rsplit("\n", 1)
            assert (
                check == written_check(meta["grid"], cells=cells)
                and action == f"<action>{greedy_move(meta['grid'])}</action>"
            )
            log.append(turns[k])
            result = env.step([log], [meta])
            meta = result.metadata[0]
            assert result.info[0]["outcome"] == "moved"
            if k + 1 < len(turns):
                assert turns[k + 1] == result.observations[0]
                log.append(turns[k + 1])
        text = "\n".join(m["content"] for m in messages)
        assert not any(board in text for board in heldout_renders)
        if result.info[0]["solved"]:
            endings["solved"] += 1
        elif is_heldout(meta["grid"]):
            endings["cut"] += 1
        else:
            assert meta["moves"] == 6
            endings["budget"] += 1
    assert all(endings.values()), endings  # all three endings occur
    if cells:
        assert render_cells(start.metadata["grid"]) in messages[0]["content"]
        assert "+---" not in text  # no drawn grid anywhere
    with pytest.raises(ValueError, match="without action_prefix"):
        checked_transcript(SlidingPuzzleEnvironment(**ENV, action_prefix=True), task)
    with pytest.raises(ValueError, match="starts from a held-out board"):
        checked_transcript(env, env.generate_tasks(1, seed=0, split="heldout")[0])


def test_the_script_writes_checked_rows(tmp_path: Path) -> None:
    script = runpy.run_path(str(SCRIPT), run_name="sliding_puzzle_transcripts")
    out = tmp_path / "checked.jsonl"
    script["main"]([str(out), "--count", "10", "--seed", "3", "--checked", "--env", json.dumps(ENV)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    env = SlidingPuzzleEnvironment(**ENV)
    assert [r["messages"] for r in rows] == [checked_transcript(env, r["task"]) for r in rows]
    assert [r["task"] for r in rows] == env.generate_tasks(10, 3, split="train")


@pytest.mark.slow  # the SmolLM2 tokenizer
def test_without_history_the_script_writes_one_row_per_turn_as_the_episode_sees_it(
    tmp_path: Path, tokenizer
) -> None:
    """With history=false every turn of an episode is its own token sequence, the first message for
    its board then the reply; the script writes each turn as such a row, SFT's tokens are then the
    GRPO context's (plus the end-of-turn marker), and no row shows a held-out board."""
    from posttrain.data.tokenize import encode_prompt, tokenize_conversation
    from posttrain.environments.sliding_puzzle import instructions, turn_contexts

    kwargs = {
        **ENV,
        "max_shuffle_moves": 21,
        "redraw_board": False,
        "board_format": "cells",
        "history": False,
    }
    script = runpy.run_path(str(SCRIPT), run_name="sliding_puzzle_transcripts")
    out = tmp_path / "turns.jsonl"
    script["main"]([str(out), "--count", "12", "--seed", "3", "--checked", "--env", json.dumps(kwargs)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    env = SlidingPuzzleEnvironment(**kwargs)
    tasks = env.generate_tasks(12, 3, split="train")
    expected = [c for task in tasks for c in turn_contexts(env, checked_transcript(env, task))]
    assert [r["messages"] for r in rows] == expected and len(rows) > len(tasks)  # several turns a puzzle
    boards = [
        g
        for task in tasks
        for g in _boards_of(env, task)[: len(turn_contexts(env, checked_transcript(env, task)))]
    ]
    for row, grid in zip(rows, boards, strict=True):
        prompt, answer = row["messages"]
        assert prompt == {"role": "user", "content": instructions(grid, board_format="cells")}
        assert answer["content"].startswith(written_check(grid, cells=True) + "\n")
        assert not is_heldout(grid)
        sft = tokenize_conversation(tokenizer, row["messages"])
        reply = tokenizer(answer["content"], add_special_tokens=False)["input_ids"]
        context = encode_prompt(tokenizer, [prompt]) + reply
        assert sft.input_ids[: len(context)] == context
        assert tokenizer.decode(sft.input_ids[len(context) :]) == "<|im_end|>\n"


def _boards_of(env: SlidingPuzzleEnvironment, task: dict) -> list:
    """The boards the checked player is shown from the task's board on, turn by turn."""
    boards = [task_grid(task)]
    for _ in range(env.max_moves - 1):
        boards.append(apply_action(boards[-1], greedy_move(boards[-1]))[0])
    return boards


@pytest.mark.parametrize("board_format", ["grid", "cells"])
def test_the_check_report_reads_both_board_formats(board_format: str) -> None:
    """examples/sliding_puzzle_check_report.py on eval samples made of checked transcripts: every share
    1 for the rule's own turns; a turn with the empty square misread and the move of a farther line
    counts as such."""
    report = runpy.run_path(str(REPORT), run_name="sliding_puzzle_check_report")["report"]
    env = SlidingPuzzleEnvironment(**ENV, board_format=board_format)
    samples = []
    for task in env.generate_tasks(6, seed=5, split="train"):
        first, *rest = checked_transcript(env, task)
        samples.append({"prompt": first["content"], "messages": rest})
    # `posttrain eval` keeps an episode of one turn as its completion, without a message log
    samples.append({"prompt": first["content"], "messages": None, "completion": rest[0]["content"]})
    turns = sum(m["role"] == "assistant" for s in samples for m in s["messages"] or [{"role": "assistant"}])
    perfect = report(samples)
    by_turn = perfect.pop("turns_by_turn")
    assert sum(by_turn) == turns and by_turn[0] == len(samples)
    assert perfect.pop("all_lines_by_turn") == perfect.pop("move_is_greedy_by_turn") == [1.0] * len(by_turn)
    assert perfect == {
        "turns": turns,
        "empty_square_line": 1.0,
        "direction_lines": 1.0,
        "all_lines": 1.0,
        "move_follows_own_check": 1.0,
        "move_is_greedy": 1.0,
        "move_is_legal": 1.0,
    }
    # the first turn rewritten: the empty square misread, and the move a direction its check calls farther
    turn = samples[0]["messages"][0]
    lines = turn["content"].split("\n")
    farther = next(line.split(":")[0] for line in lines[1:5] if line.endswith("farther."))
    lines[0] = "Empty square: row 9, column 9."
    lines[-1] = f"<action>{farther}</action>"
    samples[0]["messages"][0] = {"role": "assistant", "content": "\n".join(lines)}
    worse = report(samples)
    assert worse["all_lines_by_turn"][0] == pytest.approx(1 - 1 / len(samples))
    assert worse["all_lines_by_turn"][1:] == [1.0] * (len(by_turn) - 1)
    assert worse["empty_square_line"] == worse["all_lines"] == pytest.approx((turns - 1) / turns)
    assert worse["direction_lines"] == 1.0 and worse["move_is_legal"] == 1.0
    assert worse["move_follows_own_check"] == worse["move_is_greedy"] == pytest.approx((turns - 1) / turns)


def test_hidden_from_training_within_a_distance() -> None:
    near = boards_near_goal(3, 11)
    heldout = {d: grid_of(k) for k, d in sorted(near.items(), key=lambda kv: kv[1]) if is_heldout(grid_of(k))}
    train = next(grid_of(k) for k, d in near.items() if d == 5 and not is_heldout(grid_of(k)))
    assert not hidden_from_training(train) and not hidden_from_training(train, within=11)
    board5, board11 = heldout[5], heldout[11]
    assert hidden_from_training(board5) and hidden_from_training(board5, within=5)
    assert not hidden_from_training(board5, within=4)  # 5 moves from solved: beyond 4
    assert hidden_from_training(board11, within=11) and not hidden_from_training(board11, within=10)


def test_cells_transcripts_hide_every_board_a_heldout_episode_can_show() -> None:
    """The transcripts of the variant with longer conversations (docs/environments.md#a-board-written-cell-by-cell:
    shuffles of up to 81 moves, `--hide-within 11`) never draw a held-out board within 11 moves of
    solved, and every board the held-out evaluations start from (5 shuffle moves at most, 6 moves:
    within 11 moves of solved all along) is such a board; a part of the transcripts play all 6 turns."""
    within = 11
    env = SlidingPuzzleEnvironment(**{**ENV, "max_shuffle_moves": 81, "board_format": "cells"})
    hidden = [
        render_cells(grid_of(k))
        for k, d in boards_near_goal(3, within).items()
        if d <= within and is_heldout(grid_of(k))
    ]
    turns = []
    for task in env.generate_tasks(60, seed=8, split="train"):
        messages = checked_transcript(env, task, hide_within=within)
        text = "\n".join(m["content"] for m in messages)
        assert not any(board in text for board in hidden)
        turns.append(sum(m["role"] == "assistant" for m in messages))
    assert turns.count(6) >= 10
    for min_solution_moves in (1, 3):
        evaluation = SlidingPuzzleEnvironment(
            min_size=3, max_size=3, max_shuffle_moves=5, max_moves=6, min_solution_moves=min_solution_moves
        )
        for task in evaluation.generate_tasks(256, 99999, split="heldout"):
            assert hidden_from_training(task_grid(task), within)
