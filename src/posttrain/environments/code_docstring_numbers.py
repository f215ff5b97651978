"""Docstring templates over lists and numbers (`code_docstring.DOCSTRING_TEMPLATES`)."""

from __future__ import annotations

from posttrain.environments.code_docstring_inputs import (
    DocTemplate,
    constants_between,
    draw_clamp_args,
    draw_floats,
    draw_ints,
    draw_label_constants,
    draw_square_or_not,
    one_argument,
)


def list_templates() -> tuple[DocTemplate, ...]:
    return (
        DocTemplate(
            "total_of_multiples",
            ("sum_of_multiples", "total_divisible", "multiples_total"),
            "values: List[int]",
            "int",
            "Add up the elements of values that are divisible by $k (zero and negative numbers "
            "included) and return the total.",
            "return sum(v for v in values if v % $k == 0)",
            one_argument(draw_ints),
            (([],), ([0, -6, 7],), ([5, 5, 5],)),
            constants_between(2, 7),
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
            one_argument(draw_ints),
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
            one_argument(draw_ints),
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
            one_argument(draw_ints),
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
            one_argument(draw_ints),
            (([],), ([1],), ([9, 8, 7, 6],)),
            constants_between(2, 4),
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
            lambda r: (draw_ints(r), r.randint(0, 9)),
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
            one_argument(draw_ints),
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
            one_argument(draw_ints),
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
            one_argument(draw_ints),
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
            one_argument(lambda r: draw_ints(r, -3, 6, (1, 9))),
            (([],), ([2, 2, 2],), ([-1, 1, -1, 1],)),
        ),
        DocTemplate(
            "count_target_pairs",
            ("pairs_adding_to", "count_target_pairs", "matching_pair_count"),
            "values: List[int]",
            "int",
            "Count the pairs of positions i < j for which values[i] + values[j] equals $k.",
            "return sum(1 for i in range(len(values)) for j in range(i + 1, len(values)) if values[i] + values[j] == $k)",
            one_argument(lambda r: draw_ints(r, -5, 15, (2, 8))),
            (([],), ([1],), ([0, 0, 0],)),
            constants_between(-3, 12),
        ),
        DocTemplate(
            "clamp_values",
            ("clamp_values", "limit_to_range", "squeeze_into"),
            "values: List[int], low: int, high: int",
            "List[int]",
            "Return a new list in which each element of values below low is replaced by low and each "
            "element above high by high; low is never greater than high.",
            "return [min(max(v, low), high) for v in values]",
            draw_clamp_args,
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
            lambda r: (draw_ints(r, -9, 20, (0, 5)), draw_ints(r, -9, 20, (0, 5))),
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
            one_argument(lambda r: draw_ints(r, -4, 6, (1, 9))),
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
            one_argument(lambda r: draw_ints(r, -6, 6, (1, 6))),
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
            one_argument(draw_ints),
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
            one_argument(lambda r: draw_ints(r, -999, 999)),
            (([],), ([-909],), ([0, 10],)),
        ),
        DocTemplate(
            "flatten_once",
            ("flatten_once", "join_sublists", "concat_groups"),
            "groups: List[List[int]]",
            "List[int]",
            "Concatenate the inner lists of groups, in order, into one flat list.",
            "return [v for group in groups for v in group]",
            one_argument(lambda r: [draw_ints(r, -9, 20, (0, 3)) for _ in range(r.randint(1, 4))]),
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
            one_argument(lambda r: draw_ints(r, -3, 5)),
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
            one_argument(draw_ints),
            (([],), ([1],), ([-1, -1, -1, -1],)),
            constants_between(2, 4),
        ),
    )


def number_templates() -> tuple[DocTemplate, ...]:
    return (
        DocTemplate(
            "digit_occurrences",
            ("digit_occurrences", "how_often_digit", "tally_digit"),
            "n: int",
            "int",
            "Count how many times the digit $k appears when the absolute value of n is written in decimal.",
            "return str(abs(n)).count(str($k))",
            one_argument(lambda r: r.randint(-(10**6), 10**6)),
            ((0,), (-10101,), (9999,)),
            constants_between(0, 9),
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
            draw_square_or_not,
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
            one_argument(lambda r: r.randint(1, 200)),
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
            one_argument(lambda r: r.randint(1, 300)),
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
            one_argument(lambda r: r.randint(0, 5000)),
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
            one_argument(lambda r: r.randint(-100, 100)),
            ((0,), (-1,), (1000,)),
            constants_between(3, 10),
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
            one_argument(draw_floats),
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
            one_argument(lambda r: r.choice([r.randint(1, 2400), 4 * r.randint(1, 600)])),
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
            one_argument(lambda r: r.randint(-(10**5), 10**5)),
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
            one_argument(lambda r: r.randint(-30, 60)),
            ((0,), (-1,), (1,)),
            draw_label_constants,
        ),
    )
