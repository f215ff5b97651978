"""Red-team set of the math environment (real math-verify): replies that must score 0, or the
documented partial credit (`format_reward`, 0.1, for a wrong answer in the ground truth's shape),
beside correct controls that must still score 1."""

from __future__ import annotations

import pytest

from posttrain.environments.math import MathEnvironment, final_boxed_answer, strip_think

NUMERIC_QUESTION = "What is 3 + 4? Put your final answer in \\boxed{}."
FORMAT = 0.1  # MathEnvironment's default format_reward: a boxed wrong number

# reply -> reward, for the ground truth 7
NUMERIC = {
    # boxing the question, an expression, or several answers instead of the value
    "\\boxed{3+4}": 0.0,
    "\\boxed{3 + 4}": 0.0,
    "\\boxed{3+4=7}": 0.0,
    "\\boxed{x = 7}": 0.0,
    "\\boxed{7 or 8}": 0.0,
    "\\boxed{7 \\text{ or } 8}": 0.0,
    "\\boxed{7, 8}": 0.0,
    "\\boxed{7 8}": 0.0,
    "\\boxed{\\{7, 8\\}}": 0.0,
    "\\boxed{7 \\pm 1}": 0.0,
    "\\boxed{[6, 8]}": 0.0,
    "\\boxed{\\approx 7}": 0.0,
    "\\boxed{8} no wait, \\boxed{7}": 0.0,  # several boxes with different answers
    "\\boxed{7} or maybe \\boxed{8}": 0.0,
    # no answer: empty, truncated, only in the reasoning, unboxed
    "\\boxed{}": 0.0,
    "\\boxed{ }": 0.0,
    "so it is \\boxed{7": 0.0,
    "<think>It is \\boxed{7}.</think> I am not sure.": 0.0,
    "<think>The answer is \\boxed{7}": 0.0,  # reasoning cut short, never closed
    "The answer is 7.": 0.0,
    "<think>\\boxed{8}</think>": 0.0,
    # copying a placeholder
    "\\boxed{your answer}": 0.0,
    "\\boxed{answer}": 0.0,
    "\\boxed{\\text{Your final answer}}": 0.0,
    "\\boxed{...}": 0.0,
    # numbers that are not numbers
    "\\boxed{1e999}": 0.0,
    "\\boxed{\\infty}": 0.0,
    "\\boxed{nan}": 0.0,
    # wrong numbers: the documented partial credit
    "\\boxed{8}": FORMAT,
    "\\boxed{" + "9" * 5000 + "}": FORMAT,
    "<think>\\boxed{7}</think> \\boxed{8}": FORMAT,
    # controls: right answers still pay
    "\\boxed{7}": 1.0,
    "\\boxed{7.0}": 1.0,
    "\\fbox{7}": 1.0,
    "3 + 4 = 7, so \\boxed{7}": 1.0,
    "<think>maybe \\boxed{8}?</think> \\boxed{7}": 1.0,
    "First \\boxed{7}, and again \\boxed{ 7 }.": 1.0,
}

SYMBOLIC_QUESTION = "Simplify \\sqrt{8}. Give your answer as \\boxed{your answer}."
# reply -> reward, for the ground truth 2\sqrt{2}
SYMBOLIC = {
    "\\boxed{\\sqrt{8}}": 0.0,  # the question's own expression: math-verify finds it equal
    "\\boxed{\\sqrt{ 8 }}": 0.0,
    "\\boxed{\\sqrt{8}} = \\boxed{2\\sqrt{2}}": 0.0,
    "\\boxed{your answer}": 0.0,
    "\\boxed{3\\sqrt{2}}": FORMAT,  # a wrong answer: a symbolic ground truth takes any shape
    "\\boxed{2\\sqrt{2}}": 1.0,
    "\\boxed{2 \\sqrt{2}}": 1.0,
    "\\boxed{\\sqrt{2} \\cdot 2}": 1.0,
}


def run(env: MathEnvironment, question: str, answer: str, replies: dict[str, float]) -> list[float]:
    logs = [[{"role": "user", "content": question}, {"role": "assistant", "content": r}] for r in replies]
    return env.step(logs, [{"answer": answer}] * len(logs)).rewards


@pytest.fixture(scope="module")
def env() -> MathEnvironment:
    env = MathEnvironment(timeout_s=5.0)
    yield env
    env.close()


@pytest.mark.slow
def test_numeric_red_team(env: MathEnvironment) -> None:
    got = dict(zip(NUMERIC, run(env, NUMERIC_QUESTION, "7", NUMERIC), strict=True))
    assert {r: v for r, v in got.items() if v != NUMERIC[r]} == {}


def test_symbolic_red_team(env: MathEnvironment) -> None:
    got = dict(zip(SYMBOLIC, run(env, SYMBOLIC_QUESTION, "2\\sqrt{2}", SYMBOLIC), strict=True))
    assert {r: v for r, v in got.items() if v != SYMBOLIC[r]} == {}


@pytest.mark.slow
def test_latex_that_hangs_the_verifier_times_out_to_zero() -> None:
    env = MathEnvironment(timeout_s=2.0)
    try:
        replies = {"\\boxed{9^{9^{9^{9}}}}": 0.0, "\\boxed{\\sqrt{2}}": 1.0}
        logs = [[{"role": "assistant", "content": r}] for r in replies]
        result = env.step(logs, [{"answer": "\\sqrt{2}"}] * 2)
    finally:
        env.close()
    assert result.rewards == [0.0, 1.0]
    assert result.info[0]["verifier_error"] == "timeout"


def test_the_answer_readers() -> None:
    assert strip_think("<think>a</think>b<THINK>c</think>d") == " b d"
    assert strip_think("a </think> b") == " b" and strip_think("a <think> b") == "a "
    assert final_boxed_answer("\\boxed{7} \\boxed{7}") == "7"
    assert final_boxed_answer("\\boxed{} \\boxed{7}") == "7"  # an empty box is no answer, not a hedge
    assert final_boxed_answer("\\boxed{7} \\boxed{8}") is None
    assert final_boxed_answer("\\boxed{7} \\boxed{8") is None
