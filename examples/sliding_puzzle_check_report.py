"""How well an evaluated sliding-puzzle player wrote its check (docs/environments.md#a-board-written-cell-by-cell).

Reads the `samples.jsonl` of `posttrain eval` on a checked recipe (eval_sliding_puzzle_3x3_checked.yaml,
eval_sliding_puzzle_3x3_cells.yaml) and compares every assistant turn with `written_check` of the board
that turn was shown (the prompt's board, then each observation's), in the board's own format (a drawn
grid or one line per cell). Prints, as JSON, the share of turns whose:

- `empty_square_line`: first line (where the empty square is) is right;
- `direction_lines`: direction lines are right (per line, 4 a turn);
- `all_lines`: five lines are all right;
- `move_follows_own_check`: action is the first direction its own check calls `closer`;
- `move_is_greedy`: action is `greedy_move` of the board (what the check, written right, picks);
- `move_is_legal`: action is a legal direction;

and per turn of the episode (first, second, ...): `turns_by_turn` (how many episodes reached it),
`all_lines_by_turn` and `move_is_greedy_by_turn`.

    python examples/sliding_puzzle_check_report.py runs/eval-sliding-puzzle-cells/samples.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from posttrain.environments.sliding_puzzle import parse_action
from posttrain.environments.sliding_puzzle_board import Grid, legal_directions
from posttrain.environments.sliding_puzzle_check import greedy_move, written_check

CELL = re.compile(r"^row (\d+), column (\d+): (\d+|_)$", re.M)
GRID_ROW = re.compile(r"^\s*\d+ \| ([\d_ ]+) \|$", re.M)


def board_in(text: str) -> tuple[Grid, bool] | None:
    """The last board written in `text` and whether it is written cell by cell; None without one."""
    cells = CELL.findall(text)
    if cells:
        size = max(int(r) for r, _, _ in cells)
        last = cells[-size * size :]
        grid = [[0] * size for _ in range(size)]
        for r, c, v in last:
            grid[int(r) - 1][int(c) - 1] = 0 if v == "_" else int(v)
        return grid, True
    rows = GRID_ROW.findall(text)
    if not rows:
        return None
    size = len(rows[-1].split())
    return [[0 if v == "_" else int(v) for v in row.split()] for row in rows[-size:]], False


def own_choice(check_lines: list[str]) -> str | None:
    """The first direction a written check calls closer (None when it calls none)."""
    return next((line.split(":")[0] for line in check_lines if line.endswith("closer.")), None)


def report(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The shares described in the module docstring, over every assistant turn of `samples`."""
    counts: Counter[str] = Counter()
    by_turn: list[Counter[str]] = []
    turns = 0
    for sample in samples:
        shown = board_in(sample["prompt"])
        # an episode of one turn is stored as its completion alone (no message log)
        messages = sample.get("messages") or [{"role": "assistant", "content": sample["completion"]}]
        turn = 0
        for message in messages:
            if message["role"] == "user":
                shown = board_in(message["content"]) or shown
                continue
            if message["role"] != "assistant" or shown is None:
                continue
            board, cells = shown
            turns += 1
            truth = written_check(board, cells=cells).split("\n")
            got = message["content"].split("\n")
            action = parse_action(message["content"])
            greedy = action == greedy_move(board)
            counts["empty_square_line"] += got[0] == truth[0]
            counts["direction_lines"] += sum(t == g for t, g in zip(truth[1:], got[1:5], strict=False))
            counts["all_lines"] += got[:5] == truth
            counts["move_follows_own_check"] += own_choice(got[1:5]) == action
            counts["move_is_greedy"] += greedy
            counts["move_is_legal"] += action in legal_directions(board)
            if turn == len(by_turn):
                by_turn.append(Counter())
            by_turn[turn].update(turns=1, all_lines=got[:5] == truth, move_is_greedy=greedy)
            turn += 1
    if not turns:
        raise ValueError("no assistant turn with a board before it in these samples")
    shares = {key: counts[key] / turns for key in counts}
    shares["direction_lines"] /= 4
    return {
        "turns": turns,
        **shares,
        "turns_by_turn": [c["turns"] for c in by_turn],
        "all_lines_by_turn": [c["all_lines"] / c["turns"] for c in by_turn],
        "move_is_greedy_by_turn": [c["move_is_greedy"] / c["turns"] for c in by_turn],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("samples", type=Path, help="samples.jsonl of a posttrain eval run")
    args = parser.parse_args(argv)
    samples = [json.loads(line) for line in args.samples.read_text().splitlines() if line.strip()]
    print(json.dumps(report(samples), indent=2))


if __name__ == "__main__":
    main()
