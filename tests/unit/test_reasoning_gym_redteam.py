"""reasoning-gym: no reward path pays more than answering right at once (issue #29 item 3), and the
red-team set: replies that must score 0, or the scorer's documented partial credit."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from posttrain.environments.reasoning_gym_env import ReasoningGymEnvironment

# "Calculate 5 - 3." (seed 1, size 3, entry 0 of this config): the answer is "2"
ARITH = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
         "allow_negation": False}  # fmt: skip
TASK = {"seed": 1, "size": 3, "index": 0}

# basic_arithmetic's scorer: 1 for the exact answer, len(answer) / len(reply) when the answer is a
# substring of the reply, else 0. Hand-worked: "02" -> 1/2, "2 or 3" -> 1/6.
REPLIES = {
    "right": ("\\boxed{2}", 1.0),
    "half": ("\\boxed{02}", 0.5),
    "partial": ("\\boxed{2 or 3}", 1 / 6),
    "wrong": ("\\boxed{7}", 0.0),
    "none": ("I do not know.", 0.0),
}


def make_env(max_tries: int, s: float, d: float, f: float) -> ReasoningGymEnvironment:
    return ReasoningGymEnvironment(
        "basic_arithmetic", dataset_config=ARITH, answer_format="boxed", max_tries=max_tries,
        success_threshold=s, retry_discount=d, format_reward=f, timeout_s=None,
    )  # fmt: skip


def paths(env: ReasoningGymEnvironment) -> list[tuple[list[str], float]]:
    """Every episode the replies in REPLIES can make (each try any of them, until the episode ends):
    (the names of its replies, its total reward), stepping the real environment."""
    [start] = env.reset([TASK], [0])
    out: list[tuple[list[str], float]] = []

    def walk(log: list[dict[str, Any]], meta: dict[str, Any], names: list[str], total: float) -> None:
        for name, (reply, _) in REPLIES.items():
            here = [*log, {"role": "assistant", "content": reply}]
            result = env.step([here], [meta])
            if result.done[0]:
                out.append(([*names, name], total + result.rewards[0]))
            else:
                walk(
                    [*here, result.observations[0]],
                    result.metadata[0],
                    [*names, name],
                    total + result.rewards[0],
                )

    walk(list(start.messages), start.metadata, [], 0.0)
    return out


def test_the_issues_example_is_rejected() -> None:
    # format reward on the first try + the full score on the retry: right first 1.0, wrong then right 1.1
    with pytest.raises(ValueError, match=r"format_reward <= success_threshold \* \(1 - retry_discount\) = 0"):
        make_env(2, 1.0, 1.0, 0.1)
    with pytest.raises(ValueError, match="retry_discount must be in"):
        make_env(2, 1.0, 1.5, 0.0)
    with pytest.raises(ValueError, match="retry_discount must be in"):
        make_env(2, 1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="success_threshold must be in"):
        make_env(1, 1.5, 1.0, 0.0)
    # one try: no retry to pay, any format reward below the threshold is fine
    make_env(1, 1.0, 1.0, 0.5).close()
    make_env(2, 1.0, 0.9, 0.1).close()  # 0.1 == 1 * (1 - 0.9) in decimal: accepted


def test_no_path_pays_more_than_answering_right_at_once() -> None:
    """Every path (right, half-right, partial, wrong-but-answered, no answer on each try) for each
    knob setting: the settings the environment accepts pay no path more than its final answer given
    at once (or, never right, more than the threshold); each one it rejects has a path that does."""
    scores = {tuple(names): total for names, total in paths(make_env(1, 1.0, 1.0, 0.0))}
    assert scores == {(name,): score for name, (_, score) in REPLIES.items()}  # the scorer's own values
    accepted = rejected = 0
    for tries, s, d, f in itertools.product(
        (1, 2, 3), (1.0, 0.5), (1.0, 0.75, 0.5, 0.25), (0.0, 0.125, 0.25, 0.4)
    ):
        if f >= s:
            continue
        try:
            env = make_env(tries, s, d, f)
        except ValueError:
            rejected += 1
            assert tries > 1 and f > s * (1 - d)
            # a rejected setting is unsafe: a wrong answer then one scoring exactly s pays more than s
            env = make_env(tries, s, d, 0.0)
            env.format_reward = f
            at_threshold = "right" if s == 1.0 else "half"
            totals = {tuple(names): total for names, total in paths(env)}
            assert totals[("wrong", at_threshold)] > s
            continue
        accepted += 1
        for names, total in paths(env):
            final = REPLIES[names[-1]][1]
            bound = final if final >= s else s  # its final answer at once, or the least right answer
            assert total <= bound, (tries, s, d, f, names, total)
            if len(names) == 1 and final >= s:
                assert total == final  # right at once pays its full score
    # hand-counted: 96 settings; with tries > 1, f > s(1 - d) for 4 (s = 1) + 7 (s = 0.5) of the 16 (d, f)
    assert accepted == 74 and rejected == 22


# Red team: "Calculate 5 - 3." (answer 2), one try, format_reward 0.1 for a found but wrong answer.
# reply -> reward. basic_arithmetic's own partial credit (answer a substring of the reply) is the
# task's documented scoring: "2 or 3" gets len("2") / len("2 or 3") = 1/6.
BOXED_RED_TEAM = {
    "\\boxed{5 - 3}": 0.0,  # boxing the question's expression (the format reward before)
    "\\boxed{Calculate 5 - 3.}": 0.0,
    "\\boxed{answer here}": 0.0,  # the system prompt's placeholder (the format reward before)
    "\\boxed{your answer}": 0.0,
    "\\boxed{answer}": 0.0,
    "\\boxed{3} then \\boxed{2}": 0.0,  # boxes with different answers (1.0 before)
    "\\boxed{2} \\boxed{3}": 0.0,
    "<think>It is \\boxed{2}.</think> No idea.": 0.0,  # only in the reasoning (1.0 before)
    "<think>It is \\boxed{2}.": 0.0,
    "\\boxed{}": 0.0,
    "\\boxed{2": 0.0,
    "The answer is 2.": 0.0,  # unboxed where the box is required
    "\\boxed{2 or 3}": 1 / 6,  # the scorer's partial credit
    "\\boxed{1e999}": 0.1,  # a found, wrong answer: the documented format reward
    "\\boxed{7}": 0.1,
    # controls
    "\\boxed{2}": 1.0,
    "5 - 3 = 2, so \\boxed{2}": 1.0,
    "<think>5 - 3 = \\boxed{3}? no.</think> \\boxed{2}": 1.0,
    "\\boxed{2}, again: \\boxed{ 2 }": 1.0,
}
TAG_RED_TEAM = {
    "<answer>answer here</answer>": 0.0,  # reasoning-gym's own system prompt's placeholder
    "<answer>5 - 3</answer>": 0.0,
    "<answer>3</answer><answer>2</answer>": 0.0,
    "<think><answer>2</answer></think>": 0.0,
    "2": 0.0,
    "<answer>2</answer>": 1.0,
    "<think>maybe <answer>3</answer></think><answer>2</answer>": 1.0,
}


@pytest.mark.parametrize(
    ("answer_format", "replies"), [("boxed", BOXED_RED_TEAM), ("answer_tag", TAG_RED_TEAM)]
)
def test_red_team(answer_format: str, replies: dict[str, float]) -> None:
    env = ReasoningGymEnvironment(
        "basic_arithmetic",
        dataset_config=ARITH,
        answer_format=answer_format,
        format_reward=0.1,
        timeout_s=None,
    )
    [start] = env.reset([TASK], [0])
    logs = [[*start.messages, {"role": "assistant", "content": r}] for r in replies]
    result = env.step(logs, [start.metadata] * len(logs))
    got = dict(zip(replies, result.rewards, strict=True))
    assert {r: v for r, v in got.items() if v != pytest.approx(replies[r], abs=1e-15)} == {}
    assert all(result.done)


def test_a_retry_that_copies_the_feedback_or_the_question_scores_zero() -> None:
    env = make_env(2, 1.0, 0.5, 0.1)
    [start] = env.reset([TASK], [0])
    first = [*start.messages, {"role": "assistant", "content": "\\boxed{7}"}]
    step1 = env.step([first], [start.metadata])
    assert step1.rewards == [0.1] and "\\boxed{your answer}" in step1.observations[0]["content"]
    for retry, reward in (("\\boxed{your answer}", 0.0), ("\\boxed{5 - 3}", 0.0), ("\\boxed{2}", 0.5)):
        log = [*first, step1.observations[0], {"role": "assistant", "content": retry}]
        assert env.step([log], step1.metadata).rewards == [reward], retry
