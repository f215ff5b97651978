"""Calculator tool environment: the safe evaluator and its limits, answer extraction, tasks from a
seed, and whole episodes through reset/step (with and without the tool)."""

from __future__ import annotations

import json
import random
import re
import runpy
from pathlib import Path

import pytest
import yaml

from posttrain.environments import ENVIRONMENTS, make_environment
from posttrain.environments.calculator import (
    PHRASINGS,
    TRAINING_PHRASINGS,
    CalculatorEnvironment,
    calculator,
    extract_answer,
    format_number,
    oracle_transcript,
    task_split,
)
from posttrain.environments.tools import tools_system_prompt

SMOLLM2 = Path("/root/.cache/posttrain/models/smollm2-135m-instruct")


def tool_call(expression: str) -> str:
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": {json.dumps(expression)}}}}}\n</tool_call>'


# --- the evaluator -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("347 * 58", "20126"),
        ("347×58", "20126"),
        ("(300 + 47) * (60 - 2)", "20126"),
        ("2^10", "1024"),
        ("2 ** -1", "0.5"),
        ("10 / 4", "2.5"),
        ("20 / 4", "5"),
        ("0.1 + 0.2", "0.3"),
        ("7 // 2 % 3", "0"),
        ("-(3)", "-3"),
        ("1e3 + 1", "1001"),
        ("10**100 * 10**100", "1" + "0" * 200),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, value: str) -> None:
    assert calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("2 ** 1000", "exponents are limited to 100"),
        ("9 ** 9 ** 9", "exponents are limited to 100"),
        ("9999 ** 99", "more than 300 digits"),
        ("10**100 * 10**100 * 10**100 * 10**100", "more than 300 digits"),
        ("1e308 * 10", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1 < 2", "only + - * / // % ** and parentheses"),
        ("1 << 3", "only + - * / // % ** and parentheses"),
        ("x + 1", "'x' is not defined"),
        ("abs(-3)", "Function 'abs' not defined"),
        ("__import__('os').system('true')", "not defined"),
        ("().__class__", "not available"),
        ("3 +", "cannot read '3 +' as an arithmetic expression"),
        ("1" * 201, "longer than 200 characters"),
    ],
)
def test_calculator_refuses_what_is_not_small_arithmetic(expression: str, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        calculator(expression)


def test_format_number() -> None:
    assert format_number(20126) == "20126"
    assert format_number(5.0) == "5"
    assert format_number(2.5) == "2.5"
    assert format_number(1e20) == "1e+20"


def test_extract_answer() -> None:
    assert extract_answer("so \\boxed{20126}.") == "20126"
    assert extract_answer("\\boxed{20,126} then \\boxed{ 20,126 }") == "20,126"  # one answer twice
    assert extract_answer("\\boxed{1} then \\boxed{20,126}") is None  # different answers: a hedge
    assert extract_answer("347 * 58 = 20,126.") == "20,126"
    assert extract_answer("347 * 58 = 20126", "boxed") is None
    assert extract_answer("I don't know", "boxed_or_last_number") is None
    assert extract_answer("\\boxed{x} and 5") == "x"  # a box wins over numbers


# --- tasks and episodes ------------------------------------------------------------------------------


def test_generate_tasks_and_reset() -> None:
    env = CalculatorEnvironment()
    tasks = env.generate_tasks(500, seed=3)
    assert tasks == env.generate_tasks(500, seed=3) and tasks != env.generate_tasks(500, seed=4)
    assert all(100 <= t["a"] <= 999 and 10 <= t["b"] <= 99 and set(t) == {"a", "b"} for t in tasks)
    [start] = env.reset([{"a": 347, "b": 58}], [0])
    assert start.messages == [
        {
            "role": "user",
            "content": "What is 347 * 58?\nYou can use the calculator tool. Give your final answer as a number in \\boxed{}.",
        }
    ]
    assert start.metadata == {"a": 347, "b": 58, "answer": 20126, "tool_calls": 0, "tool_errors": 0}
    assert [s["function"]["name"] for s in start.tools] == ["calculator"]
    assert start.tools[0]["function"]["parameters"]["required"] == ["expression"]
    assert start.stop_strings == ("</tool_call>",)
    [with_system] = CalculatorEnvironment(system_prompt="Be exact.").reset([{"a": 347, "b": 58}], [0])
    assert with_system.messages[0] == {"role": "system", "content": "Be exact."}


def play(env: CalculatorEnvironment, task: dict, *replies: str) -> tuple[list, list]:
    """Play `replies` as the assistant's turns; return every step result and the final log."""
    [start] = env.reset([task], [0])
    log, meta, results = list(start.messages), start.metadata, []
    for reply in replies:
        log.append({"role": "assistant", "content": reply})
        result = env.step([log], [meta])
        results.append(result)
        meta = result.metadata[0]
        if result.done[0]:
            break
        log.append(result.observations[0])
    return results, log


def test_an_episode_with_the_tool() -> None:
    env = make_environment("tool_calculator")
    results, log = play(env, {"a": 347, "b": 58}, tool_call("347 * 58"), "347 * 58 = \\boxed{20126}")
    assert log[-2] == {"role": "tool", "name": "calculator", "content": "20126"}
    assert [r.rewards[0] for r in results] == [0.0, 1.0]
    assert results[-1].done == [True]
    assert results[-1].info[0]["called_tool"] is True and results[-1].info[0]["correct"] is True
    assert env.batch_metrics(results[-1])["env/tool_call_rate"] == 1.0


def test_a_bad_expression_then_a_retry() -> None:
    env = CalculatorEnvironment()
    results, log = play(env, {"a": 347, "b": 58}, tool_call("347 x 58"), tool_call("347*58"), "It is 20,126.")
    assert log[2]["content"].startswith("Error: ValueError: cannot read") and log[4]["content"] == "20126"
    assert [r.rewards[0] for r in results] == [0.0, 0.0, 1.0]
    assert results[-1].metadata[0]["tool_calls"] == 2 and results[-1].metadata[0]["tool_errors"] == 1
    assert env.batch_metrics(results[0])["env/tool_errors"] == 1.0


def test_answers_without_the_tool_and_formats() -> None:
    env, strict = CalculatorEnvironment(), CalculatorEnvironment(answer_format="boxed")
    task = {"a": 347, "b": 58}
    cases = {
        "\\boxed{20126}": 1.0,
        "\\boxed{20,126}": 1.0,
        "20126": 1.0,
        "\\boxed{20000}": 0.0,
        "about 20000": 0.0,
    }
    for reply, reward in cases.items():
        [result] = play(env, task, reply)[0]
        assert result.rewards == [reward], reply
        assert result.info[0]["called_tool"] is False
    assert play(strict, task, "20126")[0][0].rewards == [0.0]
    assert play(strict, task, "\\boxed{20126}")[0][0].rewards == [1.0]


def test_metrics_over_ended_episodes() -> None:
    env = CalculatorEnvironment()
    starts = env.reset([{"a": 100, "b": 10}] * 3, [0, 1, 2])
    metas = [s.metadata for s in starts]
    metas[0] = {**metas[0], "tool_calls": 1}  # this one used the tool on an earlier turn
    logs = [
        [*s.messages, {"role": "assistant", "content": c}]
        for s, c in zip(starts, ["1000", "999", tool_call("1/0")], strict=True)
    ]
    result = env.step(logs, metas)
    assert result.done == [True, True, False]
    assert env.batch_metrics(result) == {
        "env/tool_errors": 1.0,
        "env/tool_call_rate": 0.5,
        "env/reward_mean": 0.5,
        "env/tool_budget_exhausted_rate": 0.0,
        "env/accuracy": 0.5,
    }


def test_a_finished_transcript_s_calls_count_as_tool_use() -> None:
    """A verdict on a whole transcript (an agent's episode: the agent ran the calls, the environment
    never stepped them, so its metadata counts none) sees the calls after the question; a call in a
    worked example before the question does not count."""
    example = [
        {"role": "user", "content": "What is 12 * 34?"},
        {"role": "assistant", "content": tool_call("12 * 34")},
        {"role": "tool", "content": "408"},
        {"role": "assistant", "content": "\\boxed{408}"},
    ]
    env = CalculatorEnvironment(examples=example)
    [start] = env.reset([{"a": 100, "b": 10}], [0])
    called = [
        *start.messages,
        {"role": "assistant", "content": tool_call("100 * 10")},
        {"role": "tool", "content": "1000"},
        {"role": "assistant", "content": "\\boxed{1000}"},
    ]
    guessed = [*start.messages, {"role": "assistant", "content": "\\boxed{1000}"}]
    result = env.step([called, guessed], [start.metadata, start.metadata])
    assert [i["called_tool"] for i in result.info] == [True, False] and result.rewards == [1.0, 1.0]
    assert env.batch_metrics(result)["env/tool_call_rate"] == 0.5


def test_tools_in_system_prompt_for_smollm2() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    [start] = CalculatorEnvironment(tools_in_system_prompt=True).reset([{"a": 347, "b": 58}], [0])
    assert start.tools is None
    assert start.messages[0] == {
        "role": "system",
        "content": tools_system_prompt([CalculatorEnvironment().tools.schemas()[0]]),
    }
    rendered = tokenizer.apply_chat_template(start.messages, tokenize=False, add_generation_prompt=True)
    assert '"name": "calculator"' in rendered and "What is 347 * 58?" in rendered


def test_registered_and_validated() -> None:
    assert ENVIRONMENTS["tool_calculator"] is CalculatorEnvironment
    with pytest.raises(ValueError, match="answer_format"):
        CalculatorEnvironment(answer_format="last")


# --- task families and oracle transcripts (held-out families for the recipe without an example) ---


def test_the_default_family_draws_the_tasks_it_always_drew() -> None:
    """Seeded data of the existing recipes is unchanged: a in 100..999, b in 10..99, from one Random."""
    rng = random.Random(11)
    before = [{"a": rng.randint(100, 999), "b": rng.randint(10, 99)} for _ in range(200)]
    assert CalculatorEnvironment().generate_tasks(200, 11) == before


def test_families_of_other_sizes_operations_and_phrasings() -> None:
    sums = CalculatorEnvironment(operation="+", digits=(4, 4), phrasings=["plus", "sum", "add"])
    tasks = sums.generate_tasks(300, seed=5)
    assert all(1000 <= t["a"] <= 9999 and 1000 <= t["b"] <= 9999 and t["op"] == "+" for t in tasks)
    assert {t["phrasing"] for t in tasks} == {"plus", "sum", "add"}
    starts = sums.reset(tasks[:40], [0] * 40)
    for task, start in zip(tasks[:40], starts, strict=True):
        assert start.metadata["answer"] == task["a"] + task["b"]
        question = PHRASINGS["+"][task["phrasing"]].format(a=task["a"], b=task["b"])
        assert start.messages[-1]["content"].startswith(question + "\n")
    short = CalculatorEnvironment(digits=(2, 2), phrasings=["times"]).generate_tasks(50, seed=1)
    assert all(10 <= t["a"] <= 99 and 10 <= t["b"] <= 99 and "op" not in t for t in short)
    [start] = CalculatorEnvironment().reset([{"a": 12, "b": 34, "phrasing": "multiply"}], [0])
    assert (
        start.messages[-1]["content"].startswith("Multiply 12 by 34.\n") and start.metadata["answer"] == 408
    )


def test_a_family_of_both_operations_draws_each_with_its_own_phrasings() -> None:
    env = CalculatorEnvironment(operation=["*", "+"], phrasings=["what_is", "rows", "total", "more"])
    assert env.phrasings == {"*": ["what_is", "rows"], "+": ["what_is", "total", "more"]}
    tasks = env.generate_tasks(400, seed=3)
    products = [t for t in tasks if "op" not in t]
    sums = [t for t in tasks if t.get("op") == "+"]
    assert len(products) + len(sums) == 400 and 150 < len(sums) < 250
    assert {t.get("phrasing", "what_is") for t in products} == {"what_is", "rows"}
    assert {t.get("phrasing", "what_is") for t in sums} == {"what_is", "total", "more"}
    for task, start in zip(tasks[:40], env.reset(tasks[:40], [0] * 40), strict=True):
        a, b = task["a"], task["b"]
        assert start.metadata["answer"] == (a + b if task.get("op") == "+" else a * b)


def test_training_phrasings_use_none_of_the_held_out_words() -> None:
    """The recipes train on TRAINING_PHRASINGS; the other phrasings are held out, and no training
    question contains the word a held-out one turns on."""
    held_out = {op: set(PHRASINGS[op]) - set(TRAINING_PHRASINGS[op]) for op in PHRASINGS}
    assert held_out == {"*": {"times", "product", "multiply"}, "+": {"plus", "sum", "add"}}
    training_text = " ".join(PHRASINGS[op][p] for op in TRAINING_PHRASINGS for p in TRAINING_PHRASINGS[op])
    words = set(re.findall(r"[a-z]+", training_text.lower()))
    assert not words & {"times", "product", "multiply", "multiplied", "plus", "sum", "add", "added"}
    # "What is the X of ... a and b?" is asked of both operations, so its shape decides neither
    of_shape = re.compile(r"^What is the \w+ of .*\{a\} and \{b\}\?$")
    # and an imperative "Find the X of ... a and b.", so a command's shape decides neither either
    imperative = re.compile(r"^Find the \w+ of .*\{a\} and \{b\}\.$")
    for op in TRAINING_PHRASINGS:
        assert any(of_shape.match(PHRASINGS[op][p]) for p in TRAINING_PHRASINGS[op]), op
        assert any(imperative.match(PHRASINGS[op][p]) for p in TRAINING_PHRASINGS[op]), op


@pytest.mark.parametrize(
    ("kwargs", "task", "message"),
    [
        ({"operation": "-"}, None, "op must be one of"),
        ({"operation": ["*", "-"]}, None, "op must be one of"),
        ({"operation": []}, None, "at least one operation"),
        ({"operation": ["*", "+"], "phrasings": ["plus"]}, None, "operation '\\*' has none of the phrasings"),
        ({"phrasings": ["plus"]}, None, "phrasing 'plus' is not one of"),
        ({"digits": (3,)}, None, "digits must be two digit counts"),
        ({"digits": (0, 2)}, None, "digits must be two digit counts"),
        ({}, {"a": 1, "b": 2, "op": "/"}, "op must be one of"),
        ({}, {"a": 1, "b": 2, "phrasing": "sum"}, "phrasing 'sum' is not one of"),
    ],
)
def test_unknown_families_are_clear_errors(kwargs: dict, task: dict | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        env = CalculatorEnvironment(**kwargs)
        env.reset([task], [0])


def test_boxed_answers_only_score_with_answer_format_boxed() -> None:
    """The prompt asks for \\boxed{}: with answer_format="boxed" an unboxed right number is wrong."""
    task = {"a": 1234, "b": 5678, "op": "+"}
    for answer_format, unboxed_reward in (("boxed", 0.0), ("boxed_or_last_number", 1.0)):
        env = CalculatorEnvironment(answer_format=answer_format)
        results, _ = play(env, task, tool_call("1234 + 5678"), "The answer is 6912.")
        assert results[-1].rewards == [unboxed_reward]
        results, _ = play(env, task, tool_call("1234 + 5678"), "The answer is \\boxed{6912}.")
        assert results[-1].rewards == [1.0] and results[-1].info[0]["called_tool"]


def test_oracle_transcripts_play_the_episode_and_score_one() -> None:
    env = CalculatorEnvironment(
        tools_in_system_prompt=True, answer_format="boxed", operation="+", phrasings=["add"]
    )
    task = env.generate_tasks(1, seed=2)[0]
    messages = oracle_transcript(env, task)
    [start] = env.reset([task], [0])
    assert messages[: len(start.messages)] == start.messages and messages[0]["role"] == "system"
    assert "calculator" in messages[0]["content"]  # the tool is described in the system prompt
    expression = f"{task['a']} + {task['b']}"
    assert [m["role"] for m in messages[len(start.messages) :]] == ["assistant", "tool", "assistant"]
    assert messages[-3]["content"] == tool_call(expression)
    assert messages[-2]["content"] == str(task["a"] + task["b"])
    assert messages[-1]["content"] == f"The answer is \\boxed{{{task['a'] + task['b']}}}."
    results, _ = play(env, task, *(m["content"] for m in messages if m["role"] == "assistant"))
    assert results[-1].rewards == [1.0]  # the same turns replayed score 1
    with pytest.raises(ValueError, match="without tools="):  # schemas as tools= would be lost in an SFT row
        oracle_transcript(CalculatorEnvironment(), task)


def test_the_script_writes_sft_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = runpy.run_path(
        str(Path(__file__).parents[2] / "examples" / "calculator_transcripts.py"), run_name="transcripts"
    )
    kwargs = {"tools_in_system_prompt": True, "answer_format": "boxed"}
    out = tmp_path / "sft.jsonl"
    script["main"]([str(out), "--count", "6", "--seed", "3", "--env", json.dumps(kwargs)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and "wrote 6 transcripts" in capsys.readouterr().out
    env = CalculatorEnvironment(**kwargs)
    assert [r["task"] for r in rows] == env.generate_tasks(6, 3, split="train")
    assert all(r["messages"] == oracle_transcript(env, r["task"]) for r in rows)


def test_the_script_mixes_task_families(tmp_path: Path) -> None:
    """Two --env: the count shared out (3 + 2), rows interleaved, each family drawn from its own seed."""
    script = runpy.run_path(
        str(Path(__file__).parents[2] / "examples" / "calculator_transcripts.py"), run_name="transcripts"
    )
    products = {"tools_in_system_prompt": True, "answer_format": "boxed"}
    sums = {**products, "operation": "+"}
    out = tmp_path / "sft.jsonl"
    script["main"](
        [str(out), "--count", "5", "--seed", "3", "--env", json.dumps(products), "--env", json.dumps(sums)]
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    envs = [CalculatorEnvironment(**products), CalculatorEnvironment(**sums)]
    expected = [envs[0].generate_tasks(3, 3, split="train"), envs[1].generate_tasks(2, 4, split="train")]
    assert [r["task"] for r in rows] == [
        expected[0][0],
        expected[1][0],
        expected[0][1],
        expected[1][1],
        expected[0][2],
    ]
    assert [r["messages"][2]["content"].count(" + ") for r in rows] == [0, 1, 0, 1, 0]  # the call's operator
    for row, env in zip(rows, [envs[0], envs[1], envs[0], envs[1], envs[0]], strict=True):
        assert row["messages"] == oracle_transcript(env, row["task"])


def test_train_and_heldout_pools_share_no_operands() -> None:
    """About one task in 8 is held out, by its operands and operation (not its phrasing), whatever the seed."""
    env = CalculatorEnvironment(phrasings=["what_is", "times"])
    train, held = env.generate_tasks(3000, 11, split="train"), env.generate_tasks(400, 11, split="heldout")
    assert len(train) == 3000 and len(held) == 400
    assert not {(t["a"], t["b"]) for t in train} & {(t["a"], t["b"]) for t in held}
    assert {task_split(t) for t in train} == {"train"} and {task_split(t) for t in held} == {"heldout"}
    share = sum(task_split(t) == "heldout" for t in env.generate_tasks(4000, 5)) / 4000
    assert 0.09 < share < 0.16
    assert task_split({"a": 12, "b": 34}) == task_split({"a": 12, "b": 34, "phrasing": "multiply"})
    with pytest.raises(ValueError, match="split must be one of"):
        env.generate_tasks(1, 0, split="test")


def test_the_no_example_recipe_trains_on_the_training_phrasings() -> None:
    """grpo_calculator_no_example.yaml draws its tasks from TRAINING_PHRASINGS, both operations."""
    config = yaml.safe_load(
        (Path(__file__).parents[2] / "examples/configs/grpo_calculator_no_example.yaml").read_text()
    )
    env = CalculatorEnvironment(**config["environment"]["kwargs"])
    assert env.phrasings == TRAINING_PHRASINGS
