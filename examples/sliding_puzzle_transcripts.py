"""Oracle transcripts of the sliding puzzle, for an SFT warm start (docs/environments.md#sliding-puzzle-on-3x3-boards).

Writes one JSON line per puzzle, `{"messages": [...], "task": {...}}`: the environment's own first
message and observations, and per move the optimal player's assistant turn `<action>up</action>`
(`posttrain.environments.sliding_puzzle.oracle_transcript`). By default from training-pool boards,
and no held-out board is shown (see `--show-heldout`); `--split heldout` writes held-out puzzles
played to the end (a validation set for the SFT loss). `posttrain sft` reads the files as
`data.train.path` and `data.validation.path`:

    ENV='{"min_size": 2, "max_size": 3, "max_shuffle_moves": 15, "redraw_board": true, "action_prefix": true}'
    python examples/sliding_puzzle_transcripts.py data/sliding_puzzle_sft.jsonl --count 4000 --env "$ENV"
    python examples/sliding_puzzle_transcripts.py data/sliding_puzzle_sft_heldout.jsonl --count 128 \\
        --seed 99999 --split heldout --env "$ENV"

With `--checked` each assistant turn is the greedy player's written check and its move
(`checked_transcript`): where the empty square is, per direction the tile it moves and whether that
brings the tile closer to home, then `<action>...</action>` with the first move that does:

    ENV='{"min_size": 3, "max_size": 3, "max_shuffle_moves": 41, "max_moves": 6, "redraw_board": true}'
    python examples/sliding_puzzle_transcripts.py data/sliding_puzzle_checked_sft.jsonl --count 4000 --checked --env "$ENV"

With `"history": false` in `--env` (the player sees only the current board each turn) every turn is
a row of its own, `[first message for the board, reply]`: what each turn of such an episode sees;
`--distinct-boards` keeps one row per board (the transcripts revisit the boards near solved often):

    ENV='{"min_size": 3, "max_size": 3, "max_shuffle_moves": 41, "max_moves": 6, "board_format": "cells", "history": false}'
    python examples/sliding_puzzle_transcripts.py data/sliding_puzzle_turns_sft.jsonl --count 8000 --checked \
        --hide-within 11 --distinct-boards --env "$ENV"

`--env` takes the environment's keyword arguments: give the GRPO recipe's `redraw_board` (the
observations depend on it) and the board sizes and shuffles to learn from; `max_moves` (default 50)
only has to be long enough for the shuffles. The assistant turns are the same with or without
`action_prefix`: an episode's message holds the "<action>" prefix and the generated "up</action>".
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.data.transcripts import transcripts_parser
from posttrain.data.transcripts import write_transcripts as write_rows
from posttrain.environments.sliding_puzzle import (
    SlidingPuzzleEnvironment,
    checked_transcript,
    oracle_transcript,
    turn_contexts,
)


def write_transcripts(
    out: Path,
    env: SlidingPuzzleEnvironment,
    count: int,
    seed: int,
    split: str = "train",
    show_heldout: bool = False,
    checked: bool = False,
    hide_within: int | None = None,
    distinct_boards: bool = False,
) -> tuple[int, int]:
    """Write `count` transcripts of puzzles of `split` drawn from `seed`; returns (rows, moves).
    Held-out boards are hidden (`oracle_transcript`'s hide_heldout) in training transcripts unless
    `show_heldout` (with `hide_within`, only held-out boards within that many moves of solved). With
    `checked`, the player that writes its check (`checked_transcript`). Without history, one row
    per turn (`turn_contexts`), with `distinct_boards` only the first row of each board."""
    play = checked_transcript if checked else oracle_transcript
    hide = split == "train" and not show_heldout
    rows = [
        (context, task)
        for task in env.generate_tasks(count, seed, split=split)
        for context in turn_contexts(env, play(env, task, hide_heldout=hide, hide_within=hide_within))
    ]
    if distinct_boards:
        if env.history:
            raise ValueError("--distinct-boards needs an environment without history (one row per turn)")
        first_of_board = {}
        for context, task in rows:
            first_of_board.setdefault(context[0]["content"], (context, task))
        rows = list(first_of_board.values())
    written = write_rows(out, rows)
    return written, sum(m["role"] == "assistant" for messages, _ in rows for m in messages)


def main(argv: list[str] | None = None) -> None:
    parser = transcripts_parser(__doc__, count=4000, seed=7, pool="boards")
    parser.add_argument("--env", default="{}", help="SlidingPuzzleEnvironment keyword arguments, as JSON")
    parser.add_argument(
        "--show-heldout",
        action="store_true",
        help="play every puzzle to the end, even where a redrawn board is a held-out one",
    )
    parser.add_argument(
        "--checked",
        action="store_true",
        help="the greedy player that writes its check before each move (checked_transcript; needs an "
        "environment without action_prefix) in place of the optimal player",
    )
    parser.add_argument(
        "--hide-within",
        type=int,
        default=None,
        metavar="N",
        help="hide only the held-out boards within N moves of solved (default: every held-out board); "
        "N >= the evaluation's shuffle + its moves hides every board a held-out episode can show",
    )
    parser.add_argument(
        "--distinct-boards",
        action="store_true",
        help="without history (one row per turn): keep only the first row of each board",
    )
    args = parser.parse_args(argv)
    env = SlidingPuzzleEnvironment(**json.loads(args.env))
    rows, moves = write_transcripts(
        args.out, env, args.count, args.seed, args.split, args.show_heldout, args.checked, args.hide_within,
        args.distinct_boards,
    )  # fmt: skip
    print(f"wrote {rows} transcripts ({moves} moves) of {args.count} puzzles to {args.out}")


if __name__ == "__main__":
    main()
