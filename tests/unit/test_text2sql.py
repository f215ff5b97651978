"""Text2SQL (issue #33 item 4): execution match on a read-only SQLite database, and its red-team set."""

from __future__ import annotations

import hashlib
import random
import re
import sqlite3
from pathlib import Path

import pytest

from posttrain.config import load_config
from posttrain.config.rl import GRPOConfig
from posttrain.data.tasks import build_tasks
from posttrain.environments.splits import question_split
from posttrain.environments.text2sql import (
    Text2SQLEnvironment,
    baselines,
    draw_novel_question,
    draw_question,
    has_answer,
    nearest_training_task,
    same_result,
    worked_example_turns,
)


@pytest.fixture
def env():
    environment = Text2SQLEnvironment(timeout_s=0.5)
    yield environment
    environment.close()


def reply(sql: str) -> str:
    return f"Here is the query.\n```sql\n{sql}\n```"


def score(env: Text2SQLEnvironment, task: dict, text: str) -> tuple[float, dict]:
    result = env.step([[{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]], [task])
    return result.rewards[0], result.info[0]


def task_of(env: Text2SQLEnvironment, gold: str, ordered: bool, db_seed: int = 7) -> dict:
    return {"db_seed": db_seed, "question": "?", "gold": gold, "ordered": ordered}


def shape(sql: str) -> str:
    """A gold query with its constants blanked: its kind of question."""
    return re.sub(r"'[^']*'|\d+", "?", sql)


def test_same_result_hand_cases() -> None:
    assert same_result([(1,), (2,)], [(2,), (1,)], ordered=False)
    assert not same_result([(1,), (2,)], [(2,), (1,)], ordered=True)
    assert not same_result([(1,), (1,)], [(1,)], ordered=False)  # a multiset: duplicates count
    assert same_result([(0.1 + 0.2,)], [(0.3,)], ordered=False)  # floats rounded to 6 decimals
    assert not same_result([(1, "a")], [(1,)], ordered=False)


def test_every_generated_gold_query_scores_one(env: Text2SQLEnvironment) -> None:
    tasks = env.generate_tasks(60, seed=0)
    assert env.generate_tasks(60, seed=0) == tasks  # deterministic in the seed
    assert {t["gold"].split()[1] for t in tasks} >= {"COUNT(*)", "id", "AVG(price)", "name", "dept,"}
    starts = env.reset(tasks, [0] * len(tasks))
    logs = [
        [*s.messages, {"role": "assistant", "content": reply(t["gold"])}]
        for s, t in zip(starts, tasks, strict=True)
    ]
    result = env.step(logs, [s.metadata for s in starts])
    assert result.rewards == [1.0] * len(tasks)


def test_split_tasks_never_share_a_question(env: Text2SQLEnvironment) -> None:
    """Training and held-out tasks come from disjoint sets of question texts (each question's split is the
    hash of its text, whatever the seed); both splits cover several kinds of question."""
    train = env.generate_tasks(200, seed=1, split="train")
    heldout = env.generate_tasks(64, seed=2, split="heldout")
    assert {question_split(t["question"]) for t in train} == {"train"}
    assert {question_split(t["question"]) for t in heldout} == {"heldout"}
    assert not {t["question"] for t in train} & {t["question"] for t in heldout}
    assert len({t["gold"].split(" FROM ")[0] for t in heldout}) >= 4
    with pytest.raises(ValueError, match="split must be one of"):
        env.generate_tasks(1, seed=0, split="test")


def test_every_kind_of_question_is_drawn_and_none_is_unanswerable(env: Text2SQLEnvironment) -> None:
    """All 12 kinds of question come up (gold queries with their constants blanked); a gold result with
    no row or only NULLs (an average over no rows) is never a task."""
    rng = random.Random(0)
    shapes = {shape(draw_question(rng)[1]) for _ in range(500)}
    assert len(shapes) == 12
    assert not has_answer([]) and not has_answer([(None,)])
    assert has_answer([(0,)]) and has_answer([(None, 1)])
    assert all(has_answer(env._gold_rows(task)) for task in env.generate_tasks(100, seed=5))


def test_examples_come_before_the_question(env: Text2SQLEnvironment) -> None:
    """Given examples, then the worked one, then the question. The worked question is a kind the
    generator never asks (so it never gives a task's answer away), and its query is right."""
    example = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": reply("SELECT 1")}]
    shown = Text2SQLEnvironment(examples=example, worked_example=True)
    task = env.generate_tasks(1, seed=0)[0]
    messages = shown.reset([task], [0])[0].messages
    assert messages[:2] == example and messages[2:4] == worked_example_turns()
    assert task["question"] in messages[4]["content"] and len(messages) == 5
    rng = random.Random(1)
    assert not any("MIN(" in draw_question(rng)[1] for _ in range(500))
    db = sqlite3.connect(env.database(task["db_seed"]))
    [(lowest,)] = db.execute("SELECT price FROM products WHERE category = 'toys' ORDER BY price LIMIT 1")
    db.close()
    worked = task_of(env, f"SELECT {lowest}", ordered=False, db_seed=task["db_seed"])
    assert score(env, worked, messages[3]["content"])[0] == 1.0
    shown.close()


def test_baselines_on_the_recipes_heldout_set(env: Text2SQLEnvironment) -> None:
    """The blind and lookup baselines the docs quote for grpo_text2sql.yaml's 64 held-out tasks, from
    the recipe's own config (1,000 training tasks): a policy that ignores the question, or copies the
    query of the most similar training question, answers few held-out tasks."""
    cfg = load_config(GRPOConfig, "examples/configs/grpo_text2sql.yaml", [])
    train = build_tasks(cfg.data.train, environment=env)
    heldout = build_tasks(cfg.data.validation, environment=env)
    assert len(train) == 1000 and len(heldout) == 64
    assert not {t["question"] for t in train} & {t["question"] for t in heldout}
    found = baselines(env, train, heldout)
    assert found["best_fixed_query"] == 4 / 64
    assert found["nearest_training_query"] == 5 / 64
    # each baseline is what its policy scores, task by task
    assert nearest_training_task(heldout[0]["question"], train)["question"] != heldout[0]["question"]


def test_novel_questions_are_other_kinds_and_every_gold_query_scores_one(env: Text2SQLEnvironment) -> None:
    """`questions="novel"`: 8 kinds of question, none of them a standard kind (gold queries with their
    constants blanked) and no question text in common; every novel gold query pays 1 on its database."""
    rng = random.Random(0)
    standard = [draw_question(rng) for _ in range(2000)]
    novel = [draw_novel_question(rng) for _ in range(2000)]
    assert len({shape(q[1]) for q in novel}) == 8
    assert not {shape(q[1]) for q in novel} & {shape(q[1]) for q in standard}
    assert not {q[0] for q in novel} & {q[0] for q in standard}
    other = Text2SQLEnvironment(timeout_s=0.5, questions="novel")
    tasks = other.generate_tasks(80, seed=3, split="heldout")
    assert {question_split(t["question"]) for t in tasks} == {"heldout"}
    logs = [[{"role": "assistant", "content": reply(t["gold"])}] for t in tasks]
    assert other.step(logs, tasks).rewards == [1.0] * len(tasks)
    other.close()
    with pytest.raises(ValueError, match="questions must be one of"):
        Text2SQLEnvironment(questions="hard")


def test_novel_recipe_trains_and_validates_on_novel_kinds_with_its_baselines() -> None:
    """grpo_text2sql_novel.yaml: GRPO on the novel kinds' training split, validation on their held-out
    split (no question in common), after a warm start on standard kinds only; the blind and lookup
    baselines the docs quote for its 64 held-out tasks."""
    cfg = load_config(GRPOConfig, "examples/configs/grpo_text2sql_novel.yaml", [])
    assert cfg.environment.kwargs["questions"] == "novel"
    novel = Text2SQLEnvironment(**cfg.environment.kwargs)
    train = build_tasks(cfg.data.train, environment=novel)
    heldout = build_tasks(cfg.data.validation, environment=novel)
    assert len(train) == 1000 and len(heldout) == 64
    assert not {t["question"] for t in train} & {t["question"] for t in heldout}
    assert len({shape(t["gold"]) for t in heldout}) == 8  # every novel kind held out
    sft = load_config(GRPOConfig, "examples/configs/grpo_text2sql.yaml", []).data.train
    standard = build_tasks(sft, environment=Text2SQLEnvironment())
    assert not {t["question"] for t in standard} & {t["question"] for t in train + heldout}
    found = baselines(novel, train, heldout)
    assert found["best_fixed_query"] == 6 / 64
    assert found["nearest_training_query"] == 6 / 64
    novel.close()


def test_equivalent_queries_match_and_order_counts_only_when_asked(env: Text2SQLEnvironment) -> None:
    db = sqlite3.connect(env.database(7))
    depts = db.execute("SELECT dept FROM staff").fetchall()
    db.close()
    dept = depts[0][0]
    count = task_of(env, f"SELECT COUNT(*) FROM staff WHERE dept = '{dept}'", ordered=False)
    assert score(env, count, reply(f"SELECT COUNT(id) FROM staff WHERE '{dept}' = dept"))[0] == 1.0
    assert (
        score(env, count, reply(f"SELECT {sum(d == (dept,) for d in depts)}"))[0] == 1.0
    )  # the right number
    assert score(env, count, reply(f"SELECT {sum(d == (dept,) for d in depts) + 1}"))[0] == 0.0
    unordered = task_of(env, "SELECT id FROM staff WHERE salary > 0", ordered=False)
    assert score(env, unordered, reply("SELECT id FROM staff ORDER BY salary ASC"))[0] == 1.0
    ordered = task_of(env, "SELECT id FROM staff ORDER BY salary DESC LIMIT 3", ordered=True)
    assert score(env, ordered, reply("SELECT id FROM staff ORDER BY salary DESC LIMIT 3"))[0] == 1.0
    reversed_order = (
        "SELECT id FROM (SELECT id, salary FROM staff ORDER BY salary DESC LIMIT 3) ORDER BY salary"
    )
    assert score(env, ordered, reply(reversed_order))[0] == 0.0


RED_TEAM = [
    "DELETE FROM staff",
    "UPDATE staff SET salary = 0",
    "INSERT INTO staff VALUES (99, 'X', 'sales', 1, 2020)",
    "DROP TABLE staff",
    "CREATE TABLE t (a)",
    "CREATE TEMP TABLE t (a)",
    "ATTACH DATABASE '{tmp}/attached.db' AS other",
    "ATTACH ':memory:' AS other",
    "DETACH main",
    "VACUUM INTO '{tmp}/copy.db'",
    "PRAGMA query_only = 0",
    "PRAGMA writable_schema = 1",
    "REINDEX",
    "ANALYZE",
    "SELECT load_extension('libc.so.6')",
    "{gold}; DELETE FROM staff",  # several statements
    "{gold}; {gold}",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c",  # loops
    "SELECT COUNT(*) FROM staff a, staff b, staff c, staff d, staff e, staff f, staff g, staff h, staff i",
    "SELECT zeroblob(500000000)",
    "SELECT randomblob(2000000)",
    "SELECT s.id FROM staff s, staff t, staff u, staff v",  # more rows than max_rows
]


def test_red_team_replies_score_zero_and_leave_the_database_unchanged(
    env: Text2SQLEnvironment, tmp_path: Path
) -> None:
    task = env.generate_tasks(1, seed=3)[0]
    path = env.database(task["db_seed"])
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    for sql in RED_TEAM:
        text = reply(sql.format(tmp=tmp_path, gold=task["gold"]))
        reward, info = score(env, task, text)
        assert reward == 0.0, sql
        assert info["error"] is not None, sql
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert not list(tmp_path.iterdir())  # nothing attached or copied out
    assert score(env, task, reply(task["gold"]))[0] == 1.0  # the gold query still pays


def test_answers_outside_a_sql_block_or_inside_think_score_zero(env: Text2SQLEnvironment) -> None:
    task = env.generate_tasks(1, seed=4)[0]
    gold = task["gold"]
    for text in [
        gold,  # no fenced block
        f"The query is {gold}.",
        f"<think>\n```sql\n{gold}\n```\n</think> I am not sure.",
        f"```sql\n{gold}\n```\nor maybe\n```sql\nSELECT 1\n```",  # the last block counts
        "```sql\n```",
    ]:
        assert score(env, task, text)[0] == 0.0, text
    assert score(env, task, f"<think>hmm</think>\n```SQL\n{gold}\n```")[0] == 1.0


def test_sql_prefix_opens_the_block_and_the_fence_stops_the_reply(env: Text2SQLEnvironment) -> None:
    """With sql_prefix the episode's reply begins with the environment's "```sql" line (not generated)
    and generation stops at the closing fence; the assistant message (prefix + reply) is scored as any
    other. Without it, nothing is added."""
    prefixed = Text2SQLEnvironment(sql_prefix=True)
    task = env.generate_tasks(1, seed=0)[0]
    start = prefixed.reset([task], [0])[0]
    assert start.response_prefix == "```sql\n" and start.stop_strings == ("```",)
    assert score(prefixed, task, start.response_prefix + task["gold"] + "\n```")[0] == 1.0
    assert score(prefixed, task, start.response_prefix + "SELECT 1\n```")[0] == 0.0
    plain = env.reset([task], [0])[0]
    assert plain.response_prefix == "" and plain.stop_strings == ()
    prefixed.close()


def test_gold_transcripts_are_the_episodes_and_pay_one(env: Text2SQLEnvironment, tmp_path: Path) -> None:
    """examples/text2sql_transcripts.py writes, per task, the episode's own first messages and the gold
    query's reply: the environment pays it 1, and a training file shows no held-out question."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("t2s_transcripts", "examples/text2sql_transcripts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "sft.jsonl"
    module.main([str(out), "--count", "20", "--seed", "3", "--env", '{"sql_prefix": true}'])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    prefixed = Text2SQLEnvironment(sql_prefix=True)
    for row in rows:
        start = prefixed.reset([row["task"]], [0])[0]
        assert row["messages"][:-1] == start.messages
        assert row["messages"][-1]["content"].startswith(start.response_prefix)
        assert score(prefixed, row["task"], row["messages"][-1]["content"])[0] == 1.0
        assert question_split(row["task"]["question"]) == "train"
    prefixed.close()


def test_databases_are_removed_by_close_collection_or_exit() -> None:
    """close() removes the databases' folder; an environment nobody closes removes it when collected,
    and at interpreter exit (a copy in a worker or an evaluation must not leave its databases in /tmp)."""
    import gc
    import pickle
    import subprocess
    import sys

    closed = Text2SQLEnvironment()
    task = closed.generate_tasks(1, seed=0)[0]
    folder = closed.database(task["db_seed"]).parent
    copy = pickle.loads(pickle.dumps(closed))  # a copy builds its own folder
    copy_folder = copy.database(task["db_seed"]).parent
    assert folder.is_dir() and copy_folder.is_dir() and copy_folder != folder
    closed.close()
    closed.close()  # idempotent
    assert not folder.exists() and copy_folder.is_dir()
    del copy
    gc.collect()
    assert not copy_folder.exists()
    code = (
        "from posttrain.environments.text2sql import Text2SQLEnvironment as E\n"
        "e = E()\n"
        "print(e.database(e.generate_tasks(1, seed=0)[0]['db_seed']).parent)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    exited = Path(out.strip().splitlines()[-1])
    assert exited.name.startswith("posttrain-text2sql-") and not exited.exists()
