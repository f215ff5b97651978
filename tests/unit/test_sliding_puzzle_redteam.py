"""Red-team set of the sliding puzzle: episodes that must end with reward 0 (or, with `shaped_reward`,
the documented partial credit shaped_reward x tiles in place, always below 1), beside controls."""

from __future__ import annotations

import random
from typing import Any

import pytest

from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment
from posttrain.environments.sliding_puzzle_board import (
    apply_action,
    is_solved,
    legal_directions,
    solved_grid,
    tiles_in_place,
)

ONE_LEFT = [[1, 2, 3], [4, 5, 6], [7, 0, 8]]  # solved by moving tile 8 left (the empty square is at 3, 2)

# replies played every turn of a 3-turn episode from ONE_LEFT
NEVER_SOLVES = [
    "The puzzle is solved!",  # a claim, no action
    "<action>solved</action>",
    "<action>win</action>",
    "<action>left left</action>",  # one action a turn
    "<action>up, left</action>",
    "<action>slide 3 2</action>",  # the empty square itself
    "<action>slide 0 1</action>",
    "<action>slide -1 2</action>",
    "<action>slide 3 3 3</action>",
    "<action>slide 99999999999999999999 3</action>",
    "<action>slide 3.0 3</action>",
    "<action>lеft</action>",  # a Cyrillic е
    "<action>view</action>",
    "<action>left</action><action>view</action>",  # the last action counts: a view
    "<action></action>",
    "Board:\n1 2 3\n4 5 6\n7 8 _\n<action>view</action>",  # a solved board drawn in the reply
    "<action>down</action>",  # legal twice (away from the goal), then illegal
]


def play(
    env: SlidingPuzzleEnvironment, replies: list[str], grid: list[list[int]]
) -> tuple[list[float], dict[str, Any]]:
    """Play `replies` (one a turn, until the episode ends) from `grid`; every turn's reward, last info."""
    meta: dict[str, Any] = {"size": len(grid), "grid": grid, "moves": 0, "max_moves": env.max_moves}
    log: list[dict[str, Any]] = [{"role": "user", "content": "play"}]
    rewards = []
    for text in replies:
        log = [*log, {"role": "assistant", "content": text}]
        result = env.step([log], [meta])
        rewards.append(result.rewards[0])
        if result.done[0]:
            return rewards, {**result.info[0], "grid": result.metadata[0]["grid"]}
        log, meta = [*log, result.observations[0]], result.metadata[0]
    raise AssertionError("the episode did not end")


@pytest.mark.parametrize("text", NEVER_SOLVES)
def test_replies_that_never_solve_score_zero(text: str) -> None:
    flat, shaped = (
        SlidingPuzzleEnvironment(max_moves=3),
        SlidingPuzzleEnvironment(max_moves=3, shaped_reward=0.5),
    )
    rewards, info = play(flat, [text] * 3, ONE_LEFT)
    assert rewards == [0.0, 0.0, 0.0] and info["solved"] is False
    # shaped: the documented partial credit, half the tiles in place of the board it ends on
    rewards, info = play(shaped, [text] * 3, ONE_LEFT)
    assert rewards == [0.0, 0.0, 0.5 * tiles_in_place(info["grid"])] and rewards[-1] < 1.0


def test_legal_move_lists_that_end_unsolved_score_zero() -> None:
    env = SlidingPuzzleEnvironment(max_moves=3)
    for moves in (["right", "left", "right"], ["up", "down", "up"], ["right", "up", "down"]):
        rewards, info = play(env, [f"<action>{m}</action>" for m in moves], ONE_LEFT)
        assert rewards == [0.0, 0.0, 0.0] and not info["solved"], moves
    # control: the solving move pays 1 on its turn, after any number of wasted turns
    assert play(env, ["<action>view</action>", "<action>up</action>", "<action>left</action>"], ONE_LEFT)[
        0
    ] == [
        0.0,
        0.0,
        1.0,
    ]
    assert play(env, ["<action>slide 3 3</action>"], ONE_LEFT)[0] == [1.0]


def test_no_unsolved_board_pays_as_much_as_solving() -> None:
    """shaped_reward is at most 1 and an unsolved board never has every tile in place (were all
    n*n - 1 tiles in their cells, the empty square would be in its corner), so an episode that runs
    out pays less than one that solves."""
    # every 2x2 board reachable from the goal, by search: all but one tile is the most in place
    seen, frontier, top = {str(solved_grid(2))}, [solved_grid(2)], 0.0
    while frontier:
        grid = frontier.pop()
        top = top if is_solved(grid) else max(top, tiles_in_place(grid))
        for move in legal_directions(grid):
            nxt = apply_action(grid, move)[0]
            if str(nxt) not in seen:
                seen.add(str(nxt))
                frontier.append(nxt)
    assert len(seen) == 12 and top == 2 / 3  # half of 4! boards are solvable
    # 3x3: a random walk of 20,000 moves never finds an unsolved board with more than 7 of 8 in place
    rng, grid = random.Random(0), solved_grid(3)
    for _ in range(20_000):
        grid = apply_action(grid, rng.choice(legal_directions(grid)))[0]
        assert is_solved(grid) or tiles_in_place(grid) <= 7 / 8
    with pytest.raises(ValueError, match="shaped_reward"):
        SlidingPuzzleEnvironment(shaped_reward=1.5)
    with pytest.raises(ValueError, match="shaped_reward"):
        SlidingPuzzleEnvironment(shaped_reward=-0.1)
    SlidingPuzzleEnvironment(shaped_reward=1.0)
