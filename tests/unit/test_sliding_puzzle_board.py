"""Sliding puzzle around the game: distances from solved, the held-out split (mirror pairs, disjoint
pools as the recipes draw them), the blind baseline (hand-worked sets, and the enumeration against
every sequence played through the environment's own `step`), and the first-move metric."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from posttrain.config import ALGORITHM_CONFIGS, load_config
from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment
from posttrain.environments.sliding_puzzle_board import (
    DIRECTIONS,
    SPLITS,
    BlindBaseline,
    best_blind_sequence,
    blind_actions,
    blind_solved_rate,
    board_key,
    boards_near_goal,
    is_heldout,
    mirror,
    move_is_optimal,
    play_blind,
    shuffled_grid,
    solution_length,
    solve_bfs,
    solved_grid,
    task_grid,
)

CONFIGS = Path(__file__).parents[2] / "examples" / "configs"
SOLVED_3 = [[1, 2, 3], [4, 5, 6], [7, 8, 0]]
ONE_UP = [[1, 2, 3], [4, 5, 0], [7, 8, 6]]  # solved by `up` (tile 6 below the empty square)
ONE_LEFT = [[1, 2, 3], [4, 5, 6], [7, 0, 8]]  # solved by `left` (tile 8 right of the empty square)
# 2x2, three moves from solved, mirrors of each other; each has one shortest solution
A3 = [[3, 1], [0, 2]]  # down, left, up
B3 = [[2, 0], [1, 3]]  # right, up, left


# --- distances -----------------------------------------------------------------------------------


def test_boards_near_goal_count_the_known_layers() -> None:
    # the 8-puzzle from its corner goal: 1, 2, 4, 8, 16, 20, 39, 62, 116 boards at distance 0..8
    layers = Counter(d for d in boards_near_goal(3, 8).values() if d <= 8)
    assert [layers[d] for d in range(9)] == [1, 2, 4, 8, 16, 20, 39, 62, 116]
    # the 2x2 board: its 12 solvable positions form one cycle around the goal
    assert sorted(Counter(boards_near_goal(2, 6).values()).items()) == [
        (0, 1), (1, 2), (2, 2), (3, 2), (4, 2), (5, 2), (6, 1)
    ]  # fmt: skip


def test_solution_length_is_the_bfs_length() -> None:
    assert solution_length(SOLVED_3, 0) == 0
    assert solution_length(ONE_LEFT, 1) == 1 and solution_length(ONE_LEFT, 5) == 1
    assert solution_length(A3, 3) == 3 and solution_length(A3, 2) is None  # beyond the limit
    for seed in range(40):
        grid = shuffled_grid(3, 9, seed)
        assert solution_length(grid, 9) == len(solve_bfs(grid))


def test_move_is_optimal() -> None:
    assert move_is_optimal(ONE_LEFT, SOLVED_3, 1) is True
    assert move_is_optimal(ONE_LEFT, ONE_LEFT, 1) is False  # an illegal move, no move made
    assert move_is_optimal(ONE_LEFT, [[1, 2, 3], [4, 5, 6], [0, 7, 8]], 1) is False  # away from solved
    assert move_is_optimal(A3, [[0, 1], [3, 2]], 3) is True  # down: 3 -> 2 moves from solved
    assert move_is_optimal(A3, [[0, 1], [3, 2]], 2) is None  # A3 is further than the limit


# --- the held-out split --------------------------------------------------------------------------


def test_mirror() -> None:
    assert mirror(SOLVED_3) == SOLVED_3 and mirror(solved_grid(4)) == solved_grid(4)
    assert mirror(ONE_UP) == ONE_LEFT and mirror(ONE_LEFT) == ONE_UP
    assert mirror(A3) == B3
    # reflected, tiles renamed (2 <-> 4, 3 <-> 7, 6 <-> 8): solved by `left, up`, its mirror by `up, left`
    assert mirror([[1, 2, 3], [4, 0, 5], [7, 8, 6]]) == [[1, 2, 3], [4, 0, 6], [7, 5, 8]]
    assert solve_bfs([[1, 2, 3], [4, 0, 6], [7, 5, 8]]) == ["up", "left"]
    for seed in range(30):
        grid = shuffled_grid(3, 11, seed)
        assert mirror(mirror(grid)) == grid
        assert solution_length(mirror(grid), 11) == solution_length(grid, 11)


def test_a_board_and_its_mirror_are_in_different_pools() -> None:
    assert is_heldout(ONE_UP) != is_heldout(ONE_LEFT)
    assert is_heldout(A3) != is_heldout(B3)
    for size, radius in ((2, 6), (3, 9)):
        boards = boards_near_goal(size, radius)
        odd = [k for k, d in boards.items() if d % 2 == 1 and d <= radius]
        for key in odd:
            grid = [list(key[r * size : (r + 1) * size]) for r in range(size)]
            assert mirror(grid) != grid and is_heldout(grid) != is_heldout(mirror(grid))
        # so each pool holds half the boards at every (odd) distance
        for d in range(1, radius + 1, 2):
            layer = [k for k in odd if boards[k] == d]
            held = sum(is_heldout([list(k[r * size : (r + 1) * size]) for r in range(size)]) for k in layer)
            assert 2 * held == len(layer)


def boards_of(tasks: list[dict]) -> set[tuple[int, ...]]:
    return {board_key(task_grid(t)) for t in tasks}


def recipe_pools(name: str) -> tuple[SlidingPuzzleEnvironment, list[dict], list[dict]]:
    """The environment and the training and validation tasks of a GRPO recipe, as the run draws them."""
    cfg = load_config(ALGORITHM_CONFIGS["grpo"], CONFIGS / name)
    env = SlidingPuzzleEnvironment(**cfg.environment.kwargs)
    train, val = cfg.data.train.environment_tasks, cfg.data.validation.environment_tasks
    return (
        env,
        env.generate_tasks(train.size, train.seed, train.split),
        env.generate_tasks(val.size, val.seed, val.split),
    )


def test_the_3x3_recipe_trains_and_validates_on_disjoint_boards() -> None:
    env, train, val = recipe_pools("grpo_sliding_puzzle_3x3.yaml")
    assert len(train) == 5000 and len(val) == 128
    assert {t["split"] for t in train} == {"train"} and {t["split"] for t in val} == {"heldout"}
    assert not boards_of(train) & boards_of(val)
    # both pools hold boards at 1, 3 and 5 moves from solved
    for tasks in (train, val):
        assert {solution_length(task_grid(t), 5) for t in tasks} == {1, 3, 5}
    # the eval recipe's held-out set (and its 2x2 variant) shares no board with training either
    cfg = load_config(ALGORITHM_CONFIGS["eval"], CONFIGS / "eval_sliding_puzzle_3x3.yaml")
    spec = cfg.data.dataset.environment_tasks
    evaluated = SlidingPuzzleEnvironment(**cfg.environment.kwargs).generate_tasks(
        spec.size, spec.seed, spec.split
    )
    assert not boards_of(train) & boards_of(evaluated)
    two = SlidingPuzzleEnvironment(
        **{**cfg.environment.kwargs, "min_size": 2, "max_size": 2, "min_solution_moves": 3}
    )
    two_heldout = two.generate_tasks(spec.size, spec.seed, spec.split)
    assert {solution_length(task_grid(t), 5) for t in two_heldout} == {3, 5}
    two_train = SlidingPuzzleEnvironment(min_size=2, max_size=2, max_shuffle_moves=15).generate_tasks(
        2000, 7, "train"
    )
    assert not boards_of(two_train) & boards_of(two_heldout)


def test_the_eval_recipe_plays_the_grpo_recipe_s_environment() -> None:
    grpo = load_config(ALGORITHM_CONFIGS["grpo"], CONFIGS / "grpo_sliding_puzzle_3x3.yaml")
    evaluation = load_config(ALGORITHM_CONFIGS["eval"], CONFIGS / "eval_sliding_puzzle_3x3.yaml")
    assert evaluation.environment.kwargs == grpo.environment.kwargs
    assert evaluation.environment.max_turns == grpo.environment.max_turns
    assert evaluation.data.dataset.environment_tasks == grpo.data.validation.environment_tasks.model_copy(
        update={"size": 256}
    )


def test_split_tasks_and_the_default_draws() -> None:
    env = SlidingPuzzleEnvironment(min_size=2, max_size=3, max_shuffle_moves=9)
    for split in SPLITS:
        tasks = env.generate_tasks(50, seed=3, split=split)
        assert tasks == env.generate_tasks(50, seed=3, split=split)
        assert all(t["split"] == split and is_heldout(task_grid(t)) == (split == "heldout") for t in tasks)
    # without a split: the draws of before (the same random calls, in the same order)
    import random

    rng = random.Random(3)
    expected = []
    for _ in range(50):
        size, shuffle = rng.randint(2, 3), rng.randint(1, 9)
        expected.append(
            {"size": size, "shuffle_moves": shuffle + 1 - shuffle % 2, "puzzle_seed": rng.randrange(2**31)}
        )
    assert env.generate_tasks(50, seed=3) == expected
    with pytest.raises(ValueError, match="unknown sliding puzzle split"):
        env.generate_tasks(5, seed=0, split="test")


def test_min_solution_moves() -> None:
    env = SlidingPuzzleEnvironment(min_size=3, max_size=3, max_shuffle_moves=5, min_solution_moves=3)
    tasks = env.generate_tasks(100, seed=0)
    assert {solution_length(task_grid(t), 5) for t in tasks} == {3, 5}
    with pytest.raises(ValueError, match="min_solution_moves must be in 1..5"):
        SlidingPuzzleEnvironment(max_shuffle_moves=4, min_solution_moves=6)


def test_a_pool_that_no_draw_reaches_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import posttrain.environments.sliding_puzzle as sp

    monkeypatch.setattr(sp, "is_heldout", lambda grid: True)
    monkeypatch.setattr(sp, "MAX_DRAWS_PER_TASK", 3)
    with pytest.raises(ValueError, match="6 draws gave only 0 of 2 boards of split 'train'"):
        SlidingPuzzleEnvironment().generate_tasks(2, seed=0, split="train")


# --- the blind baseline --------------------------------------------------------------------------


def test_blind_actions_and_the_illegal_move_rule() -> None:
    assert blind_actions(2) == [
        "up",
        "down",
        "left",
        "right",
        "slide 1 1",
        "slide 1 2",
        "slide 2 1",
        "slide 2 2",
    ]
    assert play_blind(ONE_LEFT, "left") == SOLVED_3
    assert play_blind(ONE_LEFT, "up") == ONE_LEFT  # nothing below the empty square: no move
    assert play_blind(ONE_LEFT, "slide 1 1") == ONE_LEFT  # not next to the empty square
    assert play_blind(A3, "slide 3 3") == A3  # off a 2x2 board


def test_a_board_one_move_away() -> None:
    assert best_blind_sequence([ONE_LEFT], 1) == BlindBaseline(("left",), 1, 1)
    assert best_blind_sequence([ONE_LEFT], 0) == BlindBaseline((), 0, 1)
    assert best_blind_sequence([ONE_LEFT], 5).actions == ("left",)  # the shortest of the best


def test_two_boards_one_move_away() -> None:
    boards = [ONE_UP, ONE_UP, ONE_LEFT]
    # one direction solves one of the two boards; `up` solves two of the three (ties go to `up`, first)
    assert best_blind_sequence(boards, 1, list(DIRECTIONS)) == BlindBaseline(("up",), 2, 3)
    # two: `up` is illegal on ONE_LEFT (the empty square is on the bottom row), costs the turn and
    # changes nothing, then `left` solves it
    assert best_blind_sequence(boards, 2, list(DIRECTIONS)) == BlindBaseline(("up", "left"), 3, 3)
    # `slide 3 3` moves tile 6 up on ONE_UP and tile 8 left on ONE_LEFT: one move solves both
    assert best_blind_sequence(boards, 1) == BlindBaseline(("slide 3 3",), 3, 3)


def test_no_sequence_solves_a_board_and_its_mirror_in_three_moves() -> None:
    # a sequence of 3 moves solves a board 3 moves away only as its (unique) shortest solution, and
    # A3's (down, left, up) is not B3's (right, up, left): one of the two
    result = best_blind_sequence([A3, B3], 3)
    assert (result.solved, result.boards, result.solved_rate) == (1, 2, 0.5)
    assert result.actions in {("down", "left", "up"), ("right", "up", "left")}
    # seven: down, left, up solves A3; on B3 `down` and `left` are illegal (no tile above or right of
    # its empty square), `up` moves tile 3 up (4 moves away), and down, right, up, left solve it
    seven = best_blind_sequence([A3, B3], 7)
    assert seven.solved == 2
    assert all(
        plays_to_solved(grid, ("down", "left", "up", "down", "right", "up", "left")) for grid in (A3, B3)
    )


def test_a_blind_turn_is_the_environment_s_turn() -> None:
    """`play_blind`, which the enumeration plays, makes the move `step` makes, for every move a blind
    policy can write on every 2x2 board and every 3x3 board within 2 moves of solved."""
    boards = [*boards_near_goal(2, 6), *(k for k, d in boards_near_goal(3, 2).items() if d <= 2)]
    for key in boards:
        size = int(len(key) ** 0.5)
        grid = [list(key[r * size : (r + 1) * size]) for r in range(size)]
        env = SlidingPuzzleEnvironment(max_moves=5)
        meta = {"size": size, "grid": grid, "moves": 0, "max_moves": 5}
        for action in [*blind_actions(3), "view", "jump"]:
            log = [
                {"role": "user", "content": "play"},
                {"role": "assistant", "content": f"<action>{action}</action>"},
            ]
            stepped = env.step([log], [meta]).metadata[0]["grid"]
            assert play_blind(grid, action) == stepped, (grid, action)


def plays_to_solved(grid: list[list[int]], actions: Sequence[str]) -> bool:
    """Whether `actions`, played one a turn through the environment's `step`, solve `grid`."""
    env = SlidingPuzzleEnvironment(max_moves=max(len(actions), 1))
    meta = {"size": len(grid), "grid": grid, "moves": 0, "max_moves": env.max_moves}
    log: list[dict] = [{"role": "user", "content": "play"}]
    for action in actions:
        log = [*log, {"role": "assistant", "content": f"<action>{action}</action>"}]
        result = env.step([log], [meta])
        if result.done[0]:
            return bool(result.info[0]["solved"])
        log, meta = [*log, result.observations[0]], result.metadata[0]
    return False


def solves(grid: list[list[int]], actions: Sequence[str]) -> bool:
    """`plays_to_solved` by `play_blind` (the same turns, tested above), fast enough for brute force."""
    for action in actions:
        grid = play_blind(grid, action)
        if grid == solved_grid(len(grid)):
            return True
    return False


@pytest.mark.parametrize(("size", "shuffle", "budget"), [(2, 7, 4), (3, 5, 3)])
def test_the_enumeration_finds_the_best_of_every_sequence(size: int, shuffle: int, budget: int) -> None:
    grids = [shuffled_grid(size, 1 + 2 * (seed % (shuffle // 2 + 1)), seed) for seed in range(8)]
    scores = {
        sequence: sum(solves(g, sequence) for g in grids)
        for sequence in itertools.product(blind_actions(size), repeat=budget)
    }
    best = max(scores.values())
    found = best_blind_sequence(grids, budget)
    assert found.solved == best and found.boards == 8
    assert 0 < best < 8  # a set no sequence solves whole, and the test has something to find
    # the sequence it names scores that, through the environment itself
    assert sum(plays_to_solved(g, found.actions) for g in grids) == best


def test_blind_solved_rate_per_budget_and_errors() -> None:
    # within 3 moves one of A3 and B3; within 1 move both ONE_UP and ONE_LEFT (`slide 3 3`)
    assert blind_solved_rate([A3, ONE_UP, B3, ONE_LEFT], [3, 1, 3, 1]) == 3 / 4
    with pytest.raises(ValueError, match="no boards"):
        best_blind_sequence([], 3)


def test_too_many_boards_to_list(monkeypatch: pytest.MonkeyPatch) -> None:
    import posttrain.environments.sliding_puzzle_board as sp

    monkeypatch.setattr(sp, "MAX_LISTED_BOARDS", 50)
    monkeypatch.setattr(sp, "_NEAR_GOAL", {})
    monkeypatch.setattr(sp, "_TOO_FAR", {})
    assert len(boards_near_goal(3, 4)) == 31  # 1 + 2 + 4 + 8 + 16
    with pytest.raises(ValueError, match="more than 50 boards of size 3 lie within 5 moves"):
        boards_near_goal(3, 6)
    with pytest.raises(ValueError, match="within 7 moves"):  # known too many: not listed again
        boards_near_goal(3, 7)
    assert move_is_optimal(ONE_LEFT, SOLVED_3, 6) is None  # the metric is left unknown
    with pytest.raises(ValueError, match="more than 50 boards"):
        best_blind_sequence([ONE_LEFT], 6)
