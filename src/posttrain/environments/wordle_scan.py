"""A Wordle player that shows its check, for an SFT warm start on games that list their words
(`WordleEnvironment(candidates=n, spelled=True)`).

`first_fit_guesser` guesses the first listed word (in the list's order) that fits every feedback so far.
`scan_reply` writes the check that led to each guess inside `<think>`: every word still possible
before the last feedback, letter by letter, with the first item of that feedback it contradicts
(`rule_out`, e.g. `B L A M E: L grey`) or `fits`, then the guess. A word still possible is one not
guessed yet that fits every earlier feedback, so each turn checks only the words the previous turn
found fitting, against the newest feedback alone:

    <think>
    B L A M E: L grey
    C H E S T: fits
    </think>
    <guess>C H E S T</guess>

The first turn has no feedback to check: `<guess>` and the first listed word. Each line is one
comparison of five letters with one feedback line, which a model can copy the shape of; the
uniform choice of `consistent_guesser` has no single right next token to learn instead.

A check without positions: `first_clean_guesser` guesses the first listed word with no letter known
to be absent (`wordle.absent_letters`: grey and never green or yellow; the `summary` observation's
"not in the word" list), and `absent_reply` writes that check: the absent letters, then the words
not guessed yet in the list's order up to the first clean one, each with the first of its letters
that is absent, or `ok`:

    <think>
    Not in the word: B L U R
    B L A M E: B
    C H E S T: ok
    </think>
    <guess>C H E S T</guess>

Each line asks only whether each of five letters is one of a few listed letters. This ignores green
and yellow, and still solves 62 of the 64 held-out games of the recipe (4 guesses among 16 words).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from posttrain.environments.wordle import (
    History,
    Policy,
    absent_letters,
    feedback,
    first_fit_guesser,
    fits_feedback,
    spell,
    unguessed,
)

__all__ = [
    "absent_reply",
    "first_absent",
    "first_clean_guesser",
    "first_fit_guesser",
    "rule_out",
    "scan_reply",
]


def rule_out(word: str, guess: str, colours: Sequence[str]) -> str | None:
    """The first letter of `guess` whose colour `word` would not have given, as `L grey` (the guess's
    letter, upper case, and the colour it got); None when `word` fits (would give every colour)."""
    would = feedback(word, guess)
    for letter, got, expected in zip(guess, colours, would, strict=True):
        if got != expected:
            return f"{letter.upper()} {got}"
    return None


def scan_reply(history: History, guess: str, candidates: Sequence[str]) -> str:
    """The assistant turn for `guess` after `history` (a `wordle.Writer`): the check of every word
    still possible before the last feedback (see the module docstring), then the guess, spelled."""
    answer = f"<guess>{spell(guess)}</guess>"
    if not history:
        return answer
    guessed = {g for g, _ in history}
    earlier, (last, colours) = history[:-1], history[-1]
    lines = [
        f"{spell(w)}: {rule_out(w, last, colours) or 'fits'}"
        for w in candidates
        if w not in guessed and fits_feedback(w, earlier)
    ]
    return "<think>\n" + "\n".join(lines) + "\n</think>\n" + answer


def first_absent(word: str, absent: Sequence[str]) -> str | None:
    """The first letter of `word`, in the word's order, that is in `absent`; None when none is."""
    return next((letter for letter in word if letter in absent), None)


def first_clean_guesser() -> Policy:
    """The first of the game's candidate words, in order, not guessed yet and holding no letter known
    to be absent (the first unguessed word if every one holds one). Ignores green and yellow."""

    def policy(history: History, rng: random.Random, candidates: Sequence[str] = ()) -> str:
        left = unguessed([], candidates, history)
        absent = absent_letters(history)
        return next((w for w in left if first_absent(w, absent) is None), left[0])

    return policy


def absent_reply(history: History, guess: str, candidates: Sequence[str]) -> str:
    """The assistant turn for `first_clean_guesser`'s `guess` after `history` (a `wordle.Writer`): the
    absent letters, each word not guessed yet up to the first clean one with its first absent letter
    or `ok`, then the guess, spelled (see the module docstring). The first turn: the guess alone."""
    answer = f"<guess>{spell(guess)}</guess>"
    if not history:
        return answer
    absent = absent_letters(history)
    lines = [f"Not in the word: {' '.join(a.upper() for a in absent) or 'none'}"]
    for word in unguessed([], candidates, history):
        letter = first_absent(word, absent)
        lines.append(f"{spell(word)}: {letter.upper() if letter else 'ok'}")
        if letter is None:
            break
    return "<think>\n" + "\n".join(lines) + "\n</think>\n" + answer
