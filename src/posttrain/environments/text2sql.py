"""Text-to-SQL on SQLite (Python's own `sqlite3`): a generated database, a question, a gold query.

A task is `{"db_seed": int, "question": str, "gold": str, "ordered": bool}` (`generate_tasks`, which keeps only
questions whose gold result has a value that is not NULL: an empty answer would pay any query that returns
nothing; with `split`, only training or only held-out questions, one question in five held out by the
hash of its text). The
database of a `db_seed` is built deterministically (a `staff` and a `products` table with rows drawn
from the seed) into a file of the environment's own temporary folder. The model answers with one
SELECT in a ```sql fenced block (the last block outside `<think>`). Reward 1 when the reply's result
set equals the gold query's, else 0:

- results compare as multisets of rows (order-insensitive) unless the task is `ordered` (the
  question asks for an order), then as lists; a float is compared rounded to 6 decimals;
- the reply runs on a read-only connection (`file:...?mode=ro` and `PRAGMA query_only`) under an
  authorizer that allows reading only (SELECT, reads, functions, recursive CTEs): writes, ATTACH,
  PRAGMA and every other action are denied and score 0;
- one statement only (sqlite3 refuses several), and a query (a statement with result columns); at most
  `max_rows` rows, strings and blobs of at most `MAX_VALUE_BYTES`;
- a query running longer than `timeout_s` is interrupted by a progress handler and scores 0.

A reply without a ```sql block scores 0 (no guessing of SQL in prose). Single turn.
"""

from __future__ import annotations

import random
import re
import shutil
import sqlite3
import tempfile
import time
import weakref
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from posttrain.environments.interface import (
    EnvStepResult,
    EpisodeStart,
    Message,
    last_assistant_content,
    register_environment,
)
from posttrain.environments.math import strip_think
from posttrain.environments.splits import check_split, question_split

SCHEMA = (
    "CREATE TABLE staff (id INTEGER PRIMARY KEY, name TEXT NOT NULL, dept TEXT NOT NULL, "
    "salary INTEGER NOT NULL, hired INTEGER NOT NULL)",
    "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, "
    "price REAL NOT NULL, stock INTEGER NOT NULL)",
)
DEPTS = ("sales", "research", "support", "finance")
CATEGORIES = ("tools", "garden", "kitchen", "toys")
NAMES = ("Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Max", "Nia")
ALLOWED_ACTIONS = frozenset(
    {
        sqlite3.SQLITE_SELECT,
        sqlite3.SQLITE_READ,
        sqlite3.SQLITE_FUNCTION,
        getattr(sqlite3, "SQLITE_RECURSIVE", 33),
    }
)
MAX_VALUE_BYTES = 1_000_000
"""Longest string or blob a query may make."""
_SQL_BLOCK = re.compile(r"```sql\s*\n?(.*?)```", re.IGNORECASE | re.DOTALL)


def build_database(path: Path, db_seed: int) -> None:
    """Write the database of `db_seed` to `path`: 8-12 staff rows and 8-12 product rows, distinct
    salaries and prices (so "highest" questions have one answer)."""
    rng = random.Random(db_seed)
    with sqlite3.connect(path) as db:
        for statement in SCHEMA:
            db.execute(statement)
        salaries = rng.sample(range(30, 120), rng.randint(8, 12))
        for i, salary in enumerate(salaries, start=1):
            row = (i, rng.choice(NAMES), rng.choice(DEPTS), salary * 1000, rng.randint(2010, 2024))
            db.execute("INSERT INTO staff VALUES (?, ?, ?, ?, ?)", row)
        prices = rng.sample(range(100, 5000), rng.randint(8, 12))
        for i, cents in enumerate(prices, start=1):
            row = (i, f"item{i}", rng.choice(CATEGORIES), cents / 100, rng.randint(0, 50))
            db.execute("INSERT INTO products VALUES (?, ?, ?, ?, ?)", row)
    db.close()


def draw_question(rng: random.Random) -> tuple[str, str, bool]:
    """(question, gold query, ordered) from TEMPLATES' kinds of question (counts, filters, orders,
    aggregates, groups), their constants drawn."""
    dept, category = rng.choice(DEPTS), rng.choice(CATEGORIES)
    k, salary, stock = rng.randint(2, 4), rng.randint(4, 10) * 10_000, rng.randint(5, 40)
    year, price = rng.randint(2012, 2022), rng.randint(10, 45)
    templates = [
        (f"How many staff work in {dept}?", f"SELECT COUNT(*) FROM staff WHERE dept = '{dept}'", False),
        (
            f"List the ids of staff earning more than {salary}.",
            f"SELECT id FROM staff WHERE salary > {salary}",
            False,
        ),
        (
            f"List the ids of the {k} best-paid staff, best-paid first.",
            f"SELECT id FROM staff ORDER BY salary DESC LIMIT {k}",
            True,
        ),
        (
            f"What is the average price of products in the {category} category?",
            f"SELECT AVG(price) FROM products WHERE category = '{category}'",
            False,
        ),
        (
            f"List the names of products with fewer than {stock} in stock, cheapest first.",
            f"SELECT name FROM products WHERE stock < {stock} ORDER BY price ASC",
            True,
        ),
        (
            "For each department, how many staff does it have? Give department and count.",
            "SELECT dept, COUNT(*) FROM staff GROUP BY dept",
            False,
        ),
        (
            f"What is the highest salary in {dept}?",
            f"SELECT MAX(salary) FROM staff WHERE dept = '{dept}'",
            False,
        ),
        (
            f"What is the total stock of products in the {category} category?",
            f"SELECT SUM(stock) FROM products WHERE category = '{category}'",
            False,
        ),
        (
            "What is the name of the most expensive product?",
            "SELECT name FROM products ORDER BY price DESC LIMIT 1",
            False,
        ),
        (
            f"List the names of staff hired after {year}.",
            f"SELECT name FROM staff WHERE hired > {year}",
            False,
        ),
        (
            f"How many products cost less than {price} dollars?",
            f"SELECT COUNT(*) FROM products WHERE price < {price}",
            False,
        ),
        (
            "For each category, what is the average price? Give category and average price.",
            "SELECT category, AVG(price) FROM products GROUP BY category",
            False,
        ),
    ]
    return rng.choice(templates)


def extract_sql(reply: str) -> str | None:
    """The last ```sql block of the reply outside its `<think>` reasoning, stripped; None without one."""
    blocks = _SQL_BLOCK.findall(strip_think(reply))
    return blocks[-1].strip() if blocks else None


def _authorize(action: int, *args: Any) -> int:
    return sqlite3.SQLITE_OK if action in ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def run_query(path: Path, sql: str, *, timeout_s: float, max_rows: int) -> list[tuple]:
    """The rows of `sql` on a read-only connection to `path`, reading only (see the module docstring);
    raises `sqlite3.Error` or `ValueError` for a query that is refused, fails, runs out of time or returns
    more than `max_rows` rows."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    try:
        db.execute("PRAGMA query_only = ON")
        db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)  # zeroblob(10**9) is an error, not 1 GB
        db.set_authorizer(_authorize)
        deadline = time.monotonic() + timeout_s
        db.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
        cursor = db.execute(sql)
        if cursor.description is None:  # REINDEX and other statements that are not queries
            raise ValueError("not a query: the statement returns no columns")
        rows = cursor.fetchmany(max_rows + 1)
    finally:
        db.close()
    if len(rows) > max_rows:
        raise ValueError(f"more than {max_rows} rows")
    return rows


def _normal(row: tuple) -> tuple:
    return tuple(round(v, 6) if isinstance(v, float) else v for v in row)


def same_result(got: list[tuple], gold: list[tuple], ordered: bool) -> bool:
    """Equal rows (floats rounded to 6 decimals): as lists when `ordered`, else as multisets."""
    got_n, gold_n = [_normal(r) for r in got], [_normal(r) for r in gold]
    return got_n == gold_n if ordered else Counter(got_n) == Counter(gold_n)


def has_answer(rows: list[tuple]) -> bool:
    """Whether a result answers anything: a row with a value that is not NULL (no rows, or an average
    over no rows, would pay any query that returns the same nothing)."""
    return any(v is not None for row in rows for v in row)


def question_prompt(question: str) -> str:
    """The user message: the schema, the question and the answer format."""
    schema = ";\n".join(SCHEMA)
    return (
        f"SQLite database schema:\n{schema};\n\nQuestion: {question}\n\n"
        "Answer with one SQLite SELECT query in a ```sql code block."
    )


SQL_PREFIX = "```sql\n"
SQL_STOP = ("```",)
WORKED_QUESTION = "What is the lowest price of a product in the toys category?"
WORKED_QUERY = "SELECT MIN(price) FROM products WHERE category = 'toys'"


def worked_example_turns() -> list[Message]:
    """One solved question as chat turns, in the task's own format."""
    return [
        {"role": "user", "content": question_prompt(WORKED_QUESTION)},
        {"role": "assistant", "content": f"```sql\n{WORKED_QUERY}\n```"},
    ]


def draw_novel_question(rng: random.Random) -> tuple[str, str, bool]:
    """(question, gold query, ordered) from kinds of question `draw_question` never asks, each a new
    combination of what its kinds use (MIN, two conditions, a filtered GROUP BY, a filter with an
    order, counts and averages over other columns), for `questions="novel"`."""
    dept, category = rng.choice(DEPTS), rng.choice(CATEGORIES)
    salary, stock = rng.randint(4, 10) * 10_000, rng.randint(5, 40)
    year, price = rng.randint(2012, 2022), rng.randint(10, 45)
    templates = [
        (
            f"What is the lowest salary in {dept}?",
            f"SELECT MIN(salary) FROM staff WHERE dept = '{dept}'",
            False,
        ),
        (
            f"How many products in the {category} category have fewer than {stock} in stock?",
            f"SELECT COUNT(*) FROM products WHERE category = '{category}' AND stock < {stock}",
            False,
        ),
        (
            f"List the ids of products costing more than {price} dollars.",
            f"SELECT id FROM products WHERE price > {price}",
            False,
        ),
        (
            f"What is the average salary of staff hired after {year}?",
            f"SELECT AVG(salary) FROM staff WHERE hired > {year}",
            False,
        ),
        (
            f"For each category, how many products have fewer than {stock} in stock? Give category and count.",
            f"SELECT category, COUNT(*) FROM products WHERE stock < {stock} GROUP BY category",
            False,
        ),
        (
            f"List the names of staff in {dept}, best-paid first.",
            f"SELECT name FROM staff WHERE dept = '{dept}' ORDER BY salary DESC",
            True,
        ),
        (
            f"How many staff earn more than {salary}?",
            f"SELECT COUNT(*) FROM staff WHERE salary > {salary}",
            False,
        ),
        (
            f"What is the total salary of staff in {dept}?",
            f"SELECT SUM(salary) FROM staff WHERE dept = '{dept}'",
            False,
        ),
    ]
    return rng.choice(templates)


QUESTION_SETS = {"standard": draw_question, "novel": draw_novel_question}
"""The question generators `Text2SQLEnvironment(questions=...)` draws from; no question is in both."""


@register_environment("text2sql")
class Text2SQLEnvironment:
    """Text-to-SQL with execution match (see the module docstring).

    Args:
        timeout_s: time limit of one query (the reply's and the gold one's).
        max_rows: most rows a query may return.
        examples: messages placed before the question (a worked example: a user turn made with
            `question_prompt` and the assistant's ```sql reply).
        worked_example: add `worked_example_turns()` to them: a MIN query, a kind of question
            `draw_question` never asks.
        sql_prefix: the reply begins with "```sql" and a newline, written by the environment (the
            episode's response prefix, not trained on), and generation stops at the closing fence: the
            model writes only the query (no prose after it, fewer tokens a reply).
        questions: "standard" (`draw_question`'s 12 kinds) or "novel" (`draw_novel_question`'s 8 other
            kinds, no question in common): e.g. a warm start on standard questions, then RL and
            evaluation on novel ones.
    Info: "sql" (extracted or None), "error" (why the reply's query did not run, or None), "match".
    """

    def __init__(
        self,
        timeout_s: float = 2.0,
        max_rows: int = 1000,
        examples: list[Message] | None = None,
        worked_example: bool = False,
        sql_prefix: bool = False,
        questions: Literal["standard", "novel"] = "standard",
    ) -> None:
        if questions not in QUESTION_SETS:
            raise ValueError(f"questions must be one of {sorted(QUESTION_SETS)}, got {questions!r}")
        self.timeout_s, self.max_rows, self.sql_prefix = timeout_s, max_rows, sql_prefix
        self.questions = questions
        self.examples = [dict(m) for m in examples or ()] + (worked_example_turns() if worked_example else [])
        self._folder: Path | None = None
        self._remove_folder: weakref.finalize | None = None

    def generate_tasks(self, count: int, seed: int, split: str | None = None) -> list[dict[str, Any]]:
        """`count` tasks drawn from `seed`: a database seed and a question of the `questions` set with
        its gold query; with `split` ("train" or "heldout"), only questions of that split
        (`question_split`), so the two never share a question."""
        check_split(split)
        rng = random.Random(seed)
        tasks: list[dict[str, Any]] = []
        while len(tasks) < count:
            question, gold, ordered = QUESTION_SETS[self.questions](rng)
            task = {"db_seed": rng.randrange(2**31), "question": question, "gold": gold, "ordered": ordered}
            if (split is None or question_split(question) == split) and has_answer(self._gold_rows(task)):
                tasks.append(task)
        return tasks

    def _gold_rows(self, task: dict[str, Any]) -> list[tuple]:
        path = self.database(task["db_seed"])
        return run_query(path, task["gold"], timeout_s=self.timeout_s, max_rows=self.max_rows)

    def database(self, db_seed: int) -> Path:
        """The file of `db_seed`'s database, built on first use."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="posttrain-text2sql-"))
            # removed by close(), else when this object is collected or the interpreter exits: a copy
            # of the environment (unpickled in a worker, built by an evaluation) that no one closes
            # must not leave its databases behind
            self._remove_folder = weakref.finalize(self, shutil.rmtree, self._folder, True)
        path = self._folder / f"{int(db_seed)}.sqlite"
        if not path.exists():
            partial = path.with_suffix(".partial")
            partial.unlink(missing_ok=True)
            build_database(partial, int(db_seed))
            partial.rename(path)
        return path

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """One single-turn episode per task (after the `examples` turns); the seeds are not needed."""
        return [
            EpisodeStart(
                messages=[
                    *(dict(m) for m in self.examples),
                    {"role": "user", "content": question_prompt(t["question"])},
                ],
                metadata=dict(t),
                stop_strings=SQL_STOP if self.sql_prefix else (),
                response_prefix=SQL_PREFIX if self.sql_prefix else "",
            )
            for t in tasks
        ]

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        scored = [
            self._score(last_assistant_content(log), meta)
            for log, meta in zip(message_logs, metadata, strict=True)
        ]
        return EnvStepResult.final([s[0] for s in scored], metadata, [s[1] for s in scored])

    def _score(self, reply: str, meta: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        sql = extract_sql(reply)
        info: dict[str, Any] = {"sql": sql, "error": None, "match": False}
        if sql is None:
            info["error"] = "no ```sql block"
            return 0.0, info
        gold = self._gold_rows(meta)
        try:
            got = run_query(
                self.database(meta["db_seed"]), sql, timeout_s=self.timeout_s, max_rows=self.max_rows
            )
        except (sqlite3.Error, ValueError) as e:
            info["error"] = f"{type(e).__name__}: {e}"[:300]
            return 0.0, info
        info["match"] = same_result(got, gold, bool(meta.get("ordered")))
        return float(info["match"]), info

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        n = max(len(results), 1)
        return {
            "env/accuracy": sum(results.rewards) / n,
            "env/sql_rate": sum(i.get("sql") is not None for i in results.info) / n,
            "env/sql_error_rate": sum(
                i.get("sql") is not None and i.get("error") is not None for i in results.info
            )
            / n,
        }

    def close(self) -> None:
        """Remove the databases' folder."""
        if self._remove_folder is not None:
            self._remove_folder()  # rmtree, once
        self._folder = self._remove_folder = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_folder": None, "_remove_folder": None}


def gold_transcript(env: Text2SQLEnvironment, task: dict[str, Any]) -> list[Message]:
    """The episode's first messages (`env.reset`) and the assistant turn answering with the gold query
    in a ```sql block: an SFT transcript whose reply the environment pays 1."""
    start = env.reset([task], [0])[0]
    return [*start.messages, {"role": "assistant", "content": f"```sql\n{task['gold']}\n```"}]


def _words(question: str) -> set[str]:
    return set(re.findall(r"[a-z0-9-]+", question.lower()))


def nearest_training_task(question: str, train: list[dict[str, Any]]) -> dict[str, Any]:
    """The training task whose question shares the most words with `question` (Jaccard; ties to the first)."""
    words = _words(question)
    return max(train, key=lambda t: len(words & _words(t["question"])) / len(words | _words(t["question"])))


def baselines(
    env: Text2SQLEnvironment, train: list[dict[str, Any]], heldout: list[dict[str, Any]]
) -> dict[str, Any]:
    """What a policy that does not read the question, or only looks it up in training, scores on
    `heldout` (execution match, as the reward):

    - best_fixed_query: the one query, among the training set's gold queries, that answers most held-out
      tasks when written for every task (a blind policy; its accuracy and the query);
    - nearest_training_query: for each held-out task the gold query of the training question sharing
      the most words with it (a lookup of the training set; right when the two questions differ only
      in a constant whose answer happens to coincide on the task's database)."""

    def accuracy(queries: list[str]) -> float:
        logs = [[{"role": "assistant", "content": f"```sql\n{q}\n```"}] for q in queries]
        return sum(env.step(logs, heldout).rewards) / len(heldout)

    fixed = {q: accuracy([q] * len(heldout)) for q in dict.fromkeys(t["gold"] for t in train)}
    best = max(fixed, key=lambda q: fixed[q])
    nearest = [nearest_training_task(t["question"], train)["gold"] for t in heldout]
    return {
        "best_fixed_query": fixed[best],
        "best_fixed_query_sql": best,
        "nearest_training_query": accuracy(nearest),
    }
