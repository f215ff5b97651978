"""reasoning-gym environment: tasks from a seed, the real datasets' own scorers (basic_arithmetic,
countdown, maze, mini_sudoku), both answer formats, retry with feedback, and scorers that fail
or hang."""

from __future__ import annotations

import pytest
import reasoning_gym

from posttrain.environments import ENVIRONMENTS
from posttrain.environments.reasoning_gym_env import (
    BOXED_SYSTEM_PROMPT,
    ReasoningGymEnvironment,
    direction_hint,
    extract_answer,
    seeded_wrong_answer,
)
from posttrain.environments.splits import question_split

ONE_DIGIT = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+", "-"],
    "allow_parentheses": False,
    "allow_negation": False,
}

MINI_SUDOKU_SOLUTION = "2 4 1 3\n3 1 4 2\n4 2 3 1\n1 3 2 4"  # mini_sudoku, seed 3, entry 0


def start_and_reply(env: ReasoningGymEnvironment, task: dict, *replies: str) -> list:
    """Play the replies in one episode (stopping when it ends); return every step result."""
    [start] = env.reset([task], [0])
    log, meta, results = list(start.messages), start.metadata, []
    for reply in replies:
        log.append({"role": "assistant", "content": reply})
        result = env.step([log], [meta])
        results.append(result)
        if result.done[0]:
            break
        log.append(result.observations[0])
        meta = result.metadata[0]
    return results


@pytest.fixture(scope="module")
def arithmetic() -> ReasoningGymEnvironment:
    env = ReasoningGymEnvironment("basic_arithmetic", timeout_s=None)
    yield env
    env.close()


def test_tasks_are_the_datasets_entries(arithmetic: ReasoningGymEnvironment) -> None:
    tasks = arithmetic.generate_tasks(4, seed=3)
    assert tasks == [{"seed": 3, "size": 4, "index": i} for i in range(4)]
    starts = arithmetic.reset(tasks, [0, 0, 0, 0])
    direct = reasoning_gym.create_dataset("basic_arithmetic", seed=3, size=4)
    assert [s.messages[-1]["content"] for s in starts] == [direct[i]["question"] for i in range(4)]
    # hand-checked: (56 + -33) - 84 = -61 and 478 / 1 + -682 = -204
    assert starts[0].messages[-1] == {"role": "user", "content": "Calculate ( 56 + -33 ) - 84."}
    assert (starts[0].metadata["entry"]["answer"], starts[1].metadata["entry"]["answer"]) == ("-61", "-204")
    assert starts[0].messages[0] == {
        "role": "system",
        "content": reasoning_gym.utils.SYSTEM_PROMPTS["default"],
    }
    assert starts[0].metadata["tries"] == 0 and starts[0].metadata["index"] == 0
    # a task without its own seed takes the episode's; one that carries its entry uses it
    [seeded] = arithmetic.reset([{}], [3])
    assert seeded.messages[-1]["content"] == "Calculate ( 56 + -33 ) - 84."
    [own] = arithmetic.reset([{"question": "Calculate 2 + 2.", "answer": "4", "metadata": {}}], [0])
    assert own.messages[-1]["content"] == "Calculate 2 + 2." and own.metadata["entry"]["answer"] == "4"


def test_split_tasks_never_share_a_question() -> None:
    """1-digit sums and differences have 242 distinct questions: two seeds' tasks overlap, while the
    "train" and "heldout" splits are disjoint whatever the seeds, about one question in five is held
    out, and a split's tasks are exactly the dataset's entries of that split, in order."""
    env = ReasoningGymEnvironment("basic_arithmetic", dataset_config=ONE_DIGIT, timeout_s=None)

    def questions(tasks: list[dict]) -> list[str]:
        return [s.messages[-1]["content"] for s in env.reset(tasks, [0] * len(tasks))]

    other_seed = set(questions(env.generate_tasks(64, seed=99999)))
    assert other_seed & set(questions(env.generate_tasks(400, seed=11)))  # another seed re-asks questions
    train = questions(env.generate_tasks(2000, seed=11, split="train"))
    heldout = questions(env.generate_tasks(64, seed=99999, split="heldout"))
    assert not set(train) & set(heldout)
    assert {question_split(q) for q in train} == {"train"}
    assert {question_split(q) for q in heldout} == {"heldout"}
    assert 0.1 < len(set(heldout)) / len(set(train) | set(heldout)) < 0.35
    tasks = env.generate_tasks(3, seed=5, split="heldout")
    size = tasks[0]["size"]
    direct = reasoning_gym.create_dataset("basic_arithmetic", seed=5, size=size, **ONE_DIGIT)
    expected = [i for i in range(size) if question_split(direct[i]["question"]) == "heldout"][:3]
    assert [t["index"] for t in tasks] == expected and {t["split"] for t in tasks} == {"heldout"}
    # the split reads the question, not its spacing or case
    assert question_split("Calculate  7 + 8.") == question_split("calculate 7 + 8.")
    with pytest.raises(ValueError, match="split must be"):
        env.generate_tasks(3, seed=0, split="validation")


def test_worked_examples_sit_between_the_system_prompt_and_the_question() -> None:
    """`examples` (the direction recipe's worked 2-digit sum) come after the system prompt and before
    each question; a copy of the example's answer is just a wrong answer, scored as one."""
    example = [
        {"role": "user", "content": "Calculate 14 + 23."},
        {"role": "assistant", "content": "14 + 23 = 37\n\nThe answer is \\boxed{37}."},
    ]
    env = ReasoningGymEnvironment(
        "basic_arithmetic", dataset_config=ONE_DIGIT, answer_format="boxed", timeout_s=None, examples=example
    )
    task = {"question": "Calculate 7 + 8.", "answer": "15", "metadata": {}}
    [start] = env.reset([task], [0])
    assert [m["role"] for m in start.messages] == ["system", "user", "assistant", "user"]
    assert start.messages[1:3] == example and start.messages[3]["content"] == "Calculate 7 + 8."
    [copied] = start_and_reply(env, task, "\\boxed{37}")
    [right] = start_and_reply(env, task, "\\boxed{15}")
    assert (copied.rewards, copied.info[0]["correct"]) == ([0.0], False)
    assert (right.rewards, right.info[0]["correct"]) == ([1.0], True)
    example[0]["content"] = "changed"  # the environment keeps its own copy
    assert env.reset([task], [0])[0].messages[1]["content"] == "Calculate 14 + 23."


def test_single_turn_scores_with_the_datasets_scorer(arithmetic: ReasoningGymEnvironment) -> None:
    task = {"seed": 3, "size": 4, "index": 0}
    replies = {
        "23 - 84 = -61, so <answer>-61</answer>": 1.0,
        "<answer>-60</answer>": 0.0,
        "-61": 0.0,  # no answer tag
    }
    for reply, reward in replies.items():
        [result] = start_and_reply(arithmetic, task, reply)
        assert result.done == [True] and result.observations == [None]
        assert result.rewards == [reward], reply
    [result] = start_and_reply(arithmetic, task, "<answer>-61</answer>")
    assert result.info == [
        {
            "extracted_answer": "-61",
            "score": 1.0,
            "correct": True,
            "tries": 1,
            "verifier_error": None,
            "copied_prompt": False,
        }
    ]


def test_countdown_maze_and_mini_sudoku() -> None:
    countdown = ReasoningGymEnvironment("countdown", timeout_s=None)
    task = {"seed": 3, "size": 2, "index": 0}  # make 119 from 67, 50, 20, 82
    # an expression other than the dataset's own answer, still right: the scorer evaluates it
    assert start_and_reply(countdown, task, "<answer>82 + 67 + 20 - 50</answer>")[0].rewards == [1.0]
    # countdown's partial credit: all numbers but the wrong value 0.05, no answer 0.01
    assert start_and_reply(countdown, task, "<answer>82 + 67 - 20 + 50</answer>")[0].rewards == [0.05]
    assert start_and_reply(countdown, task, "I give up")[0].rewards == [0.01]

    maze = ReasoningGymEnvironment("maze", timeout_s=None)
    # hand-traced shortest path of seed 3 entry 0: 7 steps
    assert start_and_reply(maze, {"seed": 3, "size": 2, "index": 0}, "<answer>7</answer>")[0].rewards == [1.0]
    assert start_and_reply(maze, {"seed": 3, "size": 2, "index": 0}, "<answer>8</answer>")[0].rewards == [0.0]

    sudoku = ReasoningGymEnvironment("mini_sudoku", answer_format="boxed", timeout_s=None)
    task = {"seed": 3, "size": 2, "index": 0}
    assert start_and_reply(sudoku, task, f"\\boxed{{{MINI_SUDOKU_SOLUTION}}}")[0].rewards == [1.0]
    swapped = MINI_SUDOKU_SOLUTION.replace("2 4 1 3", "4 2 1 3")
    # 14 of 16 cells right, times mini_sudoku's 0.9 for an answer that is not the exact grid
    assert start_and_reply(sudoku, task, f"\\boxed{{{swapped}}}")[0].rewards == [pytest.approx(0.9 * 14 / 16)]


def test_answer_formats_and_system_prompts() -> None:
    assert extract_answer("<answer>2</answer> then <answer> 2 </answer>", "answer_tag") == "2"
    assert extract_answer("<answer>1</answer> then <answer> 2 </answer>", "answer_tag") is None  # a hedge
    assert extract_answer("\\boxed{3} <answer>2</answer>", "boxed") == "3"
    assert extract_answer("no tag", "answer_tag") is None
    boxed = ReasoningGymEnvironment("basic_arithmetic", answer_format="boxed", timeout_s=None)
    [start] = boxed.reset([{"seed": 3, "size": 4, "index": 0}], [0])
    assert start.messages[0] == {"role": "system", "content": BOXED_SYSTEM_PROMPT}
    assert start_and_reply(boxed, {"seed": 3, "size": 4, "index": 0}, "\\boxed{-61}")[0].rewards == [1.0]
    [bare] = ReasoningGymEnvironment(system_prompt="", timeout_s=None).reset([{}], [3])
    assert [m["role"] for m in bare.messages] == ["user"]


def test_retry_with_feedback() -> None:
    env = ReasoningGymEnvironment("basic_arithmetic", max_tries=3, retry_discount=0.5, timeout_s=None)
    task = {"seed": 3, "size": 4, "index": 0}
    first, second = start_and_reply(env, task, "<answer>-60</answer>", "<answer>-61</answer>", "unused")
    assert first.done == [False] and first.rewards == [0.0] and first.metadata[0]["tries"] == 1
    assert first.observations == [
        {
            "role": "user",
            "content": "Your answer '-60' scored 0 out of 1, which is not correct. Try again, and give your "
            "final answer as <answer>your answer</answer>.",
        }
    ]
    assert second.done == [True] and second.rewards == [0.5]  # right on the second try: discounted once
    assert second.info[0]["tries"] == 2 and second.info[0]["correct"] is True
    # no answer at all: the feedback says so; out of tries, the last try's score ends the episode
    results = start_and_reply(env, task, "hmm", "<answer>1</answer>", "<answer>2</answer>")
    assert results[0].observations[0]["content"] == (
        "I could not find your final answer. Try again, and give it as <answer>your answer</answer>."
    )
    assert [r.done[0] for r in results] == [False, False, True]
    assert [r.rewards[0] for r in results] == [0.0, 0.0, 0.0]
    assert env.batch_metrics(results[-1])["env/tries_per_episode"] == 3.0


def test_direction_feedback_says_too_high_or_too_low() -> None:
    """feedback="direction": the retry turn carries the answer's direction from the gold answer
    (entry 0 of seed 3, size 4 is -61); no hint where either side is not a number or nothing was found."""
    env = ReasoningGymEnvironment(
        "basic_arithmetic", max_tries=2, retry_discount=0.5, timeout_s=None, feedback="direction"
    )
    task = {"seed": 3, "size": 4, "index": 0}
    fmt = "Try again, and give your final answer as <answer>your answer</answer>."
    for answer, hint in (("-60", " It is too high."), ("-75", " It is too low."), ("sixty", "")):
        [first] = start_and_reply(env, task, f"<answer>{answer}</answer>")
        expected = f"Your answer {answer!r} scored 0 out of 1, which is not correct.{hint} {fmt}"
        assert first.observations[0]["content"] == expected
    [none] = start_and_reply(env, task, "no answer")
    assert none.observations[0]["content"].startswith("I could not find your final answer.")
    assert direction_hint("1,234", "1234") is None and direction_hint(" 12 ", "7") == "It is too high."
    assert direction_hint("2.5", "3") == "It is too low." and direction_hint("3", "[1, 2]") is None
    with pytest.raises(ValueError, match="feedback must be"):
        ReasoningGymEnvironment("basic_arithmetic", timeout_s=None, feedback="hints")


def test_named_feedback_format_leaves_no_placeholder_to_copy() -> None:
    """feedback_format="named": the retry turn names the answer format without a fill-in placeholder,
    in both answer formats; the direction hint is kept (entry 0 of seed 3, size 4 is -61)."""
    task = {"seed": 3, "size": 4, "index": 0}
    for answer_format, wrap, named in (
        ("answer_tag", "<answer>{}</answer>", "in <answer></answer> tags"),
        ("boxed", "\\boxed{{{}}}", "in \\boxed{}"),
    ):
        env = ReasoningGymEnvironment(
            "basic_arithmetic", answer_format=answer_format, max_tries=2, timeout_s=None,
            feedback="direction", feedback_format="named",
        )  # fmt: skip
        [first] = start_and_reply(env, task, wrap.format("-60"))
        assert first.observations[0]["content"] == (
            f"Your answer '-60' scored 0 out of 1, which is not correct. It is too high. Try again, and give "
            f"your final answer {named}."
        )
        [none] = start_and_reply(env, task, "no answer")
        assert (
            none.observations[0]["content"]
            == f"I could not find your final answer. Try again, and give it {named}."
        )
        assert "your answer}" not in first.observations[0]["content"] + none.observations[0]["content"]
    with pytest.raises(ValueError, match="feedback_format must be"):
        ReasoningGymEnvironment("basic_arithmetic", timeout_s=None, feedback_format="shown")


def test_format_reward_is_the_least_reward_of_a_found_wrong_answer() -> None:
    # "Calculate 5 - 3." (seed 1, size 3, entry 0): 2. Two tries, the second's reward halved.
    env = ReasoningGymEnvironment(
        "basic_arithmetic", answer_format="boxed", max_tries=2, retry_discount=0.5, format_reward=0.1,
        timeout_s=None, dataset_config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                        "operators": ["+", "-"], "allow_negation": False},
    )  # fmt: skip
    task = {"seed": 1, "size": 3, "index": 0}
    assert env.entry(task, 0)["answer"] == "2"
    [right] = start_and_reply(env, task, "\\boxed{2}")
    assert right.rewards == [1.0] and right.info[0]["correct"] is True  # the full score, not capped
    one_try = ReasoningGymEnvironment(
        "basic_arithmetic", answer_format="boxed", format_reward=0.1, timeout_s=None,
        dataset_config=env.dataset_config,
    )  # fmt: skip
    [wrong] = start_and_reply(one_try, task, "\\boxed{7}")
    assert wrong.rewards == [0.1]  # found but wrong on the first try: the format reward
    assert wrong.info[0]["correct"] is False and wrong.info[0]["score"] == 0.0
    assert one_try.batch_metrics(wrong)["env/accuracy"] == 0.0
    for blank in ("\\boxed{}", "\\boxed{ }", "no answer"):
        assert start_and_reply(one_try, task, blank)[0].rewards == [0.0]
    # a retry gets no format reward: the feedback shows "\\boxed{your answer}", and a policy learned
    # to copy it (recipe run, step 20: every second try was that copy, rewarded 0.1 x 0.5)
    copied = start_and_reply(env, task, "I think 7", "\\boxed{your answer}")
    assert "\\boxed{your answer}" in copied[0].observations[0]["content"]
    assert [r.rewards[0] for r in copied] == [0.0, 0.0]
    # with retries the first try's turn earns the format reward and the episode goes on
    assert [r.rewards[0] for r in start_and_reply(env, task, "\\boxed{7}", "\\boxed{2}")] == [0.1, 0.5]
    assert [r.rewards[0] for r in start_and_reply(env, task, "\\boxed{7}", "\\boxed{8}")] == [0.1, 0.0]
    with pytest.raises(ValueError, match="format_reward"):
        ReasoningGymEnvironment("basic_arithmetic", format_reward=1.0, timeout_s=None)


def test_batch_metrics() -> None:
    env = ReasoningGymEnvironment("basic_arithmetic", max_tries=2, timeout_s=None)
    starts = env.reset(env.generate_tasks(3, seed=3), [0, 0, 0])
    metas = [s.metadata for s in starts]
    metas[2] = {**metas[2], "tries": 1}  # on its last try
    replies = ["<answer>-61</answer>", "no answer", "<answer>0</answer>"]
    logs = [[*s.messages, {"role": "assistant", "content": r}] for s, r in zip(starts, replies, strict=True)]
    result = env.step(logs, metas)
    assert result.done == [True, False, True]
    assert env.batch_metrics(result) == {
        "env/answer_rate": 2 / 3,
        "env/score_mean": 1 / 3,
        "env/verifier_errors": 0.0,
        "env/verifier_timeouts": 0.0,
        "env/accuracy": 0.5,
        "env/first_try_accuracy": 0.5,
        "env/tries_per_episode": 1.5,
    }


@pytest.mark.slow
@pytest.mark.parametrize("timeout_s", [None, 30.0])
def test_a_scorer_that_raises_scores_zero(timeout_s: float | None) -> None:
    # with a format reward too: an answer the scorer failed on is not a "found but wrong" answer
    env = ReasoningGymEnvironment(
        "mini_sudoku", answer_format="boxed", timeout_s=timeout_s, format_reward=0.1
    )
    try:
        # a row that lost its metadata: mini_sudoku's scorer reads metadata["solution"] and raises
        broken = {"question": "Solve it", "answer": MINI_SUDOKU_SOLUTION, "metadata": {}}
        good = {"seed": 3, "size": 2, "index": 0}
        starts = env.reset([broken, good], [0, 0])
        reply = f"\\boxed{{{MINI_SUDOKU_SOLUTION}}}"
        logs = [[*s.messages, {"role": "assistant", "content": reply}] for s in starts]
        result = env.step(logs, [s.metadata for s in starts])
        assert result.rewards == [0.0, 1.0] and result.done == [True, True]
        assert result.info[0]["verifier_error"] == "exception: KeyError: 'solution'"
        assert env.batch_metrics(result)["env/verifier_errors"] == 1.0
    finally:
        env.close()


@pytest.mark.slow
def test_a_scorer_that_hangs_times_out() -> None:
    env = ReasoningGymEnvironment("countdown", timeout_s=2.0)
    try:
        starts = env.reset(env.generate_tasks(2, seed=3), [0, 0])
        # countdown's scorer hands the expression to sympy, which computes 9**(9**9) for a long time
        replies = ["<answer>9**9**9</answer>", "<answer>39 - 14 + 93 + 51</answer>"]
        logs = [
            [*s.messages, {"role": "assistant", "content": r}] for s, r in zip(starts, replies, strict=True)
        ]
        result = env.step(logs, [s.metadata for s in starts])
        assert result.rewards == [0.0, 1.0]
        assert result.info[0]["verifier_error"] == "timeout"
        assert env.batch_metrics(result)["env/verifier_timeouts"] == 1.0
    finally:
        env.close()


def test_registered_and_validated() -> None:
    assert ENVIRONMENTS["reasoning_gym"] is ReasoningGymEnvironment
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset 'sudokuu'"):
        ReasoningGymEnvironment("sudokuu")
    with pytest.raises(ValueError, match="answer_format"):
        ReasoningGymEnvironment(answer_format="xml")
    with pytest.raises(ValueError, match="max_tries"):
        ReasoningGymEnvironment(max_tries=0)


def test_seeded_wrong_answer_is_off_by_one_to_three() -> None:
    """The gold number moved by 1-3 either way, by the task's hash (the same task, the same answer);
    no seeded answer for a gold that is not a number."""
    offsets = set()
    for index in range(40):
        task = {"seed": 1, "size": 40, "index": index, "split": "train"}
        wrong = seeded_wrong_answer("7", task)
        assert wrong == seeded_wrong_answer("7", dict(task)) and wrong.lstrip("-").isdigit()
        offsets.add(int(wrong) - 7)
    assert offsets == {-3, -2, -1, 1, 2, 3}
    assert seeded_wrong_answer("2.5", {"index": 0}) in {"-0.5", "0.5", "1.5", "3.5", "4.5", "5.5"}
    assert seeded_wrong_answer("[1, 2]", {"index": 0}) is None and seeded_wrong_answer(None, {}) is None


def test_seeded_retries_start_training_episodes_after_a_wrong_try() -> None:
    """seeded_retries=1: every training-split task starts after the environment's wrong boxed answer
    and its direction feedback; the policy's reply is the second try (reward discounted once, no
    format reward), and the metrics keep seeded episodes out of first_try_accuracy. Held-out tasks and
    tasks of no split start from the question."""
    env = ReasoningGymEnvironment(
        "basic_arithmetic", answer_format="boxed", max_tries=2, retry_discount=0.5, format_reward=0.1,
        timeout_s=None, dataset_config=ONE_DIGIT, feedback="direction", feedback_format="named",
        seeded_retries=1.0,
    )  # fmt: skip
    [task] = env.generate_tasks(1, seed=5, split="train")
    gold = env.entry(task, 0)["answer"]
    [start] = env.reset([task], [0])
    wrong = seeded_wrong_answer(gold, task)
    assert start.metadata["tries"] == 1 and start.metadata["seeded"] is True
    assert start.messages[-2] == {"role": "assistant", "content": f"The answer is \\boxed{{{wrong}}}."}
    hint = "It is too high." if int(wrong) > int(gold) else "It is too low."
    assert start.messages[-1]["role"] == "user" and hint in start.messages[-1]["content"]
    [right] = start_and_reply(env, task, f"\\boxed{{{gold}}}")
    assert right.done == [True] and right.rewards == [0.5] and right.info[0]["tries"] == 2
    [again] = start_and_reply(env, task, f"\\boxed{{{wrong}}}")
    assert again.done == [True] and again.rewards == [0.0]  # wrong again: no format reward on a retry
    metrics = env.batch_metrics(right)
    assert metrics["env/seeded_share"] == 1.0 and metrics["env/seeded_accuracy"] == 1.0
    assert "env/first_try_accuracy" not in metrics and metrics["env/accuracy"] == 1.0
    for other in (env.generate_tasks(1, seed=5, split="heldout")[0], {"seed": 5, "size": 3, "index": 0}):
        [plain] = env.reset([other], [0])
        assert plain.metadata["tries"] == 0 and "seeded" not in plain.metadata
        assert plain.messages[-1]["role"] == "user" and plain.messages[-1]["content"].startswith("Calculate")


def test_seeded_retries_share_and_checks() -> None:
    """The share of training tasks seeded follows seeded_retries (hash-chosen, stable); bad values fail."""
    env = ReasoningGymEnvironment(
        "basic_arithmetic", max_tries=2, timeout_s=None, dataset_config=ONE_DIGIT, seeded_retries=0.5
    )
    tasks = env.generate_tasks(200, seed=3, split="train")
    seeded = [bool(s.metadata.get("seeded")) for s in env.reset(tasks, [0] * len(tasks))]
    assert 0.38 < sum(seeded) / len(seeded) < 0.62
    assert seeded == [bool(s.metadata.get("seeded")) for s in env.reset(tasks, [1] * len(tasks))]
    with pytest.raises(ValueError, match="seeded_retries must be in"):
        ReasoningGymEnvironment("basic_arithmetic", max_tries=2, timeout_s=None, seeded_retries=1.5)
    with pytest.raises(ValueError, match="needs max_tries >= 2"):
        ReasoningGymEnvironment("basic_arithmetic", timeout_s=None, seeded_retries=0.5)
