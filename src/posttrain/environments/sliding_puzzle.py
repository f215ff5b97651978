"""The sliding puzzle game (the n×n "15 puzzle"), played over several turns with `<action>…</action>`.

Rules follow NeMo RL's sliding puzzle: the board starts solved (tiles 1..n²-1 in reading order, the
empty square bottom right) and is shuffled by an ODD number of random legal moves, so it never
starts solved (every legal move moves the empty square to a cell of the other colour of a
checkerboard; after an odd number of moves it cannot be back in its corner). Each turn the model
writes one action inside `<action>…</action>`:

- `up`, `down`, `left`, `right`: slide the tile next to the empty square in that direction
  (`up` moves the tile below the empty square up);
- `slide r c`: slide the tile at row r, column c (1-based) into the adjacent empty square;
- `view`: show the board, no move.

Reward 1 on the turn that solves the puzzle (the episode ends). Every turn counts towards
`max_moves` (a move, a view, an illegal or a malformed action alike), so an episode has at most
`max_moves` turns; an episode that runs out ends unsolved with reward 0, or, with
`shaped_reward > 0`, `shaped_reward` × the fraction of tiles in place. A malformed or illegal
action is an explanatory observation (what went wrong, the legal moves, the format), never an error.

The game is a handful of pure functions on a grid (a list of rows, 0 = the empty square), so a
BFS oracle and tests can use them; `SlidingPuzzleEnvironment` is the batched environment.
"""

from __future__ import annotations

import random
import re
from collections import deque
from typing import Any, ClassVar

from posttrain.environments.interface import (
    EnvStepResult,
    EpisodeStart,
    Message,
    last_assistant_content,
    register_environment,
)

Grid = list[list[int]]
"""A board: `grid[r][c]` is the tile at row r, column c (0-based); 0 is the empty square."""

DIRECTIONS: dict[str, tuple[int, int]] = {"up": (1, 0), "down": (-1, 0), "left": (0, 1), "right": (0, -1)}
"""Direction -> offset from the empty square to the tile that moves (`up`: the tile below moves up)."""

STOP_STRINGS = ("</action>",)


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


def render(grid: Grid) -> str:
    """The board as text: 1-based row and column labels, `_` for the empty square.

    A 2×2 board [[1, 0], [3, 2]] renders as (one line per row, no trailing spaces)::

            1 2
          +-----+
        1 | 1 _ |
        2 | 3 2 |
          +-----+
    """
    size = len(grid)
    width = len(str(size * size - 1))

    def cell(value: int) -> str:
        return (str(value) if value else "_").rjust(width)

    label_width = len(str(size))
    pad = " " * label_width
    border = f"{pad} +{'-' * ((width + 1) * size + 1)}+"
    header = f"{pad}   " + " ".join(str(c + 1).rjust(width) for c in range(size))
    rows = [
        f"{str(r + 1).rjust(label_width)} | " + " ".join(cell(v) for v in row) + " |"
        for r, row in enumerate(grid)
    ]
    return "\n".join([header, border, *rows, border])


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


def parse_action(text: str) -> str | None:
    """The content of the last `<action>…</action>` (case-insensitive, stripped, lower-cased); a last
    tag left open at the end of the text (the closing tag cut as a stop string) counts too. None
    when there is no tag."""
    lower = text.lower()
    start = lower.rfind("<action>")
    if start < 0:
        return None
    start += len("<action>")
    end = lower.find("</action>", start)
    return lower[start : end if end >= 0 else len(lower)].strip()


def instructions(grid: Grid) -> str:
    """The first user message: the rules, the board and the action format."""
    size = len(grid)
    return (
        f"Let's play the sliding puzzle on a {size}x{size} board.\n"
        f"Goal: the tiles 1 to {size * size - 1} in order, left to right and top to bottom, "
        f"with the empty square (_) in the bottom right corner.\n\n"
        f"Board:\n{render(grid)}\n\n"
        "Each turn, make one move by sliding a tile next to the empty square into it:\n"
        "- up, down, left, right: slide a tile in that direction (up moves the tile below the empty "
        "square up)\n"
        "- slide r c: slide the tile at row r, column c (e.g. slide 1 2)\n"
        "- view: show the board again\n"
        "Think briefly, then give exactly one action like this: <action>up</action>"
    )


@register_environment("sliding_puzzle")
class SlidingPuzzleEnvironment:
    """The sliding puzzle as a multi-turn environment (see the module docstring for the rules).

    Tasks are `{"size": int, "shuffle_moves": int, "puzzle_seed": int}` (from `generate_tasks`);
    `reset` turns each into its board deterministically, so a fixed list of tasks is a held-out set.
    A task without "puzzle_seed" takes the episode's seed; a task's "max_moves" can lower the
    environment's `max_moves`, never raise it (the config checks `max_moves` against `environment.max_turns`).

    Args:
        min_size, max_size: board sizes drawn by `generate_tasks` (inclusive).
        max_shuffle_moves: `generate_tasks` draws the shuffle length in 1..max_shuffle_moves and
            makes it odd (adds 1 to an even draw), as NeMo RL does.
        max_moves: turns per episode (every action counts, see the module docstring).
        redraw_board: show the board after every turn (otherwise only after `view` or a malformed
            action, as in NeMo RL).
        shaped_reward: weight of the tiles-in-place fraction given when an episode ends unsolved
            (0 = off); in [0, 1], so an unsolved board (at most (n² - 2) / (n² - 1) of its tiles in
            place) always pays less than solving.
        action_prefix: begin every assistant turn with "<action>" (the episode's response prefix,
            not generated), so the model writes only the move. A small model that never writes the
            tag itself (SmolLM2-135M-Instruct: 1 reply in 256 at temperature 1) then explores moves
            from the first step.

    Metadata (the episode state, passed back to every `step`): "grid", "moves" (turns taken),
    "max_moves". Info per turn: "action" (parsed, or None), "outcome" ("moved", "view",
    "illegal", "no_action"), "solved", "moves".
    """

    turn_limit_kwarg: ClassVar[str] = "max_moves"
    """`environment.max_turns` must be at least `max_moves` (checked by the config): see `episode_turn_limit`."""

    def __init__(
        self,
        min_size: int = 2,
        max_size: int = 3,
        max_shuffle_moves: int = 15,
        max_moves: int = 50,
        redraw_board: bool = False,
        shaped_reward: float = 0.0,
        action_prefix: bool = False,
    ) -> None:
        if not 2 <= min_size <= max_size:
            raise ValueError(f"need 2 <= min_size <= max_size, got min_size={min_size} max_size={max_size}")
        if max_shuffle_moves < 1 or max_moves < 1:
            raise ValueError("max_shuffle_moves and max_moves must be >= 1")
        if not 0.0 <= shaped_reward <= 1.0:
            raise ValueError(
                f"shaped_reward must be in [0, 1], got {shaped_reward}: above 1 an episode that runs out "
                "unsolved could pay more than solving the puzzle (1)"
            )
        self.min_size = min_size
        self.max_size = max_size
        self.max_shuffle_moves = max_shuffle_moves
        self.max_moves = max_moves
        self.redraw_board = redraw_board
        self.shaped_reward = shaped_reward
        self.action_prefix = action_prefix

    def generate_tasks(self, count: int, seed: int) -> list[dict[str, Any]]:
        """`count` puzzles drawn from `seed`: size, an odd shuffle length and the board's own seed."""
        rng = random.Random(seed)
        tasks = []
        for _ in range(count):
            size = rng.randint(self.min_size, self.max_size)
            shuffle_moves = rng.randint(1, self.max_shuffle_moves)
            shuffle_moves += 1 - shuffle_moves % 2
            tasks.append({"size": size, "shuffle_moves": shuffle_moves, "puzzle_seed": rng.randrange(2**31)})
        return tasks

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """One episode per task; a task without "puzzle_seed" uses the episode's seed."""
        starts = []
        for task, seed in zip(tasks, seeds, strict=True):
            grid = shuffled_grid(
                int(task["size"]), int(task["shuffle_moves"]), int(task.get("puzzle_seed", seed))
            )
            metadata = {
                **task,
                "grid": grid,
                "moves": 0,
                "max_moves": min(int(task.get("max_moves", self.max_moves)), self.max_moves),
            }
            starts.append(
                EpisodeStart(
                    messages=[{"role": "user", "content": instructions(grid)}],
                    metadata=metadata,
                    stop_strings=STOP_STRINGS,
                    response_prefix="<action>" if self.action_prefix else "",
                )
            )
        return starts

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        turns = [self._turn(log, meta) for log, meta in zip(message_logs, metadata, strict=True)]
        return EnvStepResult(
            rewards=[t[0] for t in turns],
            observations=[t[1] for t in turns],
            done=[t[2] for t in turns],
            metadata=[t[3] for t in turns],
            info=[t[4] for t in turns],
            stop_strings=[STOP_STRINGS] * len(turns),
        )

    def _turn(
        self, log: list[Message], meta: dict[str, Any]
    ) -> tuple[float, Message | None, bool, dict[str, Any], dict[str, Any]]:
        """One sample's turn: (reward, observation, done, new metadata, info)."""
        grid: Grid = meta["grid"]
        action = parse_action(last_assistant_content(log))
        moves = meta["moves"] + 1
        show_board = self.redraw_board
        if action is None:
            outcome, text, show_board = (
                "no_action",
                "No action found. Answer with one action like <action>up</action>.",
                True,
            )
        elif action == "view":
            outcome, text, show_board = "view", "Here is the board.", True
        else:
            try:
                grid, text = apply_action(grid, action)
                outcome = "moved"
            except IllegalMove as e:
                outcome = "illegal"
                text = f"{e} No move made. Legal moves now: {', '.join(legal_directions(grid))}."
        solved = is_solved(grid)
        done = solved or moves >= meta["max_moves"]
        new_meta = {**meta, "grid": grid, "moves": moves}
        info = {"action": action, "outcome": outcome, "solved": solved, "moves": moves}
        if solved:
            return 1.0, None, True, new_meta, info
        if done:
            return self.shaped_reward * tiles_in_place(grid), None, True, new_meta, info
        if show_board:
            text += f"\n\n{render(grid)}"
        return 0.0, {"role": "user", "content": text}, False, new_meta, info

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        """Per turn: illegal / malformed action rates; over the episodes that ended: solved rate, moves."""
        n = max(len(results), 1)
        ended = [i for i, d in zip(results.info, results.done, strict=True) if d]
        metrics = {
            "env/illegal_action_rate": sum(i.get("outcome") == "illegal" for i in results.info) / n,
            "env/no_action_rate": sum(i.get("outcome") == "no_action" for i in results.info) / n,
        }
        if ended:
            metrics["env/solved_rate"] = sum(bool(i.get("solved")) for i in ended) / len(ended)
            metrics["env/moves_per_episode"] = sum(i.get("moves", 0) for i in ended) / len(ended)
        return metrics
