"""MathEnvironment: boxed extraction, math-verify equivalence, and verifiers that raise, hang or die."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain.environments import (
    ENVIRONMENTS,
    Environment,
    EnvStepResult,
    MathEnvironment,
    RewardFunctionEnvironment,
    extract_last_boxed,
    make_environment,
)
from posttrain.environments.timeout_pool import TimeoutPool

# --- verifiers injected into the subprocess; module level so that they pickle by reference ---


def raising_verify(prediction: str, answer: str) -> bool:
    if prediction == "boom":
        raise ZeroDivisionError("verifier bug")
    return prediction == answer


def hanging_verify(prediction: str, answer: str) -> bool:
    if prediction == "hang":
        time.sleep(60)
    return prediction == answer


def dying_verify(prediction: str, answer: str) -> bool:
    if prediction == "die":
        os._exit(3)
    return prediction == answer


def logs_for(*completions: str) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": "What is it?"}, {"role": "assistant", "content": c}] for c in completions
    ]


@pytest.fixture
def math_env():
    env = MathEnvironment(timeout_s=10.0, format_reward=0.0)
    yield env
    env.close()


# --- extraction ---


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
        ("first \\boxed{1}, then \\boxed{2}, finally \\boxed{3}", "3"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed { 7 }", "7"),
        ("\\fbox{5}", "5"),
        ("no box here, the answer is 5", None),
        ("truncated \\boxed{1} then \\boxed{\\frac{1}{2", None),
        ("\\boxed{3} and the word \\boxed alone", "3"),
        ("", None),
    ],
)
def test_extract_last_boxed(text, expected):
    assert extract_last_boxed(text) == expected


# --- scoring with math-verify ---


@pytest.mark.slow
def test_correct_incorrect_and_equivalent_forms(math_env):
    completions = [
        "half: \\boxed{1/2}",  # 0.5
        "\\boxed{\\frac{1}{2}}",  # 0.5
        "\\boxed{-17}",  # -17
        "\\boxed{17}",  # -17: wrong sign
        "I think \\boxed{3} no wait \\boxed{4}",  # 4: boxes with different answers answer nothing
        "I think \\boxed{4} no wait \\boxed{3}",  # 4: the same hedge the other way round
        "the answer is 4",  # no box
        "\\boxed{x + 1}",  # 1+x
    ]
    answers = ["0.5", "0.5", "-17", "-17", "4", "4", "4", "1+x"]
    result = math_env.step(logs_for(*completions), [{"answer": a, "id": k} for k, a in enumerate(answers)])
    assert result.rewards == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert result.done == [True] * 8
    assert result.observations == [None] * 8
    assert [m["id"] for m in result.metadata] == list(range(8))
    assert result.info[0]["extracted_answer"] == "1/2"
    assert result.info[6]["extracted_answer"] is None
    assert all(i["verifier_error"] is None for i in result.info)
    metrics = math_env.batch_metrics(result)
    assert metrics["env/accuracy"] == pytest.approx(4 / 8)
    assert metrics["env/boxed_rate"] == pytest.approx(5 / 8)
    assert metrics["env/verifier_errors"] == 0
    assert metrics["env/verifier_timeouts"] == 0


@pytest.mark.slow
def test_numeric_answer_and_last_assistant_message(math_env):
    log = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "\\boxed{1}"},
        {"role": "user", "content": "\\boxed{12}"},
        {"role": "assistant", "content": "Final: \\boxed{12}"},
    ]
    result = math_env.step([log], [{"answer": 12}])
    assert result.rewards == [1.0]


@pytest.mark.slow
def test_format_reward_for_a_wrong_boxed_answer():
    env = MathEnvironment(timeout_s=10.0, format_reward=0.1)
    try:
        result = env.step(logs_for("\\boxed{5}", "5", "\\boxed{6}"), [{"answer": "6"}] * 3)
    finally:
        env.close()
    assert result.rewards == [0.1, 0.0, 1.0]


def test_missing_answer_fails_the_batch(math_env):
    with pytest.raises(ValueError, match="answer"):
        math_env.step(logs_for("\\boxed{1}"), [{"solution": "1"}])


# --- verifiers that fail ---


@pytest.mark.slow
def test_raising_verifier_scores_zero_and_is_counted():
    env = MathEnvironment(timeout_s=10.0, verify_fn=raising_verify)
    try:
        result = env.step(
            logs_for("\\boxed{1}", "\\boxed{boom}", "\\boxed{3}"),
            [{"answer": "1"}, {"answer": "2"}, {"answer": "3"}],
        )
    finally:
        env.close()
    assert result.rewards == [1.0, 0.0, 1.0]
    assert result.info[1]["verifier_error"].startswith("exception: ZeroDivisionError: verifier bug")
    metrics = env.batch_metrics(result)
    assert metrics["env/verifier_errors"] == 1
    assert metrics["env/verifier_timeouts"] == 0


@pytest.mark.slow
def test_hanging_verifier_times_out_without_blocking_the_batch():
    env = MathEnvironment(timeout_s=1.0, format_reward=0.0, verify_fn=hanging_verify)
    try:
        env.step(logs_for("\\boxed{0}"), [{"answer": "0"}])  # start the process outside the timing
        completions = [f"\\boxed{{{k}}}" for k in range(16)]
        completions[5] = "\\boxed{hang}"
        start = time.monotonic()
        result = env.step(logs_for(*completions), [{"answer": str(k)} for k in range(16)])
        elapsed = time.monotonic() - start
        assert elapsed < 30, f"a hung verifier (60 s) blocked the batch for {elapsed:.1f}s"
        assert result.rewards == [0.0 if k == 5 else 1.0 for k in range(16)]
        assert result.info[5]["verifier_error"] == "timeout"
        metrics = env.batch_metrics(result)
        assert metrics["env/verifier_timeouts"] == 1
        assert metrics["env/verifier_errors"] == 1
        assert metrics["env/accuracy"] == pytest.approx(15 / 16)

        # the killed process was replaced: the next batch works
        result = env.step(logs_for("\\boxed{1}", "\\boxed{2}"), [{"answer": "1"}, {"answer": "3"}])
        assert result.rewards == [1.0, 0.0]
        assert all(i["verifier_error"] is None for i in result.info)
    finally:
        env.close()


@pytest.mark.slow
def test_verifier_process_that_dies_scores_zero_and_is_replaced():
    env = MathEnvironment(timeout_s=10.0, verify_fn=dying_verify)
    try:
        result = env.step(
            logs_for("\\boxed{1}", "\\boxed{die}", "\\boxed{3}"),
            [{"answer": "1"}, {"answer": "2"}, {"answer": "3"}],
        )
        assert result.rewards == [1.0, 0.0, 1.0]
        assert "exit code 3" in result.info[1]["verifier_error"]
        assert env.batch_metrics(result)["env/verifier_errors"] == 1
    finally:
        env.close()


@pytest.mark.slow
def hanging_verify_meeting(prediction: str, answer: str) -> bool:
    """On "hang:<folder>": note this process in <folder>, wait until two processes are noted there
    (then note "met"), and hang."""
    if prediction.startswith("hang:"):
        folder = Path(prediction.removeprefix("hang:"))
        (folder / f"started.{os.getpid()}").write_text("")
        while len(list(folder.glob("started.*"))) < 2:
            time.sleep(0.01)
        (folder / f"met.{os.getpid()}").write_text("")
        time.sleep(60)
    return prediction == answer


def test_pool_runs_hung_calls_in_parallel_and_leaves_no_process(tmp_path):
    pool = TimeoutPool(hanging_verify_meeting, timeout_s=2.0, num_procs=2)
    procs = [w.proc for w in pool._workers]
    hang = f"hang:{tmp_path}"
    try:
        outcomes = pool.map([(hang, "x"), (hang, "x"), ("a", "a"), ("a", "b")])
    finally:
        pool.close()
    assert [o.error for o in outcomes] == ["timeout", "timeout", None, None]
    assert [o.value for o in outcomes[2:]] == [True, False]
    # In parallel: each hung call saw the other running before its timeout killed it (calls run one
    # after another would never meet), in the pool's two first processes.
    met = sorted(int(f.name.split(".")[1]) for f in tmp_path.glob("met.*"))
    assert met == sorted(p.pid for p in procs)
    assert pool.restarts == 2
    assert all(p.poll() is not None for p in procs)


# --- protocol, adapter, registry ---


def test_protocol_and_registry():
    assert ENVIRONMENTS["math"] is MathEnvironment
    env = make_environment("math", timeout_s=2.0)
    assert isinstance(env, Environment)
    assert isinstance(RewardFunctionEnvironment(lambda c, m: 1.0), Environment)
    with pytest.raises(ValueError, match="registered"):
        make_environment("no_such_env")
    assert isinstance(make_environment("posttrain.environments.math:MathEnvironment"), MathEnvironment)


def test_reward_function_environment_catches_errors():
    def reward(completion: str, metadata: dict) -> float:
        return 1.0 / len(completion)

    env = RewardFunctionEnvironment(reward)
    result = env.step(logs_for("ab", ""), [{}, {}])
    assert result.rewards == [0.5, 0.0]
    assert result.info[1]["verifier_error"].startswith("exception: ZeroDivisionError")
    assert env.batch_metrics(result)["env/verifier_errors"] == 1


@pytest.mark.slow
def test_reward_function_environment_with_timeout():
    env = RewardFunctionEnvironment(hanging_verify_reward, timeout_s=1.0)
    try:
        result = env.step(logs_for("hang", "ok"), [{}, {}])
    finally:
        env.close()
    assert result.rewards == [0.0, 1.0]
    assert result.info[0]["verifier_error"] == "timeout"


def hanging_verify_reward(completion: str, metadata: dict) -> float:
    return float(hanging_verify(completion, "ok"))


def test_step_result_checks_lengths_and_concatenates():
    with pytest.raises(ValueError, match="one entry per sample"):
        EnvStepResult(rewards=[1.0], observations=[], done=[True], metadata=[{}])
    a = EnvStepResult(rewards=[1.0], observations=[None], done=[True], metadata=[{"i": 0}])
    b = EnvStepResult(
        rewards=[0.0, 0.5], observations=[None, None], done=[True, False], metadata=[{"i": 1}, {"i": 2}]
    )
    c = EnvStepResult.concat([a, b])
    assert c.rewards == [1.0, 0.0, 0.5] and [m["i"] for m in c.metadata] == [0, 1, 2] and len(c.info) == 3


# --- the example of docs/environments.md ---

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "custom_reward.py"


def test_docs_quote_the_example_exactly():
    example = EXAMPLE.read_text()
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "environments.md").read_text(), re.S)
    assert len(blocks) == 2
    for block in blocks:
        assert block in example


@pytest.mark.slow
def test_example_runs_as_a_script():
    out = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120, check=True, cwd=REPO
    ).stdout
    assert "reward function: [1.0]" in out
    assert "guess_number: [0.0] [{'role': 'user', 'content': 'higher'}] [False]" in out


def test_example_environment_plays_to_the_end():
    example = runpy.run_path(str(EXAMPLE), run_name="custom_reward_example")
    reward = example["exact_answer_reward"]
    assert reward("so:\n42", {"answer": "42"}) == 1.0
    assert reward("42\nno idea", {"answer": "42"}) == 0.0

    env = make_environment("guess_number", max_turns=3)
    assert isinstance(env, Environment)
    meta = [{"target": 7}, {"target": 2}]
    r1 = env.step([[{"role": "assistant", "content": "5"}]] * 2, meta)
    assert r1.done == [False, False]
    assert [o["content"] for o in r1.observations] == ["higher", "lower"]
    r2 = env.step(
        [[{"role": "assistant", "content": "7"}], [{"role": "assistant", "content": "3"}]], r1.metadata
    )
    assert r2.rewards == [1.0, 0.0] and r2.done == [True, False]
    r3 = env.step([[{"role": "assistant", "content": "4"}]], r2.metadata[1:])
    assert r3.done == [True] and r3.metadata[0]["turn"] == 3
    assert env.batch_metrics(r2) == {"env/solved": 0.5}


@pytest.mark.slow
def test_an_empty_box_is_no_answer_and_earns_no_format_reward():
    from posttrain.environments.math import MathEnvironment

    env = MathEnvironment(format_reward=0.1)
    try:
        logs = [
            [{"role": "assistant", "content": c}]
            for c in ("\\boxed{}", "\\boxed{ }", "\\boxed{3}", "\\boxed{4}")
        ]
        result = env.step(logs, [{"answer": "4"}] * 4)
    finally:
        env.close()
    assert result.rewards == [0.0, 0.0, 0.1, 1.0]
    assert env.batch_metrics(result)["env/boxed_rate"] == 0.5


def test_a_numeric_ground_truth_needs_a_numeric_answer_not_the_question():
    from posttrain.environments.math import is_number_literal, math_verify_equal

    # math-verify alone would accept `4 + 8` for 12: a policy learns to box the question
    assert not math_verify_equal("4 + 8", "12")
    assert math_verify_equal("12", "12") and math_verify_equal("1/2", "0.5")
    assert math_verify_equal("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2")  # symbolic ground truth: any form
    assert [is_number_literal(t) for t in ("-3.5", "1,000", "\\$12", "\\frac{1}{2}", "2*6", "x")] == [
        True,
        True,
        True,
        True,
        False,
        False,
    ]
