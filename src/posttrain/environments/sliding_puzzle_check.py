"""The greedy sliding-puzzle player that writes its check (`sliding_puzzle`'s checked transcripts): per
direction, whether the tile it slides ends nearer its home cell (`brings_closer`), the first move that
does (`greedy_move`), and that reasoning as text a model can learn to write (`written_check`).
"""

from __future__ import annotations

from posttrain.environments.sliding_puzzle_board import DIRECTIONS, Grid, empty_square, legal_directions


def home_cell(tile: int, size: int) -> tuple[int, int]:
    """(row, col), 0-based, where `tile` sits on the solved board."""
    return divmod(tile - 1, size)


def brings_closer(grid: Grid, direction: str) -> bool | None:
    """Whether the tile that `direction` moves ends nearer its home cell (a move changes one of its
    row or column by one, so the Manhattan distance of the board drops or grows by exactly one);
    None when the direction is illegal."""
    size = len(grid)
    er, ec = empty_square(grid)
    dr, dc = DIRECTIONS[direction]
    r, c = er + dr, ec + dc
    if not (0 <= r < size and 0 <= c < size):
        return None
    hr, hc = home_cell(grid[r][c], size)
    return abs(er - hr) + abs(ec - hc) < abs(r - hr) + abs(c - hc)


def greedy_move(grid: Grid) -> str:
    """The first of up, down, left, right that brings its tile closer to home (`brings_closer`), else
    the first legal direction. On 3×3 boards it solves every board within 4 moves of solved in a
    shortest solution, and 17 of the 20 boards 5 moves away (`tests/unit/test_sliding_puzzle_check.py`)."""
    legal = legal_directions(grid)
    return next((d for d in legal if brings_closer(grid, d)), legal[0])


def written_check(grid: Grid, cells: bool = False) -> str:
    """`greedy_move`'s reasoning as text a model can learn to write: where the empty square is, then
    per direction the tile it would move, the row or column it moves along, where that tile belongs,
    and whether the move brings it closer; the chosen direction is the first "closer" line (else the
    first legal one). 1-based rows and columns, as the board is drawn::

        Empty square: row 3, column 2.
        up: none.
        down: tile 5, row 2 to 3, belongs in row 2: farther.
        left: tile 8, column 3 to 2, belongs in column 2: closer.
        right: tile 7, column 1 to 2, belongs in column 1: farther.

    With `cells` (for boards written by `render_cells`) each direction's line first names the cell
    the tile is read from, as the board writes it: ``down: row 2, column 2: tile 5, row 2 to 3, ...``.
    """
    size = len(grid)
    er, ec = empty_square(grid)
    lines = [f"Empty square: row {er + 1}, column {ec + 1}."]
    for direction, (dr, dc) in DIRECTIONS.items():
        r, c = er + dr, ec + dc
        if not (0 <= r < size and 0 <= c < size):
            lines.append(f"{direction}: none.")
            continue
        tile = grid[r][c]
        hr, hc = home_cell(tile, size)
        axis, frm, to, home = ("row", r, er, hr) if dr else ("column", c, ec, hc)
        verdict = "closer" if abs(to - home) < abs(frm - home) else "farther"  # only this axis changes
        cell = f"row {r + 1}, column {c + 1}: " if cells else ""
        lines.append(
            f"{direction}: {cell}tile {tile}, {axis} {frm + 1} to {to + 1}, belongs in {axis} {home + 1}: "
            f"{verdict}."
        )
    return "\n".join(lines)
