"""Transcripts of a Wordle player that reads the feedback, for an SFT warm start (docs/environments.md#wordle).

Writes one JSON line per game, `{"messages": [...], "task": {...}}`: the environment's own first
message and observations, and per turn the player's assistant turn `<guess>word</guess>`
(`posttrain.environments.wordle.player_transcript` with `consistent_guesser`: each guess a random
allowed word that fits every feedback so far). Games of `--split train` have training-pool secrets
only, so no held-out secret is ever a transcript's answer; by default no held-out secret is guessed
either (`--guess-heldout` lets the player guess any allowed word). `--split heldout` writes held-out
games (a validation set for the SFT loss). `posttrain sft` reads the files as `data.train.path` and
`data.validation.path`:

    python examples/wordle_transcripts.py data/wordle_sft.jsonl --count 2000 --seed 11
    python examples/wordle_transcripts.py data/wordle_sft_heldout.jsonl --count 64 --seed 99999 --split heldout

`--env` takes the environment's keyword arguments (give the GRPO recipe's `max_guesses`, `word_list`
`summary` and `candidates`: the observations depend on it); `--opener WORD` makes every game open
with WORD (not with `candidates`: a game's first guess is one of its own listed words). The assistant
turns are the same with or without `guess_prefix`: an episode's message holds the "<guess>" prefix
and the generated "word</guess>".

`--scan` (games that list their words letter by letter: `--env '{"candidates": 16, "spelled": true}'`)
plays `wordle_scan.first_fit_guesser` instead and writes each turn as `wordle_scan.scan_reply`: every
word still possible checked against the newest feedback inside `<think>`, then the first that fits.
`--absent` (the same spelled games with `"summary": true`) plays `wordle_scan.first_clean_guesser`: the
first listed word with no letter known to be absent, each turn written as `wordle_scan.absent_reply`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from posttrain.data.transcripts import transcripts_parser
from posttrain.data.transcripts import write_transcripts as write_rows
from posttrain.environments.wordle import (
    History,
    WordleEnvironment,
    consistent_guesser,
    player_transcript,
    spell,
)
from posttrain.environments.wordle_scan import (
    absent_reply,
    first_clean_guesser,
    first_fit_guesser,
    scan_reply,
)


def write_transcripts(
    out: Path,
    env: WordleEnvironment,
    count: int,
    seed: int,
    split: str = "train",
    guess_heldout: bool = False,
    opener: str | None = None,
    scan: bool = False,
    absent: bool = False,
) -> tuple[int, int]:
    """Write `count` games of `split` drawn from `seed`; returns (guesses, games solved). Unless
    `guess_heldout` (or `split` is "heldout"), the player never guesses a held-out secret; with
    `opener`, every game's first guess is that word; with `scan`, the first listed word that fits,
    each turn written with its check (`scan_reply`); with `absent`, the first listed word with no
    absent letter, written with that check (`absent_reply`)."""
    if (scan or absent) and not (env.candidates and env.spelled):
        raise SystemExit(
            "--scan and --absent play games that list their words spelled: give --env candidates and spelled"
        )
    if absent and not env.summary:
        raise SystemExit('--absent copies the observation\'s "not in the word" list: give --env summary')
    if scan and absent:
        raise SystemExit("--scan and --absent are two players: give one")
    words = env.words.allowed
    if split == "train" and not guess_heldout:
        words = words - frozenset(env.words.pool("heldout"))
    if opener is not None and (env.candidates or opener not in words):
        raise SystemExit(f"--opener {opener!r} is not a word the player may guess")
    # a game that lists candidate words (all of its split's pool) is played among them
    reader = consistent_guesser(() if env.candidates else sorted(words))

    def policy(history: History, rng: random.Random, candidates: Sequence[str]) -> str:
        return opener if opener is not None and not history else reader(history, rng, candidates)

    writer = None
    if scan:
        policy, writer = first_fit_guesser(), scan_reply
    if absent:
        policy, writer = first_clean_guesser(), absent_reply
    rows = [
        (player_transcript(env, task, policy, seed + i, writer), task)
        for i, task in enumerate(env.generate_tasks(count, seed, split=split))
    ]
    write_rows(out, rows)
    guesses = sum(m["role"] == "assistant" for messages, _ in rows for m in messages)
    solved = sum(
        messages[-1]["content"].endswith(f"<guess>{spell(secret) if env.spelled else secret}</guess>")
        for messages, task in rows
        for secret in [env.secret_of(task, 0)]
    )
    return guesses, solved


def main(argv: list[str] | None = None) -> None:
    parser = transcripts_parser(__doc__, count=2000, seed=11, pool="secrets")
    parser.add_argument("--env", default="{}", help="WordleEnvironment keyword arguments, as JSON")
    parser.add_argument(
        "--guess-heldout",
        action="store_true",
        help="let the player guess held-out secrets (never as the answer)",
    )
    parser.add_argument(
        "--opener", default=None, help="the first guess of every game (default: the player's)"
    )
    parser.add_argument(
        "--scan", action="store_true", help="the first listed word that fits, each turn with its check"
    )
    parser.add_argument(
        "--absent",
        action="store_true",
        help="the first listed word with no letter known to be absent, each turn with that check",
    )
    args = parser.parse_args(argv)
    env = WordleEnvironment(**json.loads(args.env))
    guesses, solved = write_transcripts(
        args.out,
        env,
        args.count,
        args.seed,
        args.split,
        args.guess_heldout,
        args.opener,
        args.scan,
        args.absent,
    )
    print(f"wrote {args.count} games ({guesses} guesses, {solved} solved) to {args.out}")


if __name__ == "__main__":
    main()
