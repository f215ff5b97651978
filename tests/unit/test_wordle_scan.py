"""Wordle with the candidate words spelled letter by letter (`spelled=True`), and the first-fit player
that writes its check (`posttrain.environments.wordle_scan`, examples/wordle_transcripts.py --scan)."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import pytest
from test_wordle import SECRET, play

from posttrain.environments.wordle import GREEN as G
from posttrain.environments.wordle import GREY as X
from posttrain.environments.wordle import YELLOW as Y
from posttrain.environments.wordle import (
    WordleEnvironment,
    absent_letters,
    board_summary,
    feedback,
    fits_feedback,
    parse_guess,
    random_guesser,
    solve_rate,
    spell,
)
from posttrain.environments.wordle_scan import (
    absent_reply,
    first_absent,
    first_clean_guesser,
    first_fit_guesser,
    rule_out,
    scan_reply,
)

SPELLED = {"max_guesses": 4, "candidates": 16, "spelled": True}
ABSENT = {**SPELLED, "summary": True}
_SPELLED_WORD = re.compile(r"\b[A-Z] [A-Z] [A-Z] [A-Z] [A-Z]\b")


def test_spelled_guesses_parse_only_in_a_spelled_game() -> None:
    assert spell("crane") == "C R A N E"
    assert parse_guess("<guess>C R A N E</guess>", spelled=True) == ("crane", "valid")
    assert parse_guess("<guess> c r a n e </guess>", spelled=True) == ("crane", "valid")
    assert parse_guess("<guess>crane</guess>", spelled=True) == ("crane", "valid")  # one word, as always
    assert parse_guess("<guess>C R A N E</guess>") == (None, "not_a_word")  # not in an unspelled game
    for bad in ("C R A N E S", "C  R A N E", "C-R-A-N-E", "CR A N E", "C R A N", "C R A N 3"):
        assert parse_guess(f"<guess>{bad}</guess>", spelled=True) == (None, "not_a_word"), bad


def test_a_spelled_game_lists_its_words_one_a_line_and_takes_a_spelled_guess() -> None:
    env = WordleEnvironment(**SPELLED)
    start = env.reset([{"secret": SECRET}], [0])[0]
    listed = start.metadata["candidates"]
    first = start.messages[0]["content"]
    assert "one of these 16 words:\n" + "\n".join(spell(w) for w in listed) + "\n" in first
    assert "<guess>N O T E S</guess>" in first
    other = next(w for w in listed if w != SECRET)
    turns = play(
        env,
        SECRET,
        [f"<guess>{spell(other)}</guess>", "<guess>crane</guess>", f"<guess>{spell(SECRET)}</guess>"],
    )
    assert [t["info"]["outcome"] for t in turns] == ["valid", "not_a_candidate", "solved"]
    assert [t["reward"] for t in turns] == [0.0, 0.0, 1.0]
    assert turns[0]["obs"].endswith("\n".join(spell(w) for w in listed) + "\n3 guesses left.")


@pytest.mark.parametrize(
    "text",
    [
        "<think>\n{lines}\n</think>",  # every word checked, `fits` everywhere, no guess
        "<guess>{all}</guess>",  # the whole spelled list in one tag
        "<think><guess>{secret}</guess></think><guess>{other}</guess>",  # the secret inside think only
        "<guess>{secret} S</guess>",  # six letters
    ],
)
@pytest.mark.parametrize("kwargs", [SPELLED, ABSENT], ids=["spelled", "spelled+summary"])
def test_red_team_against_the_spelled_list_scores_zero(text: str, kwargs: dict) -> None:
    env = WordleEnvironment(**kwargs)
    listed = env.reset([{"secret": SECRET}], [0])[0].metadata["candidates"]
    other = next(w for w in listed if w != SECRET)
    reply = text.format(
        lines="\n".join(f"{spell(w)}: fits" for w in listed),
        all=" ".join(spell(w) for w in listed),
        secret=spell(SECRET),
        other=spell(other),
    )
    turns = play(env, SECRET, [reply] * 4)
    assert [t["reward"] for t in turns] == [0.0] * 4 and not turns[-1]["info"]["solved"]


@pytest.mark.parametrize(
    ("word", "guess", "colours", "why"),
    [
        ("blame", "burst", (X, X, G, X, Y), "B grey"),  # BLAME has the B that came back grey
        ("earth", "burst", (X, X, G, X, Y), None),  # EARTH would give exactly these colours
        ("chess", "burst", (X, X, G, X, Y), "R green"),  # no R in CHESS, so R could not be green
        ("pound", "burst", (X, X, G, X, Y), "U grey"),  # POUND has a U
        ("crisp", "crane", (G, Y, X, X, X), "R yellow"),  # yellow R is not at 2, CRISP's R is
        ("tiger", "crane", (X, Y, X, X, Y), None),  # R and E in TIGER, elsewhere: yellow, yellow
    ],
)
def test_rule_out_names_the_first_colour_the_word_would_not_give(
    word: str, guess: str, colours: tuple, why: str | None
) -> None:
    assert rule_out(word, guess, colours) == why
    assert (why is None) == (feedback(word, guess) == colours)


def test_scan_reply_checks_the_words_still_possible_against_the_newest_feedback() -> None:
    """Listed BLAME, BURST, CHESS, EARTH, TIGER; secret EARTH. Turn 1 guesses the first word, no check.
    After BURST's feedback every other word is checked; after a second guess only the words that
    fitted BURST are (here TIGER was ruled out by BURST, so it is not checked again)."""
    listed = ["blame", "burst", "chess", "earth", "tiger"]
    assert scan_reply([], "blame", listed) == "<guess>B L A M E</guess>"
    history = [("burst", feedback("earth", "burst"))]
    assert history[0][1] == (X, X, G, X, Y)
    reply = scan_reply(history, "earth", listed)
    assert reply == (
        "<think>\nB L A M E: B grey\nC H E S S: R green\nE A R T H: fits\nT I G E R: R green\n</think>\n"
        "<guess>E A R T H</guess>"
    )
    history2 = [*history, ("chess", feedback("earth", "chess"))]
    # words not guessed that fit BURST: EARTH only (BLAME, CHESS, TIGER ruled out) - CHESS guessed anyway
    assert (
        scan_reply(history2, "earth", listed)
        == "<think>\nE A R T H: fits\n</think>\n<guess>E A R T H</guess>"
    )
    guess = first_fit_guesser()(history, None, listed)
    assert guess == "earth" and fits_feedback(guess, history)


def test_first_fit_player_solves_every_heldout_game_and_the_blind_baseline_does_not() -> None:
    """The recipe's held-out set (grpo_wordle_scan.yaml: 64 games, seed 99999, 16 held-out words, 4
    guesses): the first-fit player solves all; the random guesser 21 (seed 0, as in the unspelled game)."""
    env = WordleEnvironment(**SPELLED)
    heldout = env.generate_tasks(64, seed=99999, split="heldout")
    assert solve_rate(env, heldout, first_fit_guesser(), seed=0) == 1.0
    assert solve_rate(env, heldout, random_guesser(), seed=0) == 21 / 64


def test_scan_transcripts_replay_their_checks_and_list_only_training_words(tmp_path: Path) -> None:
    """examples/wordle_transcripts.py --scan: every game solved; every check line says `fits` exactly
    when the word fits every feedback so far, and each turn guesses the first word that fits; no
    held-out word appears in a training transcript, spelled or not."""
    script = runpy.run_path("examples/wordle_transcripts.py", run_name="wordle_transcripts")
    env = WordleEnvironment(**SPELLED)
    out = tmp_path / "scan.jsonl"
    guesses, solved = script["write_transcripts"](out, env, 100, seed=11, scan=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert solved == 100 and guesses == sum(len(r["messages"]) // 2 for r in rows)
    heldout = set(env.words.pool("heldout"))
    text = json.dumps([r["messages"] for r in rows])
    spelled_words = {w.replace(" ", "").lower() for w in _SPELLED_WORD.findall(text)}
    assert spelled_words and not spelled_words & heldout
    # THINK is a held-out secret: the tags around the check are not a guess of it
    prose = text.replace("<think>", "").replace("</think>", "")
    assert not {w for w in re.findall(r"\b[a-z]{5}\b", prose) if w in heldout}
    for row in rows:
        secret = env.secret_of(row["task"], 0)
        history = []
        for reply in [m["content"] for m in row["messages"][1::2]]:
            checks = re.findall(r"^([A-Z] [A-Z] [A-Z] [A-Z] [A-Z]): (.+)$", reply, re.MULTILINE)
            assert (not checks) == (not history)
            for word, verdict in checks:
                assert (verdict == "fits") == fits_feedback(word.replace(" ", "").lower(), history)
            guess, outcome = parse_guess(reply, spelled=True)
            assert outcome == "valid" and guess == next(
                (w.replace(" ", "").lower() for w, v in checks if v == "fits"), guess
            )
            history.append((guess, feedback(secret, guess)))
        assert history[-1][0] == secret
    with pytest.raises(SystemExit, match="--scan"):
        script["write_transcripts"](out, WordleEnvironment(candidates=16), 2, seed=11, scan=True)


def test_absent_letters_are_grey_and_never_green_or_yellow() -> None:
    """Secret EARTH. EERIE: E green, E grey (one E only), R green, I grey, E grey: of the greys only I is
    absent, the extra E copies say how many Es there are. BURST adds B, S, U (R green, T yellow)."""
    eerie = feedback("earth", "eerie")
    assert eerie == (G, X, G, X, X)
    assert absent_letters([("eerie", eerie)]) == ["i"]
    history = [("eerie", eerie), ("burst", feedback("earth", "burst"))]
    assert absent_letters(history) == ["b", "i", "s", "u"]
    assert board_summary(history).endswith("not in the word: B, I, S, U.")  # the observation's list
    assert absent_letters([]) == []
    assert first_absent("chess", ["b", "s", "u"]) == "s" and first_absent("earth", ["b", "s"]) is None


def test_absent_reply_checks_the_words_in_order_up_to_the_first_clean_one() -> None:
    """Listed BLAME, BURST, CHESS, EARTH, TIGER; secret EARTH; BURST guessed: B, S, U are absent. BLAME
    has B, CHESS has S (its first absent letter in its own order: C and H are not absent), EARTH none:
    the check stops there, TIGER is not written."""
    listed = ["blame", "burst", "chess", "earth", "tiger"]
    assert absent_reply([], "blame", listed) == "<guess>B L A M E</guess>"
    history = [("burst", feedback("earth", "burst"))]
    guess = first_clean_guesser()(history, None, listed)
    assert guess == "earth"
    assert absent_reply(history, guess, listed) == (
        "<think>\nNot in the word: B S U\nB L A M E: B\nC H E S S: S\nE A R T H: ok\n</think>\n"
        "<guess>E A R T H</guess>"
    )
    # every word left holds an absent letter: all are written, and the first one is guessed
    stuck = [("tiger", feedback("burst", "tiger")), ("earth", feedback("burst", "earth"))]
    assert absent_letters(stuck) == ["a", "e", "g", "h", "i"]
    guess = first_clean_guesser()(stuck, None, ["blame", "chess", "earth", "tiger"])
    assert guess == "blame"
    assert absent_reply(stuck, guess, ["blame", "chess", "earth", "tiger"]) == (
        "<think>\nNot in the word: A E G H I\nB L A M E: A\nC H E S S: H\n</think>\n<guess>B L A M E</guess>"
    )


def test_first_clean_player_solves_62_of_the_64_heldout_games() -> None:
    """The absent-letter check alone (no positions, no green or yellow) on the recipe's held-out games
    (16 held-out words, 4 guesses): 62 of 64, against the random guesser's 21 (25% expected)."""
    env = WordleEnvironment(**ABSENT)
    heldout = env.generate_tasks(64, seed=99999, split="heldout")
    assert solve_rate(env, heldout, first_clean_guesser(), seed=0) == 62 / 64


def test_absent_transcripts_copy_the_summary_and_check_every_word_right(tmp_path: Path) -> None:
    """examples/wordle_transcripts.py --absent: each turn after the first copies the observation's "not
    in the word" letters, names each word's first absent letter (or `ok`) in the list's order up to the
    first clean word, and guesses that word; no held-out word appears in a training transcript."""
    script = runpy.run_path("examples/wordle_transcripts.py", run_name="wordle_transcripts")
    env = WordleEnvironment(**ABSENT)
    out = tmp_path / "absent.jsonl"
    guesses, solved = script["write_transcripts"](out, env, 100, seed=11, absent=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 85 <= solved < 100 and guesses == sum(len(r["messages"]) // 2 for r in rows)
    heldout = set(env.words.pool("heldout"))
    # the absent letters are listed sorted, and B E G I N once spells a held-out word: not a word shown
    text = re.sub(r"Not in the word: [A-Z ]*", "", json.dumps([r["messages"] for r in rows]))
    assert not {w.replace(" ", "").lower() for w in _SPELLED_WORD.findall(text)} & heldout
    for row in rows:
        secret, history = env.secret_of(row["task"], 0), []
        users = [m["content"] for m in row["messages"][0::2]]
        replies = [m["content"] for m in row["messages"][1::2]]
        for observation, reply in zip(users, replies, strict=True):
            absent = absent_letters(history)
            if history:
                listed = ", ".join(a.upper() for a in absent) or "none"
                assert f"not in the word: {listed}." in observation
                assert f"Not in the word: {' '.join(a.upper() for a in absent) or 'none'}\n" in reply
            checks = re.findall(r"^([A-Z] [A-Z] [A-Z] [A-Z] [A-Z]): (\w+)$", reply, re.MULTILINE)
            assert (not checks) == (not history)
            for word, verdict in checks:
                letter = first_absent(word.replace(" ", "").lower(), absent)
                assert verdict == (letter.upper() if letter else "ok")
            guess, outcome = parse_guess(reply, spelled=True)
            assert outcome == "valid"
            if checks and checks[-1][1] == "ok":
                assert spell(guess) == checks[-1][0]
            history.append((guess, feedback(secret, guess)))
    with pytest.raises(SystemExit, match="summary"):
        script["write_transcripts"](out, WordleEnvironment(**SPELLED), 2, seed=11, absent=True)
