"""Sliding puzzle: rendering, move rules, generation (odd shuffles, never solved), a BFS oracle, and
episodes played through reset/step (an oracle policy, malformed and illegal actions, max_moves)."""

from __future__ import annotations

import pytest

from posttrain.environments import ENVIRONMENTS, EpisodeStart, make_environment
from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment, oracle_transcript, parse_action
from posttrain.environments.sliding_puzzle_board import (
    IllegalMove,
    apply_action,
    check_labels,
    is_heldout,
    is_solved,
    legal_directions,
    render,
    shuffled_grid,
    solve_bfs,
    solved_grid,
    task_grid,
    tiles_in_place,
)

SOLVED_3 = [[1, 2, 3], [4, 5, 6], [7, 8, 0]]
ONE_LEFT = [[1, 2, 3], [4, 5, 6], [7, 0, 8]]  # solved by moving tile 8 left


def reply(text: str, start: EpisodeStart | None = None) -> list[dict]:
    """A conversation that ends with the assistant's `text`."""
    first = start.messages if start else [{"role": "user", "content": "play"}]
    return [*first, {"role": "assistant", "content": text}]


def one_episode(env: SlidingPuzzleEnvironment, grid: list[list[int]], max_moves: int = 50) -> dict:
    """Metadata of an episode that starts from `grid`."""
    return {"size": len(grid), "grid": grid, "moves": 0, "max_moves": max_moves}


# --- the board -------------------------------------------------------------------------------------


def test_render_golden_boards() -> None:
    assert render([[1, 0], [3, 2]]) == ("    1 2\n  +-----+\n1 | 1 _ |\n2 | 3 2 |\n  +-----+")
    assert render(ONE_LEFT) == ("    1 2 3\n  +-------+\n1 | 1 2 3 |\n2 | 4 5 6 |\n3 | 7 _ 8 |\n  +-------+")
    # two-digit tiles: every cell two wide, column labels over the cells
    board = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 0, 15]]
    assert render(board) == (
        "     1  2  3  4\n"
        "  +-------------+\n"
        "1 |  1  2  3  4 |\n"
        "2 |  5  6  7  8 |\n"
        "3 |  9 10 11 12 |\n"
        "4 | 13 14  _ 15 |\n"
        "  +-------------+"
    )


def test_goal_and_tiles_in_place() -> None:
    assert solved_grid(2) == [[1, 2], [3, 0]]
    assert solved_grid(3) == SOLVED_3
    assert is_solved(SOLVED_3) and not is_solved(ONE_LEFT)
    assert tiles_in_place(SOLVED_3) == 1.0
    assert tiles_in_place(ONE_LEFT) == 7 / 8  # all but tile 8
    assert tiles_in_place([[0, 1], [2, 3]]) == 0.0


def test_directions_move_the_tile_next_to_the_empty_square() -> None:
    # empty square bottom right: only the tile above (6) can move down, the tile left of it (8) right
    assert legal_directions(SOLVED_3) == ["down", "right"]
    assert apply_action(SOLVED_3, "down")[0] == [[1, 2, 3], [4, 5, 0], [7, 8, 6]]
    assert apply_action(SOLVED_3, "right")[0] == [[1, 2, 3], [4, 5, 6], [7, 0, 8]]
    assert apply_action(ONE_LEFT, "left") == (SOLVED_3, "Moved tile 8 left.")
    # empty square in the middle: all four
    middle = [[1, 2, 3], [4, 0, 5], [7, 8, 6]]
    assert legal_directions(middle) == ["up", "down", "left", "right"]
    assert apply_action(middle, "up")[0] == [[1, 2, 3], [4, 8, 5], [7, 0, 6]]
    assert apply_action(middle, "left")[0] == [[1, 2, 3], [4, 5, 0], [7, 8, 6]]
    for direction in ("up", "left"):
        with pytest.raises(IllegalMove, match=f"Cannot move {direction}"):
            apply_action(SOLVED_3, direction)


def test_slide_row_col() -> None:
    assert apply_action(SOLVED_3, "slide 2 3") == (
        [[1, 2, 3], [4, 5, 0], [7, 8, 6]],
        "Slid tile 6 into the empty square.",
    )
    assert apply_action(SOLVED_3, " SLIDE 3 2 ")[0] == ONE_LEFT
    with pytest.raises(IllegalMove, match=r"not next to the empty square at \(3, 3\)"):
        apply_action(SOLVED_3, "slide 1 1")
    with pytest.raises(IllegalMove, match="from 1 to 3"):
        apply_action(SOLVED_3, "slide 4 3")
    with pytest.raises(IllegalMove, match="slide row col"):
        apply_action(SOLVED_3, "slide a b")
    with pytest.raises(IllegalMove, match="Unknown action 'jump'"):
        apply_action(SOLVED_3, "jump")
    with pytest.raises(IllegalMove, match="Unknown action"):
        apply_action(SOLVED_3, "")


def test_a_move_does_not_change_its_input() -> None:
    grid = [row[:] for row in SOLVED_3]
    apply_action(grid, "down")
    assert grid == SOLVED_3


def test_parse_action() -> None:
    assert parse_action("I move the 8. <action>left</action>") == "left"
    assert parse_action("<action>up</action> no wait <ACTION> Slide 1 2 </Action> done") == "slide 1 2"
    assert parse_action("thinking... <action>right") == "right"  # closing tag cut as a stop string
    assert parse_action("left") is None
    assert parse_action("<action></action>") == ""


# --- generation and the oracle ---------------------------------------------------------------------


def test_generated_tasks_are_odd_seeded_and_in_range() -> None:
    env = SlidingPuzzleEnvironment(min_size=2, max_size=4, max_shuffle_moves=10)
    tasks = env.generate_tasks(200, seed=5)
    assert tasks == env.generate_tasks(200, seed=5)
    assert tasks != env.generate_tasks(200, seed=6)
    assert {t["size"] for t in tasks} == {2, 3, 4}
    assert all(t["shuffle_moves"] % 2 == 1 and 1 <= t["shuffle_moves"] <= 11 for t in tasks)
    assert all(set(t) == {"size", "shuffle_moves", "puzzle_seed"} for t in tasks)


def test_odd_shuffles_never_start_solved_and_are_deterministic() -> None:
    for seed in range(300):
        grid = shuffled_grid(2 + seed % 3, 1 + 2 * (seed % 8), seed)
        assert not is_solved(grid)
        assert sorted(v for row in grid for v in row) == list(range(len(grid) ** 2))
    assert shuffled_grid(3, 9, 42) == shuffled_grid(3, 9, 42)
    # an even walk can come back: two moves there and back again from the goal
    assert any(is_solved(shuffled_grid(2, 2, seed)) for seed in range(20))


def test_bfs_oracle_solves_every_generated_puzzle() -> None:
    env = SlidingPuzzleEnvironment(min_size=2, max_size=3, max_shuffle_moves=15)
    tasks = env.generate_tasks(100, seed=0)
    assert {t["size"] for t in tasks} == {2, 3}
    for start, task in zip(env.reset(tasks, list(range(100))), tasks, strict=True):
        grid = start.metadata["grid"]
        path = solve_bfs(grid)
        assert path is not None
        # shortest: no longer than the shuffle, and of the same (odd) parity
        assert len(path) <= task["shuffle_moves"] and len(path) % 2 == 1
        for move in path:
            grid, _ = apply_action(grid, move)
        assert is_solved(grid)


def test_bfs_hand_cases() -> None:
    assert solve_bfs(ONE_LEFT) == ["left"]
    assert solve_bfs(SOLVED_3) == []
    assert solve_bfs([[1, 2, 3], [4, 0, 5], [7, 8, 6]]) == ["left", "up"]
    # a swapped pair is the other half of the state space: unsolvable, the search runs out
    assert solve_bfs([[2, 1], [3, 0]]) is None


# --- episodes through reset / step ----------------------------------------------------------------


def test_reset_is_deterministic_and_starts_the_episode() -> None:
    env = SlidingPuzzleEnvironment()
    task = {"size": 3, "shuffle_moves": 7, "puzzle_seed": 17}
    start, again = env.reset([task, task], [0, 1])  # the puzzle seed wins over the episode seed
    assert start.metadata == again.metadata
    assert start.metadata["grid"] == shuffled_grid(3, 7, 17)
    assert start.metadata["moves"] == 0 and start.metadata["max_moves"] == 50
    assert start.stop_strings == ("</action>",) and start.tools is None
    [message] = start.messages
    assert message["role"] == "user"
    assert render(start.metadata["grid"]) in message["content"]
    assert "<action>up</action>" in message["content"]
    # a task without its own seed takes the episode's seed
    unseeded = env.reset([{"size": 2, "shuffle_moves": 3}] * 2, [3, 3])
    assert unseeded[0].metadata["grid"] == shuffled_grid(2, 3, 3)
    # and a task's own max_moves wins over the environment's
    assert env.reset([{**task, "max_moves": 5}], [0])[0].metadata["max_moves"] == 5


def test_oracle_policy_solves_every_puzzle_through_step() -> None:
    env = make_environment("sliding_puzzle", max_shuffle_moves=15, max_moves=15)
    tasks = env.generate_tasks(24, seed=1)
    starts = env.reset(tasks, list(range(24)))
    logs = [list(s.messages) for s in starts]
    metadata = [s.metadata for s in starts]
    plans = [solve_bfs(m["grid"]) for m in metadata]
    total = [0.0] * 24
    live = list(range(24))
    for turn in range(15):
        for i in live:
            logs[i].append({"role": "assistant", "content": f"Thinking. <action>{plans[i][turn]}</action>"})
        result = env.step([logs[i] for i in live], [metadata[i] for i in live])
        assert result.stop_strings == [("</action>",)] * len(live)
        still = []
        for k, i in enumerate(live):
            total[i] += result.rewards[k]
            metadata[i] = result.metadata[k]
            assert result.info[k]["outcome"] == "moved"
            # done exactly when the plan runs out, with reward 1 on that turn and 0 before
            assert result.done[k] == (turn + 1 == len(plans[i]))
            assert result.rewards[k] == (1.0 if result.done[k] else 0.0)
            if not result.done[k]:
                logs[i].append(result.observations[k])
                still.append(i)
            else:
                assert result.observations[k] is None and result.info[k]["solved"]
        live = still
        if not live:
            break
    assert not live and total == [1.0] * 24


def test_malformed_and_illegal_actions_are_observations() -> None:
    env = SlidingPuzzleEnvironment()
    meta = one_episode(env, SOLVED_3[:2] + [[7, 0, 8]])
    texts = ["I will go up", "<action>jump</action>", "<action>up</action>", "<action>slide 1 1</action>"]
    result = env.step([reply(t) for t in texts], [meta] * 4)
    assert result.done == [False] * 4 and result.rewards == [0.0] * 4
    assert [i["outcome"] for i in result.info] == ["no_action", "illegal", "illegal", "illegal"]
    assert [m["moves"] for m in result.metadata] == [1, 1, 1, 1]  # every turn counts
    assert all(m["grid"] == ONE_LEFT for m in result.metadata)  # no move made
    no_action, unknown, up, far = (o["content"] for o in result.observations)
    assert (
        "No action found" in no_action
        and "<action>up</action>" in no_action
        and render(ONE_LEFT) in no_action
    )
    assert unknown.startswith("Unknown action 'jump'. No move made. Legal moves now: down, left, right.")
    assert up.startswith("Cannot move up")  # empty square on the bottom row: nothing below it
    assert "not next to the empty square" in far
    assert all(o["role"] == "user" for o in result.observations)
    assert meta["moves"] == 0  # the input metadata is not modified


def test_view_and_redraw_board() -> None:
    grid = [[1, 2, 3], [4, 0, 5], [7, 8, 6]]
    plain, redraw = SlidingPuzzleEnvironment(), SlidingPuzzleEnvironment(redraw_board=True)
    [view] = plain.step([reply("<action>view</action>")], [one_episode(plain, grid)]).observations
    assert view["content"] == "Here is the board.\n\n" + render(grid)
    moved = [[1, 2, 3], [4, 5, 0], [7, 8, 6]]
    [quiet] = plain.step([reply("<action>left</action>")], [one_episode(plain, grid)]).observations
    assert quiet["content"] == "Moved tile 5 left."
    [drawn] = redraw.step([reply("<action>left</action>")], [one_episode(redraw, grid)]).observations
    assert drawn["content"] == "Moved tile 5 left.\n\n" + render(moved)


def test_without_history_every_turn_restarts_from_the_board_alone() -> None:
    from posttrain.environments.sliding_puzzle import instructions

    grid = [[1, 2, 3], [4, 0, 5], [7, 8, 6]]
    moved = [[1, 2, 3], [4, 5, 0], [7, 8, 6]]
    env = SlidingPuzzleEnvironment(history=False, board_format="cells")
    # a move, an illegal move and a malformed reply alike: the next prompt is the first message
    # written for the board the turn left, and it replaces the conversation
    for text, board in (("<action>left</action>", moved), ("<action>slide 1 1</action>", grid), ("up", grid)):
        result = env.step([reply(text)], [one_episode(env, grid)])
        assert result.observations == [{"role": "user", "content": instructions(board, board_format="cells")}]
        assert result.new_context == [True] and result.done == [False]
    [start] = env.reset([{"size": 3, "shuffle_moves": 1, "puzzle_seed": 0}], [0])
    assert start.messages[0]["content"] == instructions(start.metadata["grid"], board_format="cells")
    # the solving move and the last turn end the episode: no observation, no new context
    solved = env.step([reply("<action>left</action>")], [one_episode(env, ONE_LEFT)])
    assert solved.observations == [None] and solved.new_context == [False] and solved.rewards == [1.0]
    last = env.step([reply("<action>view</action>")], [{**one_episode(env, grid, max_moves=2), "moves": 1}])
    assert last.done == [True] and last.new_context == [False]
    # the default keeps the conversation
    kept = SlidingPuzzleEnvironment().step([reply("<action>left</action>")], [one_episode(env, grid)])
    assert kept.new_context == [False]


def test_max_moves_ends_the_episode_and_shaped_reward() -> None:
    flat, shaped = SlidingPuzzleEnvironment(), SlidingPuzzleEnvironment(shaped_reward=0.5)
    last_turn = {**one_episode(flat, ONE_LEFT, max_moves=3), "moves": 2}
    for env, expected in ((flat, 0.0), (shaped, 0.5 * 7 / 8)):
        result = env.step([reply("<action>view</action>")], [last_turn])
        assert result.done == [True] and result.observations == [None]
        assert result.rewards == [expected] and result.info[0]["solved"] is False
    # solving on the last allowed turn still pays 1
    solved = shaped.step([reply("<action>left</action>")], [last_turn])
    assert solved.rewards == [1.0] and solved.done == [True]


def test_batch_metrics() -> None:
    env = SlidingPuzzleEnvironment()
    metas = [
        one_episode(env, ONE_LEFT),
        one_episode(env, ONE_LEFT),
        {**one_episode(env, ONE_LEFT, 2), "moves": 1},
    ]
    result = env.step([reply("<action>left</action>"), reply("nothing"), reply("<action>up</action>")], metas)
    # ended: the solved one (1 move) and the one out of moves (2 moves)
    assert env.batch_metrics(result) == {
        "env/illegal_action_rate": 1 / 3,
        "env/no_action_rate": 1 / 3,
        "env/solved_rate": 0.5,
        "env/moves_per_episode": 1.5,
    }


def test_registered_and_validates_config() -> None:
    assert ENVIRONMENTS["sliding_puzzle"] is SlidingPuzzleEnvironment
    with pytest.raises(ValueError, match="min_size"):
        SlidingPuzzleEnvironment(min_size=1)
    with pytest.raises(ValueError, match="min_size"):
        SlidingPuzzleEnvironment(min_size=4, max_size=3)


# --- relabelled tiles and the goal drawn as a board --------------------------------------------------

REVERSED = [8, 7, 6, 5, 4, 3, 2, 1]  # tile t shown as 9 - t


def test_render_with_labels_shows_each_tile_as_its_label() -> None:
    assert render(ONE_LEFT, REVERSED).splitlines()[2:5] == ["1 | 8 7 6 |", "2 | 5 4 3 |", "3 | 2 _ 1 |"]
    assert render(ONE_LEFT, None) == render(ONE_LEFT)
    with pytest.raises(ValueError, match="permutation of 1..8"):
        check_labels([1, 2, 3, 4, 5, 6, 7, 7], 3)


def test_relabelled_tasks_draw_labels_and_keep_the_board_split() -> None:
    env = SlidingPuzzleEnvironment(
        min_size=3, max_size=3, max_shuffle_moves=5, goal_board=True, relabel_tiles=True
    )
    tasks = env.generate_tasks(50, seed=4, split="train")
    assert tasks == env.generate_tasks(50, seed=4, split="train")
    identity = list(range(1, 9))
    assert all(sorted(t["labels"]) == identity and t["labels"] != identity for t in tasks)
    assert len({tuple(t["labels"]) for t in tasks}) == 50
    assert not any(is_heldout(task_grid(t)) for t in tasks)  # the split is the board's, as without labels


def test_a_relabelled_episode_shows_labels_in_the_goal_the_board_and_the_observations() -> None:
    env = SlidingPuzzleEnvironment(min_size=3, max_size=3, redraw_board=True, goal_board=True)
    task = {"size": 3, "shuffle_moves": 1, "puzzle_seed": 0, "labels": REVERSED}
    [start] = env.reset([task], [0])
    grid = start.metadata["grid"]
    first = start.messages[0]["content"]
    assert "Goal: make the board look like this:\n" + render(SOLVED_3, REVERSED) + "\n\nBoard:\n" in first
    assert "Board:\n" + render(grid, REVERSED) in first and "tiles 1 to 8 in order" not in first
    [move] = solve_bfs(grid)
    illegal = next(d for d in ("up", "down", "left", "right") if d not in legal_directions(grid))
    out = env.step([reply(f"<action>{illegal}</action>", start)], [start.metadata])
    assert out.rewards == [0.0] and out.observations[0]["content"].endswith("\n" + render(grid, REVERSED))
    out = env.step([reply(f"<action>{move}</action>", start)], [start.metadata])
    assert out.rewards == [1.0] and out.done == [True]


def test_a_move_message_names_the_tile_by_its_label() -> None:
    env = SlidingPuzzleEnvironment(min_size=3, max_size=3, goal_board=True)
    task = {"size": 3, "shuffle_moves": 1, "puzzle_seed": 0, "labels": REVERSED}
    [start] = env.reset([task], [0])
    meta = {**start.metadata, "grid": [[1, 2, 3], [4, 5, 6], [0, 7, 8]]}  # tile 7 can slide left
    out = env.step([reply("<action>left</action>", start)], [meta])
    assert out.observations[0]["content"] == "Moved tile 2 left."  # tile 7 is shown as 2
    meta = {**start.metadata, "grid": [[1, 2, 3], [4, 0, 5], [7, 8, 6]]}
    out = env.step([reply("<action>slide 2 3</action>", start)], [meta])
    assert out.observations[0]["content"] == "Slid tile 4 into the empty square."  # 5 is shown as 4


def test_relabelled_oracle_transcripts_solve_their_puzzles() -> None:
    env = SlidingPuzzleEnvironment(
        min_size=3, max_size=3, max_shuffle_moves=7, redraw_board=True, goal_board=True, relabel_tiles=True
    )
    for task in env.generate_tasks(20, seed=2, split="train"):
        messages = oracle_transcript(env, task, hide_heldout=False)
        [start] = env.reset([task], [0])
        meta = start.metadata
        for message in messages[1:]:
            if message["role"] == "assistant":
                out = env.step([[*start.messages, message]], [meta])
                meta = out.metadata[0]
        assert is_solved(meta["grid"])
        boards = [m["content"] for m in messages if m["role"] == "user"]
        assert all(render(SOLVED_3) not in b for b in boards)  # the plain goal is never drawn


@pytest.mark.parametrize(
    ("kwargs", "task", "message"),
    [
        ({"relabel_tiles": True}, None, "relabel_tiles needs goal_board"),
        ({}, {"size": 3, "shuffle_moves": 1, "labels": [2, 1, 3, 4, 5, 6, 7, 8]}, "needs goal_board"),
        ({"goal_board": True}, {"size": 3, "shuffle_moves": 1, "labels": [1, 2, 3]}, "permutation of 1..8"),
    ],
)
def test_relabelling_errors(kwargs, task, message) -> None:
    with pytest.raises(ValueError, match=message):
        SlidingPuzzleEnvironment(**kwargs).reset([task], [0])
