"""Text2SQL (issue #33 item 4): execution match on a read-only SQLite database, and its red-team set."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from posttrain.environments.text2sql import Text2SQLEnvironment, same_result


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
