"""Partial credit that a trivial reply or a lookup of the prompt's examples cannot earn
(`reward="beyond_trivial"`, issue #32 item 3): the counts worked by hand, without a sandbox."""

from __future__ import annotations

import random

from posttrain.environments.code import CodeEnvironment
from posttrain.environments.code_checks import TRIVIAL_OUTPUTS, host_checks, shown_tests, trivial_passes
from posttrain.environments.code_docstring import DOCSTRING_TEMPLATES, docstring_task


def plan_of(entry: str, tests: list[str]) -> list:
    plan = host_checks({"entry_point": entry, "tests": tests})
    assert plan is not None
    return plan


def test_a_constant_reply_passes_the_tests_whose_answer_it_is() -> None:
    # None passes 1 ([] -> None); 1 passes 1 ([1, 1, 2] -> 1); no argument is returned as is: best 1.
    plan = plan_of(
        "most_frequent",
        [
            "assert most_frequent([1, 1, 2]) == 1",
            "assert most_frequent([]) == None",
            "assert most_frequent([3, 4, 4]) == 4",
        ],
    )
    assert trivial_passes(plan) == 1
    # any constant is a trivial reply: `return 2` passes the two tests that expect 2
    tests = [
        "assert count([1, 1]) == 2",
        "assert count([3, 3]) == 2",
        "assert count([5]) == 1",
        "assert count([]) == 0",
    ]
    assert trivial_passes(plan_of("count", tests)) == 2
    assert trivial_passes(plan_of("count", tests), counted=[False, True, True, True]) == 1


def test_a_yes_no_task_gives_the_majority_answer_for_free() -> None:
    # 3 True, 2 False: the constant True passes 3 (the `is`, plain and `not` shapes alike).
    tests = [
        "assert even(2) == True",
        "assert even(4) is True",
        "assert even(0)",
        "assert not even(1)",
        "assert even(3) == False",
    ]
    assert trivial_passes(plan_of("even", tests)) == 3


def test_returning_an_argument_unchanged_is_trivial() -> None:
    # reverse("aba") == "aba" and reverse("") == "" pass `return s`; "" alone passes 1: best 2.
    tests = ["assert reverse('aba') == 'aba'", "assert reverse('') == ''", "assert reverse('ab') == 'ba'"]
    assert trivial_passes(plan_of("reverse", tests)) == 2
    # `return b` passes the first two, `return xs` the third: each position is its own reply, best 2
    tests = ["assert pick([1, 2], 7) == 7", "assert pick([3], 5) == 5", "assert pick([], 1) == []"]
    assert trivial_passes(plan_of("pick", tests)) == 2


def test_the_prompts_examples_are_the_shown_tests() -> None:
    task = {
        "entry_point": "double",
        "prelude": 'def double(x):\n    """\n    >>> double(2)\n    4\n    >>> double( -1 )\n    -2\n    """\n',
        "tests": ["assert double(2) == 4", "assert double(-1) == -2", "assert double(5) == 10"],
    }
    assert shown_tests(task, plan_of("double", task["tests"])) == [True, True, False]


def test_the_credit_of_a_task_worked_by_hand() -> None:
    """double: 2 shown tests, 3 hidden (0 -> 0 is the constant 0's, and `return x`'s): credited 3,
    trivial 1, so a reply passing p hidden tests (not all) earns max(0, p - 1) / 2."""
    task = {
        "entry_point": "double",
        "prelude": 'def double(x):\n    """\n    >>> double(2)\n    4\n    >>> double(-1)\n    -2\n    """\n',
        "tests": [
            "assert double(2) == 4",
            "assert double(-1) == -2",
            "assert double(0) == 0",
            "assert double(5) == 10",
            "assert double(7) == 14",
        ],
    }
    env = CodeEnvironment(reward="beyond_trivial")
    credit = env._credit(task, host_checks(task))
    assert credit == {"credited_tests": [False, False, True, True, True], "trivial_passes": 1}
    info = {"tests_total": 5, "status": "ok", **credit}
    score = lambda passed: env._score(dict(info), passed, "")[0]  # noqa: E731
    assert score([True, True, True, False, False]) == 0.0  # the examples and 0: a lookup and a constant
    assert score([True, True, True, True, False]) == 0.5
    assert score([False, False, True, True, True]) == 1.0  # every credited test, examples failed
    assert score([True] * 5) == 1.0
    assert (
        CodeEnvironment(reward="fraction")._score(
            {"tests_total": 5, "status": "ok", "credited_tests": [True] * 5, "trivial_passes": 0},
            [True, True, True, False, False],
            "",
        )[0]
        == 0.6
    )


def test_every_docstring_template_leaves_credit_that_only_doing_the_task_earns() -> None:
    """On every template (two seeds): at least one hidden test no trivial reply passes, and every
    trivial output is a plain value the sandbox's encoding carries (so the host's count is what such
    a reply would score)."""
    for template in DOCSTRING_TEMPLATES.values():
        for seed in (0, 1):
            rng = random.Random(seed)
            task = docstring_task(template, template.names[0], template.constants(rng), rng)
            plan = host_checks(task)
            credit = CodeEnvironment(reward="beyond_trivial")._credit(task, plan)
            assert sum(credit["credited_tests"]) - credit["trivial_passes"] >= 1, task["task_id"]
            assert sum(shown_tests(task, plan)) >= 1, task["task_id"]
    assert all(type(v) in (type(None), bool, int, str, list, tuple, dict, set) for v in TRIVIAL_OUTPUTS)
