"""What docstring templates are made of (`code_docstring`): `DocTemplate` and the random
input makers (`draw_*`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Args = tuple[Any, ...]


@dataclass(frozen=True)
class DocTemplate:
    """One kind of function to write.

    key: the template's name. names: function names a task draws from. signature / returns: the
    parameters and return annotation (typing names are imported in the prompt). doc / body: the
    docstring's description and the reference body, `string.Template` text whose `$name`s are the
    drawn constants (substituted as `repr`). make_args: one random input (the arguments). edge:
    the edge-case inputs every task tests. constants: draws the constants. close: float outputs,
    compared within FLOAT_TOL.
    """

    key: str
    names: tuple[str, ...]
    signature: str
    returns: str
    doc: str
    body: str
    make_args: Callable[[random.Random], Args]
    edge: tuple[Args, ...] = ()
    constants: Callable[[random.Random], dict[str, Any]] = field(default=lambda r: {})
    close: bool = False


# ----------------------------------------------------------------------------- random inputs
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_ACCENTED = "éüñçåø"


def draw_word(r: random.Random, lo: int = 1, hi: int = 7) -> str:
    return "".join(r.choice(_LOWER) for _ in range(r.randint(lo, hi)))


def draw_words(r: random.Random, lo: int = 1, hi: int = 6) -> list[str]:
    return [draw_word(r) for _ in range(r.randint(lo, hi))]


def draw_sentence(r: random.Random) -> str:
    """Words joined by one space, now and then two; sometimes a capital or an accented letter."""
    words = [w.capitalize() if r.random() < 0.2 else w for w in draw_words(r)]
    if r.random() < 0.2:
        words[0] += r.choice(_ACCENTED)
    return "".join(w + (" " if r.random() < 0.85 else "  ") for w in words).rstrip()


def draw_mixed(r: random.Random, lo: int = 1, hi: int = 12) -> str:
    """Letters of both cases, digits, spaces and punctuation."""
    pool = _LOWER + _LOWER.upper() + "0123456789  ,.!?" + _ACCENTED
    return "".join(r.choice(pool) for _ in range(r.randint(lo, hi)))


def draw_runs(r: random.Random) -> str:
    """A string of runs of repeated characters: 'aaabcc'."""
    return "".join(r.choice("abcxyz") * r.randint(1, 4) for _ in range(r.randint(1, 5)))


def draw_ints(r: random.Random, lo: int = -9, hi: int = 20, n: tuple[int, int] = (1, 7)) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(*n))]


def draw_scores(r: random.Random, lo: int = -5, hi: int = 20) -> dict[str, int]:
    return {w: r.randint(lo, hi) for w in draw_words(r, 1, 5)}


def draw_palindrome_or_not(r: random.Random) -> str:
    """Half the time a palindrome once punctuation and case are dropped ("Ab, a"), else random."""
    if r.random() < 0.5:
        return draw_mixed(r, 2, 10)
    half = draw_word(r, 1, 5)
    text = "".join(ch.upper() if r.random() < 0.3 else ch for ch in half + r.choice(["", "x"]) + half[::-1])
    cut = r.randint(1, len(text))
    return text[:cut] + r.choice([", ", "! ", " "]) + text[cut:]


def draw_anagram_pair(r: random.Random) -> Args:
    first = draw_word(r, 2, 8)
    if r.random() < 0.5:
        return first, draw_word(r, 2, 8)
    letters = list(first)
    r.shuffle(letters)
    second = "".join(ch.upper() if r.random() < 0.3 else ch for ch in letters)
    return first, second[:2] + " " + second[2:]


def draw_clamp_args(r: random.Random) -> Args:
    low = r.randint(-10, 5)
    return draw_ints(r, -20, 20), low, low + r.randint(0, 10)


def draw_square_or_not(r: random.Random) -> Args:
    return (r.randint(0, 40) ** 2 if r.random() < 0.5 else r.randint(-20, 1600),)


def draw_floats(r: random.Random) -> list[float]:
    return [round(r.uniform(-10, 10), 1) for _ in range(r.randint(1, 6))]


def draw_label_constants(r: random.Random) -> dict[str, Any]:
    a, b = r.sample(range(2, 8), 2)
    wa, wb = r.choice([("Ping", "Pong"), ("Tic", "Tac"), ("Foo", "Bar"), ("Zig", "Zag"), ("Hip", "Hop")])
    return {"a": a, "b": b, "wa": wa, "wb": wb}


def constants_between(lo: int, hi: int) -> Callable[[random.Random], dict[str, Any]]:
    return lambda r: {"k": r.randint(lo, hi)}


def one_argument(make: Callable[[random.Random], Any]) -> Callable[[random.Random], Args]:
    return lambda r: (make(r),)
