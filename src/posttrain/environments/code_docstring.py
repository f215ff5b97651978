"""HumanEval-shaped code tasks, generated offline: a typed `def` signature and a docstring that states
the task and gives `>>>` examples; the model completes the function (issue #32 item 3).

Each template (`DOCSTRING_TEMPLATES`) holds a description, a reference body and input makers; a task
draws a function name, the template's constants, 2-3 example inputs (shown in the docstring) and
hidden inputs (the template's edge cases: empty input, negatives, duplicates, unicode or whitespace
where they apply, and 3 more random inputs). The prompt is the signature with its docstring, given
to the model exactly as `HUMANEVAL_PROMPT` gives HumanEval's (`code.humaneval_tasks`); it is also the task's `prelude`,
so a reply holding only the body continues it, as on HumanEval. Every expected value is computed by
running the template's reference (prompt + body) on the host, never typed by hand; the tests are
plain `assert f(args) == <value>` statements (`abs(f(args) - <value>) < 1e-06` for floats), decided
on the host (`code_checks.host_checks`). The tests beyond the examples always hold >= 2 distinct
expected values, so no reply that answers the examples from a table and a constant otherwise passes.

Splits: "heldout" is the templates of `HELDOUT_TEMPLATES` (none of them in "train"); None, all.
No function name is a HumanEval entry point and no prompt shares 8 consecutive words with a
HumanEval prompt (`tests/unit/test_code_docstring.py` checks every template over several seeds).
"""

from __future__ import annotations

import copy
import functools
import random
import re
import string
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Args = tuple[Any, ...]
SPLITS = ("train", "heldout")
EXAMPLES = (2, 3)  # how many `>>>` examples a docstring shows (drawn)
HIDDEN_RANDOM = 3  # random hidden inputs beside the template's edge cases
FLOAT_TOL = 1e-06
HUMANEVAL_PROMPT = (
    "Complete the following Python function. Reply with the whole function in a ```python code block.\n\n"
    "```python\n{prompt}```"
)
"""The user message of a HumanEval problem (`code.humaneval_tasks`) and of a docstring task alike."""


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


def _word(r: random.Random, lo: int = 1, hi: int = 7) -> str:
    return "".join(r.choice(_LOWER) for _ in range(r.randint(lo, hi)))


def _words(r: random.Random, lo: int = 1, hi: int = 6) -> list[str]:
    return [_word(r) for _ in range(r.randint(lo, hi))]


def _sentence(r: random.Random) -> str:
    """Words joined by one space, now and then two; sometimes a capital or an accented letter."""
    words = [w.capitalize() if r.random() < 0.2 else w for w in _words(r)]
    if r.random() < 0.2:
        words[0] += r.choice(_ACCENTED)
    return "".join(w + (" " if r.random() < 0.85 else "  ") for w in words).rstrip()


def _mixed(r: random.Random, lo: int = 1, hi: int = 12) -> str:
    """Letters of both cases, digits, spaces and punctuation."""
    pool = _LOWER + _LOWER.upper() + "0123456789  ,.!?" + _ACCENTED
    return "".join(r.choice(pool) for _ in range(r.randint(lo, hi)))


def _runs(r: random.Random) -> str:
    """A string of runs of repeated characters: 'aaabcc'."""
    return "".join(r.choice("abcxyz") * r.randint(1, 4) for _ in range(r.randint(1, 5)))


def _ints(r: random.Random, lo: int = -9, hi: int = 20, n: tuple[int, int] = (1, 7)) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(*n))]


def _scores(r: random.Random, lo: int = -5, hi: int = 20) -> dict[str, int]:
    return {w: r.randint(lo, hi) for w in _words(r, 1, 5)}


def _palindrome_or_not(r: random.Random) -> str:
    """Half the time a palindrome once punctuation and case are dropped ("Ab, a"), else random."""
    if r.random() < 0.5:
        return _mixed(r, 2, 10)
    half = _word(r, 1, 5)
    text = "".join(ch.upper() if r.random() < 0.3 else ch for ch in half + r.choice(["", "x"]) + half[::-1])
    cut = r.randint(1, len(text))
    return text[:cut] + r.choice([", ", "! ", " "]) + text[cut:]


def _anagram_pair(r: random.Random) -> Args:
    first = _word(r, 2, 8)
    if r.random() < 0.5:
        return first, _word(r, 2, 8)
    letters = list(first)
    r.shuffle(letters)
    second = "".join(ch.upper() if r.random() < 0.3 else ch for ch in letters)
    return first, second[:2] + " " + second[2:]


def _clamp_args(r: random.Random) -> Args:
    low = r.randint(-10, 5)
    return _ints(r, -20, 20), low, low + r.randint(0, 10)


def _square_or_not(r: random.Random) -> Args:
    return (r.randint(0, 40) ** 2 if r.random() < 0.5 else r.randint(-20, 1600),)


def _floats(r: random.Random) -> list[float]:
    return [round(r.uniform(-10, 10), 1) for _ in range(r.randint(1, 6))]


def _label_constants(r: random.Random) -> dict[str, Any]:
    a, b = r.sample(range(2, 8), 2)
    wa, wb = r.choice([("Ping", "Pong"), ("Tic", "Tac"), ("Foo", "Bar"), ("Zig", "Zag"), ("Hip", "Hop")])
    return {"a": a, "b": b, "wa": wa, "wb": wb}


def _k(lo: int, hi: int) -> Callable[[random.Random], dict[str, Any]]:
    return lambda r: {"k": r.randint(lo, hi)}


def _one(make: Callable[[random.Random], Any]) -> Callable[[random.Random], Args]:
    return lambda r: (make(r),)


def _strings() -> tuple[DocTemplate, ...]:
    return (
        DocTemplate(
            "count_capitals",
            ("count_capitals", "uppercase_total", "num_capital_letters"),
            "text: str",
            "int",
            "Count how many characters of text are upper case letters. Letters of every alphabet count; "
            "digits, spaces and punctuation do not.",
            "return sum(1 for ch in text if ch.isupper())",
            _one(_mixed),
            (("",), ("ÉCOLE été",), ("123 !?",)),
        ),
        DocTemplate(
            "reverse_word_order",
            ("reverse_word_order", "words_backwards", "flip_sentence"),
            "sentence: str",
            "str",
            "Split sentence on whitespace and give back its words in the opposite order, separated by "
            "single spaces. Extra spaces at the ends or between words disappear.",
            'return " ".join(sentence.split()[::-1])',
            _one(_sentence),
            (("",), ("   ",), ("  solo  ",)),
        ),
        DocTemplate(
            "capitalize_each_word",
            ("capitalize_each_word", "upper_first_letters"),
            "text: str",
            "str",
            "Make the first character of each space-separated word upper case and keep every other "
            "character as it is. Runs of several spaces are kept.",
            'return " ".join(w[:1].upper() + w[1:] for w in text.split(" "))',
            _one(_sentence),
            (("",), ("a  b",), ("élan vital",)),
        ),
        DocTemplate(
            "drop_character",
            ("drop_character", "without_char", "erase_symbol"),
            "text: str, ch: str",
            "str",
            "Return text with every occurrence of the single character ch taken out.",
            'return text.replace(ch, "")',
            lambda r: (t := _sentence(r), r.choice(t)),
            (("", "a"), ("aaaa", "a"), ("  x  ", " ")),
        ),
        DocTemplate(
            "encode_runs",
            ("encode_runs", "run_length_code", "squeeze_runs"),
            "text: str",
            "str",
            "Compress text by writing each maximal run of one repeated character as that character "
            "followed by the length of the run, so that a run of four 'q' becomes 'q4'.",
            """
            out = []
            i = 0
            while i < len(text):
                j = i
                while j < len(text) and text[j] == text[i]:
                    j += 1
                out.append(text[i] + str(j - i))
                i = j
            return "".join(out)
            """,
            _one(_runs),
            (("",), ("x",), ("  ",)),
        ),
        DocTemplate(
            "same_letters",
            ("are_anagrams", "same_letters", "letters_match"),
            "first: str, second: str",
            "bool",
            "Decide whether the two strings are made of exactly the same letters, each used the same "
            "number of times, when spaces are ignored and upper and lower case count as one.",
            'return sorted(first.replace(" ", "").lower()) == sorted(second.replace(" ", "").lower())',
            _anagram_pair,
            (("", ""), ("Dormitory", "dirty room"), ("abc", "abcc")),
        ),
        DocTemplate(
            "longest_word",
            ("longest_word", "widest_word", "lengthiest_word"),
            "sentence: str",
            "str",
            "Return the longest whitespace-separated word of sentence; when several words share the "
            "greatest length, the earliest of them wins. Return an empty string when there are no words.",
            """
            best = ""
            for word in sentence.split():
                if len(word) > len(best):
                    best = word
            return best
            """,
            _one(_sentence),
            (("",), ("ab cd",), ("   ",)),
        ),
        DocTemplate(
            "char_counts",
            ("letter_tally", "count_each_char", "char_histogram"),
            "text: str",
            "Dict[str, int]",
            "Build a dictionary mapping each character of text that is not whitespace to the number of "
            "times it occurs in text.",
            """
            counts = {}
            for ch in text:
                if not ch.isspace():
                    counts[ch] = counts.get(ch, 0) + 1
            return counts
            """,
            _one(lambda r: _mixed(r, 1, 8)),
            (("",), ("a a\tA",), ("ñññ",)),
        ),
        DocTemplate(
            "count_word",
            ("occurrences_of_word", "word_hits", "tally_word"),
            "sentence: str, word: str",
            "int",
            "Count the whitespace-separated words of sentence that are equal to word once upper and "
            "lower case are treated alike.",
            "return sum(1 for w in sentence.split() if w.lower() == word.lower())",
            lambda r: (
                s := _sentence(r) + " " + r.choice(["go", "Go", "GO"]) * r.randint(0, 1),
                r.choice(s.split()),
            ),
            (("", "a"), ("Go go GO", "go"), ("gopher go", "go")),
        ),
        DocTemplate(
            "zigzag_case",
            ("zigzag_case", "alternate_case", "seesaw_letters"),
            "text: str",
            "str",
            "Return text with the characters at even positions (0, 2, 4, ...) in upper case and the "
            "characters at odd positions in lower case.",
            'return "".join(ch.upper() if i % 2 == 0 else ch.lower() for i, ch in enumerate(text))',
            _one(_mixed),
            (("",), ("ab cd",), ("éa",)),
        ),
        DocTemplate(
            "mask_digits",
            ("mask_digits", "hide_digits", "blank_out_numbers"),
            "text: str",
            "str",
            "Replace every decimal digit 0-9 in text with the character $mark and return the result.",
            'return "".join($mark if ch in "0123456789" else ch for ch in text)',
            _one(_mixed),
            (("",), ("2024-01-05",), ("no digits",)),
            lambda r: {"mark": r.choice("#*?_")},
        ),
        DocTemplate(
            "rotate_letters",
            ("rotate_letters", "shift_alphabet", "advance_letters"),
            "text: str",
            "str",
            "Move each lowercase ASCII letter of text $k places forward in the alphabet, wrapping from "
            "'z' back to 'a'. Every other character stays unchanged.",
            'return "".join(chr((ord(ch) - 97 + $k) % 26 + 97) if "a" <= ch <= "z" else ch for ch in text)',
            _one(_sentence),
            (("",), ("xyz",), ("Hello, World!",)),
            _k(1, 25),
        ),
        DocTemplate(
            "mirror_text",
            ("reads_same_both_ways", "mirror_text", "symmetric_text"),
            "text: str",
            "bool",
            "Decide whether text reads the same from the left and from the right once everything "
            "except letters and digits is dropped and upper and lower case count as one.",
            """
            kept = [ch.lower() for ch in text if ch.isalnum()]
            return kept == kept[::-1]
            """,
            _one(_palindrome_or_not),
            (("",), ("Step on no pets!",), ("ab",)),
        ),
        DocTemplate(
            "initials",
            ("initials_of", "name_initials", "monogram"),
            "full_name: str",
            "str",
            "Return the first character of every whitespace-separated word of full_name, in upper "
            "case and joined without separators.",
            'return "".join(w[0].upper() for w in full_name.split())',
            _one(_sentence),
            (("",), ("  ada   lovelace ",), ("émile zola",)),
        ),
        DocTemplate(
            "first_repeat",
            ("first_repeated_char", "earliest_duplicate", "first_seen_twice"),
            "text: str",
            "str",
            "Scan text from the left and return the first character that already appeared earlier in "
            "text. Return an empty string if no character appears twice.",
            """
            seen = set()
            for ch in text:
                if ch in seen:
                    return ch
                seen.add(ch)
            return ""
            """,
            _one(lambda r: _mixed(r, 1, 8)),
            (("",), ("abc",), ("a  b",)),
        ),
        DocTemplate(
            "fit_width",
            ("pad_or_cut", "fixed_width", "fit_width"),
            "text: str, width: int",
            "str",
            "Return text cut to its first width characters when it is longer than width, or padded on "
            "the right with $pad up to width characters when it is shorter. A width of 0 or less "
            "gives an empty string.",
            """
            if width <= 0:
                return ""
            return text[:width] + $pad * (width - len(text))
            """,
            lambda r: (_word(r, 1, 9), r.randint(1, 10)),
            (("", 3), ("abc", 0), ("abc", -2)),
            lambda r: {"pad": r.choice(".-*~")},
        ),
        DocTemplate(
            "count_long_words",
            ("count_long_words", "long_word_total", "wordy_count"),
            "sentence: str",
            "int",
            "Count the whitespace-separated words of sentence that have more than $k characters.",
            "return sum(1 for w in sentence.split() if len(w) > $k)",
            _one(_sentence),
            (("",), ("   ",), ("supercalifragilistic",)),
            _k(2, 5),
        ),
        DocTemplate(
            "dedupe_characters",
            ("first_occurrences", "dedupe_characters", "squash_repeats"),
            "text: str",
            "str",
            "Keep only the first occurrence of each character of text, in the order they first "
            "appear, and return the resulting string.",
            """
            seen = set()
            out = []
            for ch in text:
                if ch not in seen:
                    seen.add(ch)
                    out.append(ch)
            return "".join(out)
            """,
            _one(lambda r: _mixed(r, 1, 10)),
            (("",), ("aaaa",), ("ab ba",)),
        ),
        DocTemplate(
            "swap_halves",
            ("swap_halves", "exchange_halves", "rotate_halves"),
            "text: str",
            "str",
            "Cut text into a front half and a back half (the back half gets the extra character when "
            "the length is odd) and return the back half followed by the front half.",
            "mid = len(text) // 2\nreturn text[mid:] + text[:mid]",
            _one(lambda r: _word(r, 1, 9)),
            (("",), ("abc",), ("ab",)),
        ),
        DocTemplate(
            "words_beginning_with",
            ("words_beginning_with", "select_by_first_letter", "pick_words"),
            "sentence: str, letter: str",
            "List[str]",
            "Return, in order, the whitespace-separated words of sentence whose first character is "
            "letter, treating upper and lower case as the same.",
            "return [w for w in sentence.split() if w[0].lower() == letter.lower()]",
            lambda r: (s := _sentence(r), r.choice(s.replace(" ", "")).upper() if r.random() < 0.3 else s[0]),
            (("", "a"), ("Apple avocado Banana", "A"), ("   ", "x")),
        ),
    )


def _lists() -> tuple[DocTemplate, ...]:
    return (
        DocTemplate(
            "total_of_multiples",
            ("sum_of_multiples", "total_divisible", "multiples_total"),
            "values: List[int]",
            "int",
            "Add up the elements of values that are divisible by $k (zero and negative numbers "
            "included) and return the total.",
            "return sum(v for v in values if v % $k == 0)",
            _one(_ints),
            (([],), ([0, -6, 7],), ([5, 5, 5],)),
            _k(2, 7),
        ),
        DocTemplate(
            "running_totals",
            ("running_totals", "cumulative_sums", "prefix_totals"),
            "values: List[int]",
            "List[int]",
            "Return a list whose element at position i is the sum of values[0], values[1], ..., values[i].",
            """
            out = []
            total = 0
            for v in values:
                total += v
                out.append(total)
            return out
            """,
            _one(_ints),
            (([],), ([-1, 1, -1],), ([0],)),
        ),
        DocTemplate(
            "max_minus_min",
            ("spread_of", "max_minus_min", "value_span"),
            "values: List[int]",
            "int",
            "Return the difference between the largest and the smallest element of values, or 0 when "
            "values is empty.",
            "return max(values) - min(values) if values else 0",
            _one(_ints),
            (([],), ([-5],), ([3, 3, 3],)),
        ),
        DocTemplate(
            "count_above_average",
            ("above_mean_count", "count_above_average", "beat_the_mean"),
            "values: List[int]",
            "int",
            "Count the elements of values that are strictly greater than the arithmetic mean of "
            "values. An empty list gives 0.",
            "return sum(1 for v in values if v * len(values) > sum(values))",
            _one(_ints),
            (([],), ([2, 2, 2],), ([-3, -1],)),
        ),
        DocTemplate(
            "chunk_list",
            ("chunk_list", "split_into_groups", "batch_up"),
            "values: List[int]",
            "List[List[int]]",
            "Cut values into consecutive groups of $k elements, in order; the last group holds "
            "whatever is left and may be shorter. An empty list gives an empty list.",
            "return [values[i:i + $k] for i in range(0, len(values), $k)]",
            _one(_ints),
            (([],), ([1],), ([9, 8, 7, 6],)),
            _k(2, 4),
        ),
        DocTemplate(
            "turn_list",
            ("rotate_left", "turn_list", "cycle_front_to_back"),
            "values: List[int], steps: int",
            "List[int]",
            "Move the first element of values to the end, steps times over, and return the resulting "
            "list (steps may be larger than the length). An empty list stays empty.",
            """
            if not values:
                return []
            s = steps % len(values)
            return values[s:] + values[:s]
            """,
            lambda r: (_ints(r), r.randint(0, 9)),
            (([], 3), ([1, 2], 0), ([4, 5, 6], 7)),
        ),
        DocTemplate(
            "step_differences",
            ("step_differences", "gaps_between", "neighbour_deltas"),
            "values: List[int]",
            "List[int]",
            "Return the list of differences values[i + 1] - values[i] for each pair of neighbouring "
            "elements. Lists of fewer than two elements give an empty list.",
            "return [b - a for a, b in zip(values, values[1:])]",
            _one(_ints),
            (([],), ([7],), ([3, -3, 3],)),
        ),
        DocTemplate(
            "find_negative",
            ("index_of_first_negative", "find_negative", "first_below_zero"),
            "values: List[int]",
            "int",
            "Return the position of the first element of values that is below zero, or -1 if no element is.",
            """
            for i, v in enumerate(values):
                if v < 0:
                    return i
            return -1
            """,
            _one(_ints),
            (([],), ([0, 0],), ([-1],)),
        ),
        DocTemplate(
            "longest_rising_run",
            ("longest_increasing_streak", "longest_rising_run", "best_climb"),
            "values: List[int]",
            "int",
            "Return the length of the longest stretch of consecutive elements of values in which "
            "every element is strictly larger than the one before it. An empty list gives 0.",
            """
            best = run = 0
            for i, v in enumerate(values):
                run = run + 1 if i and v > values[i - 1] else 1
                best = max(best, run)
            return best
            """,
            _one(_ints),
            (([],), ([5, 5, 5],), ([3, 2, 1],)),
        ),
        DocTemplate(
            "drop_repeats",
            ("keep_first_occurrences", "drop_repeats", "dedupe_in_order"),
            "values: List[int]",
            "List[int]",
            "Return values without the elements that already appeared earlier in the list: the first "
            "copy of each value stays where it was.",
            """
            seen = set()
            out = []
            for v in values:
                if v not in seen:
                    seen.add(v)
                    out.append(v)
            return out
            """,
            _one(lambda r: _ints(r, -3, 6, (1, 9))),
            (([],), ([2, 2, 2],), ([-1, 1, -1, 1],)),
        ),
        DocTemplate(
            "count_target_pairs",
            ("pairs_adding_to", "count_target_pairs", "matching_pair_count"),
            "values: List[int]",
            "int",
            "Count the pairs of positions i < j for which values[i] + values[j] equals $k.",
            "return sum(1 for i in range(len(values)) for j in range(i + 1, len(values)) if values[i] + values[j] == $k)",
            _one(lambda r: _ints(r, -5, 15, (2, 8))),
            (([],), ([1],), ([0, 0, 0],)),
            _k(-3, 12),
        ),
        DocTemplate(
            "clamp_values",
            ("clamp_values", "limit_to_range", "squeeze_into"),
            "values: List[int], low: int, high: int",
            "List[int]",
            "Return a new list in which each element of values below low is replaced by low and each "
            "element above high by high; low is never greater than high.",
            "return [min(max(v, low), high) for v in values]",
            _clamp_args,
            (([], 0, 1), ([5, -5], 0, 0), ([1, 2, 3], -10, 10)),
        ),
        DocTemplate(
            "zip_merge",
            ("zip_merge", "weave_lists", "alternate_merge"),
            "first: List[int], second: List[int]",
            "List[int]",
            "Merge the two lists by taking one element of first, then one of second, and so on; when "
            "one list runs out, the rest of the other is appended.",
            """
            out = []
            for i in range(max(len(first), len(second))):
                if i < len(first):
                    out.append(first[i])
                if i < len(second):
                    out.append(second[i])
            return out
            """,
            lambda r: (_ints(r, -9, 20, (0, 5)), _ints(r, -9, 20, (0, 5))),
            (([], []), ([1, 2, 3], []), ([], [4])),
        ),
        DocTemplate(
            "most_frequent",
            ("most_frequent", "mode_value", "commonest"),
            "values: List[int]",
            "Optional[int]",
            "Return the element that occurs most often in values; on a tie, the smallest of the tied "
            "elements. Return None for an empty list.",
            """
            if not values:
                return None
            return min(values, key=lambda v: (-values.count(v), v))
            """,
            _one(lambda r: _ints(r, -4, 6, (1, 9))),
            (([],), ([4, -4],), ([7, 7, 1, 1, 1],)),
        ),
        DocTemplate(
            "nonzero_product",
            ("nonzero_product", "multiply_nonzero", "product_skipping_zeros"),
            "values: List[int]",
            "int",
            "Multiply together the elements of values that are not zero. With no such elements the "
            "result is 1.",
            """
            out = 1
            for v in values:
                if v:
                    out *= v
            return out
            """,
            _one(lambda r: _ints(r, -6, 6, (1, 6))),
            (([],), ([0, 0],), ([-2, 0, -3],)),
        ),
        DocTemplate(
            "split_by_parity",
            ("evens_and_odds", "partition_parity", "split_by_parity"),
            "values: List[int]",
            "Tuple[List[int], List[int]]",
            "Return a tuple of two lists: the even elements of values, then the odd ones, each in "
            "their original order.",
            "return ([v for v in values if v % 2 == 0], [v for v in values if v % 2])",
            _one(_ints),
            (([],), ([-3, -2],), ([0],)),
        ),
        DocTemplate(
            "digit_sum_each",
            ("digit_sum_each", "digit_totals", "sum_digits_of_each"),
            "values: List[int]",
            "List[int]",
            "For each integer in values give the sum of the decimal digits of its absolute value, as "
            "a list in the same order.",
            "return [sum(int(d) for d in str(abs(v))) for v in values]",
            _one(lambda r: _ints(r, -999, 999)),
            (([],), ([-909],), ([0, 10],)),
        ),
        DocTemplate(
            "flatten_once",
            ("flatten_once", "join_sublists", "concat_groups"),
            "groups: List[List[int]]",
            "List[int]",
            "Concatenate the inner lists of groups, in order, into one flat list.",
            "return [v for group in groups for v in group]",
            _one(lambda r: [_ints(r, -9, 20, (0, 3)) for _ in range(r.randint(1, 4))]),
            (([],), ([[], []],), ([[1], [], [2, 2]],)),
        ),
        DocTemplate(
            "positions_of_maximum",
            ("positions_of_maximum", "argmax_all", "where_largest"),
            "values: List[int]",
            "List[int]",
            "Return the list of every position at which values holds its largest element, in "
            "ascending order. An empty list gives an empty list.",
            "return [i for i, v in enumerate(values) if v == max(values)]",
            _one(lambda r: _ints(r, -3, 5)),
            (([],), ([-2, -2],), ([0, 5, 5, 1],)),
        ),
        DocTemplate(
            "window_totals",
            ("window_totals", "sliding_sums", "block_sums"),
            "values: List[int]",
            "List[int]",
            "Return the sums of every run of $k consecutive elements of values, from left to right. A "
            "list shorter than $k gives an empty list.",
            "return [sum(values[i:i + $k]) for i in range(len(values) - $k + 1)]",
            _one(_ints),
            (([],), ([1],), ([-1, -1, -1, -1],)),
            _k(2, 4),
        ),
    )


def _dicts() -> tuple[DocTemplate, ...]:
    return (
        DocTemplate(
            "invert_mapping",
            ("invert_mapping", "group_keys_by_value", "reverse_lookup"),
            "mapping: Dict[str, int]",
            "Dict[int, List[str]]",
            "Return a dictionary that maps each value of mapping to the sorted list of the keys that "
            "have that value.",
            """
            out = {}
            for key in sorted(mapping):
                out.setdefault(mapping[key], []).append(key)
            return out
            """,
            _one(lambda r: _scores(r, 0, 3)),
            (({},), ({"a": 1, "b": 1},), ({"x": -1},)),
        ),
        DocTemplate(
            "keys_over_threshold",
            ("keys_over_threshold", "high_scorers", "keys_beating"),
            "scores: Dict[str, int]",
            "List[str]",
            "Return, sorted alphabetically, the keys of scores whose value is greater than $k.",
            "return sorted(key for key, value in scores.items() if value > $k)",
            _one(_scores),
            (({},), ({"b": 100, "a": 100},), ({"z": -100},)),
            _k(0, 12),
        ),
        DocTemplate(
            "merge_counts",
            ("merge_counts", "combine_tallies", "add_counters"),
            "first: Dict[str, int], second: Dict[str, int]",
            "Dict[str, int]",
            "Combine two dictionaries of counts: every key of either one appears in the result, mapped "
            "to the sum of its counts in both (a key that is missing counts as 0).",
            """
            out = dict(first)
            for key, value in second.items():
                out[key] = out.get(key, 0) + value
            return out
            """,
            lambda r: (_scores(r, 0, 9), _scores(r, 0, 9)),
            (({}, {}), ({"a": 1}, {}), ({"a": -1}, {"a": 1})),
        ),
        DocTemplate(
            "length_by_word",
            ("length_by_word", "word_length_map", "measure_words"),
            "sentence: str",
            "Dict[str, int]",
            "Map each distinct whitespace-separated word of sentence to its number of characters.",
            "return {w: len(w) for w in sentence.split()}",
            _one(_sentence),
            (("",), ("a a a",), ("naïve  café",)),
        ),
        DocTemplate(
            "group_by_first_letter",
            ("group_by_first_letter", "bucket_words", "index_by_initial"),
            "words: List[str]",
            "Dict[str, List[str]]",
            "Group the non-empty strings of words by their first character in lower case: the result "
            "maps that character to the words that start with it, in their original order. Empty "
            "strings are skipped.",
            """
            out = {}
            for w in words:
                if w:
                    out.setdefault(w[0].lower(), []).append(w)
            return out
            """,
            _one(lambda r: [w.capitalize() if r.random() < 0.3 else w for w in _words(r, 1, 6)]),
            (([],), (["", "A", "a"],), (["Éa", "éb"],)),
        ),
        DocTemplate(
            "basket_total",
            ("basket_total", "bill_for", "checkout_sum"),
            "prices: Dict[str, int], items: List[str]",
            "int",
            "Add up the price of each entry of items, looking it up in prices; an item missing from "
            "prices costs 0. Items may repeat.",
            "return sum(prices.get(item, 0) for item in items)",
            lambda r: (p := _scores(r, 1, 9), [r.choice([*p, _word(r)]) for _ in range(r.randint(1, 5))]),
            (({}, []), ({"tea": 3}, ["tea", "tea"]), ({"a": 1}, ["b"])),
        ),
        DocTemplate(
            "key_of_largest",
            ("best_key", "key_of_largest", "winning_entry"),
            "scores: Dict[str, int]",
            "Optional[str]",
            "Return the key of scores with the largest value; on a tie, the alphabetically first of "
            "those keys. Return None for an empty dictionary.",
            """
            if not scores:
                return None
            return min(scores, key=lambda key: (-scores[key], key))
            """,
            _one(lambda r: _scores(r, 0, 4)),
            (({},), ({"b": 2, "a": 2},), ({"q": -5},)),
        ),
    )


def _numbers() -> tuple[DocTemplate, ...]:
    return (
        DocTemplate(
            "digit_occurrences",
            ("digit_occurrences", "how_often_digit", "tally_digit"),
            "n: int",
            "int",
            "Count how many times the digit $k appears when the absolute value of n is written in decimal.",
            "return str(abs(n)).count(str($k))",
            _one(lambda r: r.randint(-(10**6), 10**6)),
            ((0,), (-10101,), (9999,)),
            _k(0, 9),
        ),
        DocTemplate(
            "is_perfect_square",
            ("is_perfect_square", "is_square_number", "square_check"),
            "n: int",
            "bool",
            "Decide whether n equals k * k for some integer k. Negative numbers never do.",
            """
            import math
            return n >= 0 and math.isqrt(n) ** 2 == n
            """,
            _square_or_not,
            ((0,), (-4,), (2,)),
        ),
        DocTemplate(
            "collatz_length",
            ("collatz_length", "steps_to_one", "hailstone_steps"),
            "n: int",
            "int",
            "Starting from the positive integer n, repeatedly halve the number when it is even or "
            "replace it with 3 * n + 1 when it is odd. Return how many steps it takes to reach 1 "
            "(0 when n is 1).",
            """
            steps = 0
            while n != 1:
                n = n // 2 if n % 2 == 0 else 3 * n + 1
                steps += 1
            return steps
            """,
            _one(lambda r: r.randint(1, 200)),
            ((1,), (2,), (27,)),
        ),
        DocTemplate(
            "least_common_multiple",
            ("least_common_multiple", "smallest_shared_multiple", "lcm_of"),
            "a: int, b: int",
            "int",
            "Return the smallest positive integer that is a multiple of both positive integers a and b.",
            """
            import math
            return a * b // math.gcd(a, b)
            """,
            lambda r: (r.randint(1, 30), r.randint(1, 30)),
            ((1, 1), (6, 6), (7, 13)),
        ),
        DocTemplate(
            "aliquot_sum",
            ("sum_proper_divisors", "aliquot_sum", "divisor_total"),
            "n: int",
            "int",
            "Return the sum of the positive divisors of the positive integer n that are smaller than n "
            "itself (0 for n = 1).",
            "return sum(d for d in range(1, n) if n % d == 0)",
            _one(lambda r: r.randint(1, 300)),
            ((1,), (6,), (13,)),
        ),
        DocTemplate(
            "count_one_bits",
            ("count_one_bits", "popcount", "binary_ones"),
            "n: int",
            "int",
            "Return how many times the digit 1 appears in the base 2 representation of the "
            "non-negative integer n.",
            'return bin(n).count("1")',
            _one(lambda r: r.randint(0, 5000)),
            ((0,), (255,), (1024,)),
        ),
        DocTemplate(
            "round_to_multiple",
            ("round_to_multiple", "nearest_multiple", "snap_to_grid"),
            "n: int",
            "int",
            "Round the integer n to the nearest multiple of $k; when n lies exactly halfway between "
            "two multiples, take the larger one.",
            "return (n + $k // 2) // $k * $k",
            _one(lambda r: r.randint(-100, 100)),
            ((0,), (-1,), (1000,)),
            _k(3, 10),
        ),
        DocTemplate(
            "sum_of_range",
            ("sum_of_range", "total_between", "inclusive_sum"),
            "a: int, b: int",
            "int",
            "Return the sum of all integers from the smaller of a and b up to the larger one, both "
            "ends included.",
            """
            low, high = min(a, b), max(a, b)
            return (low + high) * (high - low + 1) // 2
            """,
            lambda r: (r.randint(-20, 40), r.randint(-20, 40)),
            ((0, 0), (5, -5), (-3, -1)),
        ),
        DocTemplate(
            "mean_value",
            ("mean_value", "average_of", "arithmetic_mean"),
            "values: List[float]",
            "float",
            "Return the arithmetic mean of values, or 0.0 when values is empty.",
            "return sum(values) / len(values) if values else 0.0",
            _one(_floats),
            (([],), ([-1.5, 1.5],), ([2.0],)),
            close=True,
        ),
        DocTemplate(
            "is_leap_year",
            ("is_leap_year", "leap_year", "has_february_29"),
            "year: int",
            "bool",
            "Decide whether year is a leap year of the Gregorian calendar: a multiple of 4, except the "
            "multiples of 100 that are not multiples of 400.",
            "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
            _one(lambda r: r.choice([r.randint(1, 2400), 4 * r.randint(1, 600)])),
            ((1900,), (2000,), (2023,)),
        ),
        DocTemplate(
            "reverse_digits",
            ("reverse_digits", "mirror_number", "backwards_number"),
            "n: int",
            "int",
            "Return the integer whose decimal digits are those of n in reverse order, keeping the sign "
            "of n (leading zeros of the result disappear).",
            """
            sign = -1 if n < 0 else 1
            return sign * int(str(abs(n))[::-1])
            """,
            _one(lambda r: r.randint(-(10**5), 10**5)),
            ((0,), (-120,), (7,)),
        ),
        DocTemplate(
            "label_number",
            ("label_number", "number_to_word", "tag_multiples"),
            "n: int",
            "str",
            "Return $wa if n is a multiple of $a, $wb if n is a multiple of $b, both words joined "
            "($wa first) if n is a multiple of both, and otherwise n written as a decimal string.",
            """
            word = ($wa if n % $a == 0 else "") + ($wb if n % $b == 0 else "")
            return word or str(n)
            """,
            _one(lambda r: r.randint(-30, 60)),
            ((0,), (-1,), (1,)),
            _label_constants,
        ),
    )


DOCSTRING_TEMPLATES: dict[str, DocTemplate] = {
    t.key: t for t in (*_strings(), *_lists(), *_dicts(), *_numbers())
}
HELDOUT_TEMPLATES = frozenset(
    {
        "encode_runs",
        "mirror_text",
        "fit_width",
        "longest_rising_run",
        "zip_merge",
        "window_totals",
        "merge_counts",
        "key_of_largest",
        "collatz_length",
        "label_number",
    }
)


# ----------------------------------------------------------------------------- tasks
def templates_of(split: str | None) -> list[DocTemplate]:
    """The templates a split draws from: "train", "heldout" (`HELDOUT_TEMPLATES`) or None (all)."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown docstring split {split!r}; use one of {SPLITS} or None")
    return [
        t
        for t in DOCSTRING_TEMPLATES.values()
        if split is None or (t.key in HELDOUT_TEMPLATES) == (split == "heldout")
    ]


def _substitute(text: str, constants: dict[str, Any]) -> str:
    return string.Template(text).substitute({k: repr(v) for k, v in constants.items()})


def _signature_imports(template: DocTemplate) -> str:
    names = sorted(set(re.findall(r"\b(Dict|List|Optional|Tuple)\b", template.signature + template.returns)))
    return f"from typing import {', '.join(names)}\n\n\n" if names else "\n\n"


def _call(name: str, args: Args) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def docstring_prompt(
    template: DocTemplate, name: str, constants: dict[str, Any], examples: list[tuple[Args, Any]]
) -> str:
    """The HumanEval-shaped prompt: typing imports, the signature, the docstring with its examples."""
    doc = textwrap.fill(
        _substitute(template.doc, constants), width=92, break_long_words=False, break_on_hyphens=False
    )
    lines = [f"def {name}({template.signature}) -> {template.returns}:"]
    lines += ['    """' + textwrap.indent(doc, "    ").lstrip()]
    for args, expected in examples:
        lines += [f"    >>> {_call(name, args)}", f"    {expected!r}"]
    return _signature_imports(template) + "\n".join(lines) + '\n    """\n'


def reference_body(template: DocTemplate, constants: dict[str, Any]) -> str:
    """The template's reference body for these constants, indented to continue the prompt."""
    return textwrap.indent(textwrap.dedent(_substitute(template.body, constants)).strip() + "\n", "    ")


@functools.lru_cache(maxsize=4096)
def _compiled(source: str, name: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"__name__": "docstring_reference"}
    exec(compile(source, f"<reference {name}>", "exec"), namespace)  # our own template text, not a model's
    return namespace[name]


def reference_function(template: DocTemplate, name: str, constants: dict[str, Any]) -> Callable[..., Any]:
    """The reference solution as a host function (prompt without examples + reference body)."""
    return _compiled(
        docstring_prompt(template, name, constants, []) + reference_body(template, constants), name
    )


def _test(name: str, args: Args, expected: Any, close: bool) -> str:
    if close:
        return f"assert abs({_call(name, args)} - {expected!r}) < {FLOAT_TOL!r}"
    return f"assert {_call(name, args)} == {expected!r}"


def _draw_inputs(template: DocTemplate, rng: random.Random, fn: Callable[..., Any]) -> tuple[list, list]:
    """(examples, hidden): (args, expected) pairs, all inputs distinct; the hidden ones are the edge
    cases and HIDDEN_RANDOM random inputs, redrawn until they hold >= 2 distinct expected values."""
    seen: set[str] = set()

    def fresh(count: int, limit: int = 200) -> list[tuple[Args, Any]]:
        out = []
        for _ in range(limit):
            if len(out) == count:
                break
            args = template.make_args(rng)
            if repr(args) not in seen:
                seen.add(repr(args))
                out.append((args, fn(*copy.deepcopy(args))))
        return out

    examples = fresh(rng.choice(EXAMPLES))
    edges = [(a, fn(*copy.deepcopy(a))) for a in template.edge if repr(a) not in seen]
    seen.update(repr(a) for a, _ in edges)
    for _ in range(50):
        hidden = edges + fresh(HIDDEN_RANDOM)
        if len({repr(v) for _, v in hidden}) >= 2:
            return examples, hidden
        seen.difference_update(repr(a) for a, _ in hidden[len(edges) :])
    raise RuntimeError(f"template {template.key}: hidden tests with one expected value only")


def docstring_task(
    template: DocTemplate, name: str, constants: dict[str, Any], rng: random.Random
) -> dict[str, Any]:
    """One task of `template` for the function `name` with these constants, its inputs drawn from `rng`."""
    examples, hidden = _draw_inputs(template, rng, reference_function(template, name, constants))
    prompt = docstring_prompt(template, name, constants, examples)
    spec = ",".join(f"{k}={v!r}" for k, v in sorted(constants.items()))
    return {
        "messages": [{"role": "user", "content": HUMANEVAL_PROMPT.format(prompt=prompt)}],
        "entry_point": name,
        "tests": [_test(name, a, v, template.close) for a, v in examples + hidden],
        "prelude": prompt,
        "test_setup": "",
        "task_id": f"docstring/{template.key}/{name}" + (f"/{spec}" if spec else ""),
    }


def generate_docstring_tasks(count: int, seed: int, split: str | None = None) -> list[dict[str, Any]]:
    """`count` HumanEval-shaped tasks drawn from `seed` (offline) from the templates of `split`
    ("train", "heldout" or None: all)."""
    rng = random.Random(seed)
    templates = templates_of(split)
    tasks = []
    for _ in range(count):
        template = rng.choice(templates)
        tasks.append(docstring_task(template, rng.choice(template.names), template.constants(rng), rng))
    return tasks
