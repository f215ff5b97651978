"""The sliding puzzle's board (`sliding_puzzle`): the game as pure functions on a grid (a list of
rows, 0 = the empty square), the held-out pool of boards, distances from solved, the blind baseline
and the oracle's moves; the environment, the prompt and the oracle transcripts are in
`sliding_puzzle`.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Grid = list[list[int]]
"""A board: `grid[r][c]` is the tile at row r, column c (0-based); 0 is the empty square."""

DIRECTIONS: dict[str, tuple[int, int]] = {"up": (1, 0), "down": (-1, 0), "left": (0, 1), "right": (0, -1)}
"""Direction -> offset from the empty square to the tile that moves (`up`: the tile below moves up)."""


class IllegalMove(ValueError):
    """An action that does not apply to the board; its message is shown to the model."""


def solved_grid(size: int) -> Grid:
    """The goal: tiles 1..size²-1 in reading order, the empty square (0) bottom right."""
    return [[(r * size + c + 1) % (size * size) for c in range(size)] for r in range(size)]


def empty_square(grid: Grid) -> tuple[int, int]:
    """(row, col) of the empty square."""
    for r, row in enumerate(grid):
        if 0 in row:
            return r, row.index(0)
    raise ValueError("the grid has no empty square (0)")


def is_solved(grid: Grid) -> bool:
    """Whether the grid is the goal."""
    return grid == solved_grid(len(grid))


def tiles_in_place(grid: Grid) -> float:
    """Fraction of the tiles 1..n²-1 that are in their goal cell (the empty square not counted)."""
    size = len(grid)
    goal = solved_grid(size)
    hits = sum(grid[r][c] == goal[r][c] != 0 for r in range(size) for c in range(size))
    return hits / (size * size - 1)


def legal_directions(grid: Grid) -> list[str]:
    """The directions that move a tile, in the order up, down, left, right."""
    size = len(grid)
    er, ec = empty_square(grid)
    return [d for d, (dr, dc) in DIRECTIONS.items() if 0 <= er + dr < size and 0 <= ec + dc < size]


def _swap_into_empty(grid: Grid, r: int, c: int) -> Grid:
    """A copy of `grid` with the tile at (r, c) moved into the empty square."""
    er, ec = empty_square(grid)
    new = [row[:] for row in grid]
    new[er][ec], new[r][c] = new[r][c], 0
    return new


def apply_action(grid: Grid, action: str) -> tuple[Grid, str]:
    """Apply a move (`up/down/left/right` or `slide r c`) and return the new grid and what happened.

    Raises `IllegalMove` (with a message for the model) for an unknown action or one that does not
    apply to this board. `view` is not a move and is handled by the caller.
    """
    size = len(grid)
    er, ec = empty_square(grid)
    words = action.strip().lower().split()
    if len(words) == 1 and words[0] in DIRECTIONS:
        dr, dc = DIRECTIONS[words[0]]
        r, c = er + dr, ec + dc
        if not (0 <= r < size and 0 <= c < size):
            raise IllegalMove(f"Cannot move {words[0]}: no tile can slide {words[0]} into the empty square.")
        return _swap_into_empty(grid, r, c), f"Moved tile {grid[r][c]} {words[0]}."
    if words and words[0] == "slide":
        if len(words) != 3 or not all(re.fullmatch(r"\d+", w) for w in words[1:]):
            raise IllegalMove("Use 'slide row col' with two numbers, e.g. 'slide 1 2'.")
        r, c = int(words[1]) - 1, int(words[2]) - 1
        if not (0 <= r < size and 0 <= c < size):
            raise IllegalMove(f"No cell ({r + 1}, {c + 1}): rows and columns go from 1 to {size}.")
        if abs(r - er) + abs(c - ec) != 1:
            raise IllegalMove(
                f"The tile at ({r + 1}, {c + 1}) is not next to the empty square at ({er + 1}, {ec + 1})."
            )
        return _swap_into_empty(grid, r, c), f"Slid tile {grid[r][c]} into the empty square."
    raise IllegalMove(f"Unknown action {action.strip()!r}.")


def render(grid: Grid, labels: Sequence[int] | None = None) -> str:
    """The board as text: 1-based row and column labels, `_` for the empty square; tile t shown as
    `labels[t - 1]` when `labels` is given (a relabelled board, see `check_labels`).

    A 2×2 board [[1, 0], [3, 2]] renders as (one line per row, no trailing spaces)::

            1 2
          +-----+
        1 | 1 _ |
        2 | 3 2 |
          +-----+
    """
    size = len(grid)
    width = len(str(size * size - 1))

    label_width = len(str(size))
    pad = " " * label_width
    border = f"{pad} +{'-' * ((width + 1) * size + 1)}+"
    header = f"{pad}   " + " ".join(str(c + 1).rjust(width) for c in range(size))
    rows = [
        f"{str(r + 1).rjust(label_width)} | " + " ".join(_shown(v, labels).rjust(width) for v in row) + " |"
        for r, row in enumerate(grid)
    ]
    return "\n".join([header, border, *rows, border])


BOARD_FORMATS = ("grid", "cells")
"""How a board is written: "grid" (`render`: rows drawn in a frame) or "cells" (`render_cells`: one
labelled line per cell)."""


def render_cells(grid: Grid, labels: Sequence[int] | None = None) -> str:
    """The board as one line per cell in reading order, `row r, column c: tile` (1-based), `_` for the
    empty square; tile t shown as `labels[t - 1]` when `labels` is given. Reading a cell is then a
    lookup of its written coordinates, not a count of positions along a drawn row.
    A 2×2 board [[1, 0], [3, 2]] renders as::

        row 1, column 1: 1
        row 1, column 2: _
        row 2, column 1: 3
        row 2, column 2: 2
    """
    return "\n".join(
        f"row {r + 1}, column {c + 1}: {_shown(value, labels)}"
        for r, row in enumerate(grid)
        for c, value in enumerate(row)
    )


def _shown(value: int, labels: Sequence[int] | None) -> str:
    """A cell's text: `_` for the empty square, else the tile (or its label)."""
    if not value:
        return "_"
    return str(value if labels is None else labels[value - 1])


def render_board(grid: Grid, labels: Sequence[int] | None = None, board_format: str = "grid") -> str:
    """The board in `board_format` (one of `BOARD_FORMATS`)."""
    if board_format == "grid":
        return render(grid, labels)
    if board_format == "cells":
        return render_cells(grid, labels)
    raise ValueError(f"unknown board_format {board_format!r}; use one of {BOARD_FORMATS}")


def check_labels(labels: Sequence[int], size: int) -> list[int]:
    """`labels` as a list when it is a permutation of 1..size²-1 (tile t is shown as labels[t - 1]),
    else ValueError. The board's state stays tiles 1..size²-1 (its rules and solver are unchanged);
    only what the player sees is relabelled, the goal included."""
    labels = [int(x) for x in labels]
    if sorted(labels) != list(range(1, size * size)):
        raise ValueError(f"tile labels must be a permutation of 1..{size * size - 1}, got {labels}")
    return labels


def random_labels(size: int, rng: random.Random) -> list[int]:
    """A random relabelling of the tiles of a size×size board that is not the identity."""
    identity = list(range(1, size * size))
    while True:
        labels = rng.sample(identity, len(identity))
        if labels != identity:
            return labels


def shuffled_grid(size: int, shuffle_moves: int, seed: int) -> Grid:
    """The goal shuffled by `shuffle_moves` random legal moves (a random walk of the empty square).

    Deterministic in `seed`. An odd `shuffle_moves` never gives the goal back.
    """
    if size < 2:
        raise ValueError(f"a sliding puzzle needs size >= 2, got {size}")
    rng = random.Random(seed)
    grid = solved_grid(size)
    for _ in range(shuffle_moves):
        grid, _ = apply_action(grid, rng.choice(legal_directions(grid)))
    return grid


def solve_bfs(grid: Grid, max_states: int = 2_000_000) -> list[str] | None:
    """A shortest solution (a list of directions) by breadth-first search; None if none is found
    within `max_states` visited states. For tests and oracle policies on small boards."""
    start = tuple(map(tuple, grid))
    goal = tuple(map(tuple, solved_grid(len(grid))))
    parents: dict[tuple, tuple[tuple, str] | None] = {start: None}
    queue = deque([start])
    while queue and len(parents) <= max_states:
        state = queue.popleft()
        if state == goal:
            path: list[str] = []
            while parents[state] is not None:
                state, move = parents[state]
                path.append(move)
            return path[::-1]
        board = [list(row) for row in state]
        for move in legal_directions(board):
            nxt = tuple(map(tuple, apply_action(board, move)[0]))
            if nxt not in parents:
                parents[nxt] = (state, move)
                queue.append(nxt)
    return None


# --- held-out boards ---------------------------------------------------------------------------------

SPLITS = ("train", "heldout")
"""The two disjoint pools of boards `generate_tasks(..., split=)` draws from (see `is_heldout`)."""


def board_key(grid: Grid) -> tuple[int, ...]:
    """The board as one hashable tuple, in reading order."""
    return tuple(v for row in grid for v in row)


def mirror(grid: Grid) -> Grid:
    """The board reflected in its main diagonal, tiles renamed so that the goal is its own mirror: the
    tile whose goal cell is (r, c) becomes the tile whose goal cell is (c, r). A move `up` on a board
    is `left` on its mirror (and `down` is `right`), so both are the same number of moves from solved.
    """
    size = len(grid)

    def rename(tile: int) -> int:
        r, c = divmod(tile - 1, size)
        return c * size + r + 1 if tile else 0

    return [[rename(grid[c][r]) for c in range(size)] for r in range(size)]


def _digest(grid: Grid) -> bytes:
    return hashlib.sha256(repr(board_key(grid)).encode()).digest()


def is_heldout(grid: Grid) -> bool:
    """Whether a board belongs to the held-out pool (else to the training pool).

    A board and its `mirror` go to different pools: the one with the smaller SHA-256 of `board_key` is
    held out. Mirroring keeps the distance from solved, so each pool holds exactly half of the boards
    at every distance, and a random shuffle is as likely to give a board as its mirror. A board that
    is its own mirror (its empty square on the diagonal: never after an odd shuffle, which leaves the
    empty square an odd number of steps from its corner) is held out when its hash's first byte is
    even. A fixed rule: the same board is in the same pool in every run, recipe and board size mix.
    """
    other = mirror(grid)
    if other == grid:
        return _digest(grid)[0] % 2 == 0
    return _digest(grid) < _digest(other)


def hidden_from_training(grid: Grid, within: int | None = None) -> bool:
    """Whether a training transcript must not show `grid`: every held-out board (`is_heldout`), or with
    `within` only the held-out boards within that many moves of solved. A held-out evaluation of boards
    shuffled by at most k moves, played for at most m moves, can only show boards within k + m moves
    of solved: with `within >= k + m` no board of it is hidden less than with `within=None`."""
    if not is_heldout(grid):
        return False
    if within is None:
        return True
    distance = boards_near_goal(len(grid), within).get(board_key(grid))
    return distance is not None and distance <= within


# --- distances from solved -------------------------------------------------------------------------

MAX_LISTED_BOARDS = 500_000
"""The most boards `solution_length` lists around one goal (a 3×3 board has 181,440 in all; a 4×4
board about 240,000 within 16 moves)."""

_NEAR_GOAL: dict[int, tuple[int, dict[tuple[int, ...], int]]] = {}
"""Per board size: (radius, every board within radius moves of solved -> its distance)."""
_TOO_FAR: dict[int, int] = {}
"""Per board size: a radius within which more than `MAX_LISTED_BOARDS` boards lie (not listed again)."""


def _flat_neighbours(size: int) -> list[list[int]]:
    """Per cell index (reading order), the indices of the cells next to it."""
    cells = [divmod(i, size) for i in range(size * size)]
    return [
        [
            (r + dr) * size + c + dc
            for dr, dc in DIRECTIONS.values()
            if 0 <= r + dr < size and 0 <= c + dc < size
        ]
        for r, c in cells
    ]


def boards_near_goal(size: int, radius: int) -> dict[tuple[int, ...], int]:
    """Every board within `radius` moves of solved (as `board_key`) -> its distance, by breadth-first
    search from the goal; cached per size (a larger radius asked before is reused: boards beyond
    `radius` may then be in the answer too). ValueError past `MAX_LISTED_BOARDS` boards."""
    known = _NEAR_GOAL.get(size)
    if known is not None and known[0] >= radius:
        return known[1]
    if radius >= _TOO_FAR.get(size, radius + 1):
        raise ValueError(
            f"more than {MAX_LISTED_BOARDS} boards of size {size} lie within {radius} moves of solved"
        )
    neighbours = _flat_neighbours(size)
    goal = board_key(solved_grid(size))
    distance = {goal: 0}
    frontier = [goal]
    for d in range(1, radius + 1):
        nxt = []
        for key in frontier:
            empty = key.index(0)
            for cell in neighbours[empty]:
                moved = list(key)
                moved[empty], moved[cell] = moved[cell], 0
                new = tuple(moved)
                if new not in distance:
                    distance[new] = d
                    nxt.append(new)
        if len(distance) > MAX_LISTED_BOARDS:
            _TOO_FAR[size] = d
            raise ValueError(
                f"more than {MAX_LISTED_BOARDS} boards of size {size} lie within {d} moves of solved"
            )
        frontier = nxt
    _NEAR_GOAL[size] = (radius, distance)
    return distance


def solution_length(grid: Grid, limit: int) -> int | None:
    """The number of moves of a shortest solution, or None when it is more than `limit` (the length
    of a shuffle bounds it: a board shuffled by k moves is at most k moves from solved)."""
    distance = boards_near_goal(len(grid), limit).get(board_key(grid))
    return distance if distance is not None and distance <= limit else None


def move_is_optimal(before: Grid, after: Grid, limit: int) -> bool | None:
    """Whether going from `before` to `after` (one turn) lies on a shortest solution: the distance
    from solved drops by one. None when `before` is more than `limit` moves from solved, or when the
    boards within `limit` moves are too many to list (`MAX_LISTED_BOARDS`)."""
    try:
        start = solution_length(before, limit)
    except ValueError:
        return None
    if start is None:
        return None
    return start > 0 and solution_length(after, start - 1) == start - 1


# --- the blind baseline -----------------------------------------------------------------------------


def blind_actions(size: int) -> list[str]:
    """Every move a policy that ignores the board can write on boards up to `size`: the four directions
    and `slide r c` for every cell. (`view`, malformed and unknown actions change no board: a sequence
    with one solves no board that the same sequence without it, one turn earlier, does not.)"""
    cells = [f"slide {r + 1} {c + 1}" for r in range(size) for c in range(size)]
    return [*DIRECTIONS, *cells]


def play_blind(grid: Grid, action: str) -> Grid:
    """The board after one turn of a fixed sequence, by the environment's rule: an illegal move (a
    direction with no tile to slide, a `slide` of a cell not next to the empty square or off the
    board) makes no move and still uses the turn."""
    try:
        return apply_action(grid, action)[0]
    except IllegalMove:
        return grid


@dataclass(frozen=True)
class BlindBaseline:
    """The best fixed action sequence for a set of boards and how many of them it solves.

    actions: the sequence (at most the move budget long, the shortest of the best: it ends with the
        move that solves its last board; a sequence that solves nothing is empty).
    solved, boards: boards solved within the budget (the episode ends when solved), of all boards.
    """

    actions: tuple[str, ...]
    solved: int
    boards: int

    @property
    def solved_rate(self) -> float:
        return self.solved / self.boards if self.boards else 0.0


State = tuple[tuple[int, int], ...]
"""The boards still in play under a fixed sequence: sorted (board index, how many boards) pairs."""


class _BlindSearch:
    """Depth-first enumeration of fixed sequences over the boards within the budget of solved.

    Exact, with two savings that never drop a better sequence: (1) a board further from solved than
    the turns left can no longer be solved and leaves the state, and prefixes that leave the same
    boards in play after the same number of turns share one search (memoised), which also merges the
    moves that act alike on every board (a move undoing the previous one is not skipped: on a board
    where the previous move was illegal it is a different move); (2) once a sequence solves every
    board still in play, no other move is tried from there.
    """

    def __init__(self, grids: Sequence[Grid], max_moves: int, actions: Sequence[str]) -> None:
        self.actions = list(actions)
        self.boards: list[Grid] = []
        self.distance: list[int] = []
        self.index: dict[tuple[int, tuple[int, ...]], int] = {}
        for size in sorted({len(g) for g in grids}):
            for key, d in boards_near_goal(size, max_moves).items():
                if d <= max_moves:
                    self.index[(size, key)] = len(self.boards)
                    self.boards.append([list(key[r * size : (r + 1) * size]) for r in range(size)])
                    self.distance.append(d)
        self.after = [[self._after(board, a) for a in self.actions] for board in self.boards]
        self.memo: dict[tuple[int, State], tuple[int, tuple[int, ...]]] = {}

    def _after(self, board: Grid, action: str) -> int:
        """Index of the board after `action`, or -1 when it is more than the budget from solved."""
        return self.index.get((len(board), board_key(play_blind(board, action))), -1)

    def start(self, grids: Sequence[Grid], max_moves: int) -> State:
        live = Counter(self.index.get((len(g), board_key(g)), -1) for g in grids)
        return tuple(sorted((i, n) for i, n in live.items() if i >= 0 and self.distance[i] <= max_moves))

    def turn(self, state: State, action: int, left: int) -> tuple[int, State]:
        """Boards solved by one move of every board in `state`, and those still solvable in `left` turns."""
        solved, live = 0, Counter()
        for i, n in state:
            j = self.after[i][action]
            if j >= 0 and self.distance[j] == 0:
                solved += n
            elif j >= 0 and self.distance[j] <= left:
                live[j] += n
        return solved, tuple(sorted(live.items()))

    def best(self, state: State, left: int) -> tuple[int, tuple[int, ...]]:
        """(boards solved, action indices) of the best sequence of at most `left` moves from `state`
        (the first in the order of the actions among the best)."""
        if left == 0 or not state:
            return 0, ()
        if (left, state) in self.memo:
            return self.memo[(left, state)]
        everything = sum(n for _, n in state)
        found: tuple[int, tuple[int, ...]] = (0, ())
        tried = set()
        for action in range(len(self.actions)):
            solved, rest = self.turn(state, action, left - 1)
            if (solved, rest) in tried:
                continue
            tried.add((solved, rest))
            more, sequence = self.best(rest, left - 1)
            if solved + more > found[0]:
                found = (solved + more, (action, *sequence))
                if found[0] == everything:
                    break
        self.memo[(left, state)] = found
        return found


def best_blind_sequence(
    grids: Sequence[Grid], max_moves: int, actions: Sequence[str] | None = None
) -> BlindBaseline:
    """The fixed action sequence of at most `max_moves` moves (the episode's budget) that solves the most
    of `grids`, played by the environment's rules (`play_blind`; a board counts as solved on the turn
    it is solved, when its episode ends), each move one of `actions` (default `blind_actions` of the
    largest board: every direction and every `slide r c`; the directions alone, `list(DIRECTIONS)`,
    give the best sequence of directions).

    What a policy that never reads the board can score on these boards; exact. Ties go to the shorter
    sequence, then to the one that comes first in the order of `actions`. Boards may mix sizes (a
    `slide` off a smaller board is illegal there). ValueError when more than `MAX_LISTED_BOARDS`
    boards lie within `max_moves` of solved.
    """
    if not grids:
        raise ValueError("no boards")
    if max_moves < 0:
        raise ValueError(f"max_moves must be >= 0, got {max_moves}")
    search = _BlindSearch(grids, max_moves, actions or blind_actions(max(len(g) for g in grids)))
    most = search.best(search.start(grids, max_moves), max_moves)[0]
    for budget in range(max_moves + 1):  # the shortest budget that does as well (the memo is shared)
        solved, sequence = search.best(search.start(grids, budget), budget)
        if solved == most:
            return BlindBaseline(tuple(search.actions[a] for a in sequence), solved, len(grids))
    raise AssertionError("unreachable: the full budget reaches its own best")


def task_grid(task: dict[str, Any], seed: int = 0) -> Grid:
    """The board a task starts from, as `SlidingPuzzleEnvironment.reset` makes it (`seed` stands in
    for the episode's seed when the task has no "puzzle_seed")."""
    return shuffled_grid(int(task["size"]), int(task["shuffle_moves"]), int(task.get("puzzle_seed", seed)))


def blind_solved_rate(grids: Sequence[Grid], max_moves: Sequence[int]) -> float:
    """The share of `grids` that the best fixed sequence solves, each board within its own budget:
    boards that share a budget share a sequence (`best_blind_sequence`), one per budget."""
    solved = 0
    for budget in sorted(set(max_moves)):
        group = [g for g, m in zip(grids, max_moves, strict=True) if m == budget]
        solved += best_blind_sequence(group, budget).solved
    return solved / len(grids)


# --- oracle transcripts ------------------------------------------------------------------------------


def oracle_moves(grid: Grid, limit: int, prefer_train: bool = False) -> list[str]:
    """A shortest solution (directions) of a board at most `limit` moves from solved: each move the
    first of up, down, left, right that brings the board one move closer; with `prefer_train`, the
    first that leads to a training-pool board (`is_heldout`) or solves it, when one does."""
    length = solution_length(grid, limit)
    if length is None:
        raise ValueError(f"the board is more than {limit} moves from solved")
    moves = []
    for left in range(length, 0, -1):
        closer = [
            (move, after)
            for move in legal_directions(grid)
            if solution_length(after := apply_action(grid, move)[0], left - 1) == left - 1
        ]
        if prefer_train:
            closer.sort(key=lambda pair: is_heldout(pair[1]) and not is_solved(pair[1]))
        move, grid = closer[0]
        moves.append(move)
    return moves
