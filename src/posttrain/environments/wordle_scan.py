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
"""

from __future__ import annotations

from collections.abc import Sequence

from posttrain.environments.wordle import History, feedback, first_fit_guesser, fits_feedback, spell

__all__ = ["first_fit_guesser", "rule_out", "scan_reply"]


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
