"""Docstring templates over strings and dicts (`code_docstring.DOCSTRING_TEMPLATES`)."""

from __future__ import annotations

from posttrain.environments.code_docstring_inputs import (
    DocTemplate,
    constants_between,
    draw_anagram_pair,
    draw_mixed,
    draw_palindrome_or_not,
    draw_runs,
    draw_scores,
    draw_sentence,
    draw_word,
    draw_words,
    one_argument,
)


def string_templates() -> tuple[DocTemplate, ...]:
    return (
        DocTemplate(
            "count_capitals",
            ("count_capitals", "uppercase_total", "num_capital_letters"),
            "text: str",
            "int",
            "Count how many characters of text are upper case letters. Letters of every alphabet count; "
            "digits, spaces and punctuation do not.",
            "return sum(1 for ch in text if ch.isupper())",
            one_argument(draw_mixed),
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
            one_argument(draw_sentence),
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
            one_argument(draw_sentence),
            (("",), ("a  b",), ("élan vital",)),
        ),
        DocTemplate(
            "drop_character",
            ("drop_character", "without_char", "erase_symbol"),
            "text: str, ch: str",
            "str",
            "Return text with every occurrence of the single character ch taken out.",
            'return text.replace(ch, "")',
            lambda r: (t := draw_sentence(r), r.choice(t)),
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
            one_argument(draw_runs),
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
            draw_anagram_pair,
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
            one_argument(draw_sentence),
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
            one_argument(lambda r: draw_mixed(r, 1, 8)),
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
                s := draw_sentence(r) + " " + r.choice(["go", "Go", "GO"]) * r.randint(0, 1),
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
            one_argument(draw_mixed),
            (("",), ("ab cd",), ("éa",)),
        ),
        DocTemplate(
            "mask_digits",
            ("mask_digits", "hide_digits", "blank_out_numbers"),
            "text: str",
            "str",
            "Replace every decimal digit 0-9 in text with the character $mark and return the result.",
            'return "".join($mark if ch in "0123456789" else ch for ch in text)',
            one_argument(draw_mixed),
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
            one_argument(draw_sentence),
            (("",), ("xyz",), ("Hello, World!",)),
            constants_between(1, 25),
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
            one_argument(draw_palindrome_or_not),
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
            one_argument(draw_sentence),
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
            one_argument(lambda r: draw_mixed(r, 1, 8)),
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
            lambda r: (draw_word(r, 1, 9), r.randint(1, 10)),
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
            one_argument(draw_sentence),
            (("",), ("   ",), ("supercalifragilistic",)),
            constants_between(2, 5),
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
            one_argument(lambda r: draw_mixed(r, 1, 10)),
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
            one_argument(lambda r: draw_word(r, 1, 9)),
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
            lambda r: (
                s := draw_sentence(r),
                r.choice(s.replace(" ", "")).upper() if r.random() < 0.3 else s[0],
            ),
            (("", "a"), ("Apple avocado Banana", "A"), ("   ", "x")),
        ),
    )


def dict_templates() -> tuple[DocTemplate, ...]:
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
            one_argument(lambda r: draw_scores(r, 0, 3)),
            (({},), ({"a": 1, "b": 1},), ({"x": -1},)),
        ),
        DocTemplate(
            "keys_over_threshold",
            ("keys_over_threshold", "high_scorers", "keys_beating"),
            "scores: Dict[str, int]",
            "List[str]",
            "Return, sorted alphabetically, the keys of scores whose value is greater than $k.",
            "return sorted(key for key, value in scores.items() if value > $k)",
            one_argument(draw_scores),
            (({},), ({"b": 100, "a": 100},), ({"z": -100},)),
            constants_between(0, 12),
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
            lambda r: (draw_scores(r, 0, 9), draw_scores(r, 0, 9)),
            (({}, {}), ({"a": 1}, {}), ({"a": -1}, {"a": 1})),
        ),
        DocTemplate(
            "length_by_word",
            ("length_by_word", "word_length_map", "measure_words"),
            "sentence: str",
            "Dict[str, int]",
            "Map each distinct whitespace-separated word of sentence to its number of characters.",
            "return {w: len(w) for w in sentence.split()}",
            one_argument(draw_sentence),
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
            one_argument(lambda r: [w.capitalize() if r.random() < 0.3 else w for w in draw_words(r, 1, 6)]),
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
            lambda r: (
                p := draw_scores(r, 1, 9),
                [r.choice([*p, draw_word(r)]) for _ in range(r.randint(1, 5))],
            ),
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
            one_argument(lambda r: draw_scores(r, 0, 4)),
            (({},), ({"b": 2, "a": 2},), ({"q": -5},)),
        ),
    )
