"""LLM-as-judge (pointwise): score parsing (hand cases and a seeded fuzz), mapping, parse failures and
backend failures masked (scored=False), the verdict cache, and a real transformers judge (tiny model)."""

from __future__ import annotations

import random

import pytest

from posttrain.environments import make_environment
from posttrain.environments.judge import (
    DEFAULT_PATTERN,
    FunctionJudge,
    JudgeEnvironment,
    TransformersJudge,
    normalise,
    parse_score,
)


def sample(question: str, reply: str) -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Good answer.\nScore: 7", 7.0),
        ("score=3.5", 3.5),
        ("**Score:** 9", 9.0),  # markdown bold around the label
        ("Score: **9**", 9.0),
        ("Score: 2 ... on reflection, Score: 8", 8.0),  # the last one counts
        ("Score: 11", None),  # out of range
        ("Score: 0", None),
        ("Score: -3", None),
        ("I give it an 8.", None),  # no pattern match
        ("Score: 7/10", 7.0),
        ("Score: 1e400", None),  # not the number 1
        ("Score: 7th place", None),
        ("Score: 3.9c", None),  # not 3
        ("", None),
        ("Score: 10", 10.0),
        ("Score: 1", 1.0),
    ],
)
def test_parse_score_hand_cases(text: str, expected: float | None) -> None:
    assert parse_score(text) == expected


def test_parse_score_fuzz() -> None:
    """Seeded fuzz: random junk around a planted 'Score: s' gives s back when s is in range, None
    when out of range, and junk alone (without the word score) never gives a score; nothing raises."""
    rng = random.Random(0)
    alphabet = "abc xyz:=*\n.-0123456789Sé😀\t"
    for _ in range(2000):
        junk = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        tail = rng.choice([" ", ".", "\n", "/10", "!"]) + "".join(
            rng.choice("abc .\n!") for _ in range(rng.randint(0, 9))
        )
        value = rng.choice([rng.randint(-5, 15), round(rng.uniform(-5, 15), 2)])
        got = parse_score(f"{junk}\nScore: {value}{tail}")
        assert got == (float(value) if 1 <= value <= 10 else None), (junk, value, tail)
        plain = junk.replace("S", "s").replace("s", "")  # no 'score' possible
        assert parse_score(plain) is None
    for text in ["Score: nan", "Score: 1e400", "Score: " + "9" * 500, "Score:\x00 5"]:
        assert parse_score(text) is None


def test_normalise_maps_the_range_to_unit_interval() -> None:
    assert [normalise(s, 1, 10) for s in (1, 10, 5.5)] == [0.0, 1.0, 0.5]
    assert normalise(3, 0, 4) == 0.75


def test_scores_parse_failures_and_the_cache() -> None:
    prompts: list[str] = []

    def rule(prompt: str) -> str:  # a rule-based judge: 10 for a reply containing 42, else 4
        prompts.append(prompt)
        if "gibberish" in prompt:
            return "I cannot rate this."
        return "Score: 10" if "Answer:\n42" in prompt else "Reason: wrong.\nScore: 4"

    env = JudgeEnvironment(backend=FunctionJudge(rule))
    logs = [sample("6*7?", "42"), sample("6*7?", "41"), sample("6*7?", "gibberish")]
    r = env.step(logs, [{}, {}, {}])
    assert r.rewards == [1.0, pytest.approx(3 / 9), 0.0] and r.scored == [True, True, False]
    assert r.info[2]["judge_error"] == "parse_failure" and len(prompts) == 3
    assert "Question:\n6*7?" in prompts[0] and "reference" not in prompts[0]
    m = env.batch_metrics(r)
    assert m["env/judge_parse_failures"] == 1.0 and m["env/judge_cache_hits"] == 0.0
    assert m["env/judge_score_mean"] == pytest.approx(7.0)
    again = env.step(logs[:2] + [sample("6*7?", "43")], [{}, {}, {}])
    assert len(prompts) == 4 and [i["cache_hit"] for i in again.info] == [True, True, False]
    assert again.rewards[:2] == r.rewards[:2] and env.batch_metrics(again)["env/judge_cache_hits"] == 2.0
    with_reference = env.step([sample("6*7?", "42")], [{"reference": "forty-two"}])
    assert "A reference answer:\nforty-two" in prompts[-1] and not with_reference.info[0]["cache_hit"]


def test_the_cache_is_bounded() -> None:
    calls: list[str] = []
    env = JudgeEnvironment(backend=FunctionJudge(lambda p: calls.append(p) or "Score: 5"), cache_size=2)
    for reply in ("a", "b", "c", "a"):  # a is evicted by c
        env.step([sample("q", reply)], [{}])
    assert len(calls) == 4 and len(env._cache) == 2


def test_a_failing_backend_masks_the_batch() -> None:
    def broken(prompt: str) -> str:
        raise ConnectionError("judge unreachable")

    env = JudgeEnvironment(backend=FunctionJudge(broken))
    r = env.step([sample("q", "a"), sample("q", "b")], [{}, {}])
    assert r.scored == [False, False] and r.rewards == [0.0, 0.0]
    assert "ConnectionError: judge unreachable" in r.info[0]["judge_error"]
    assert env.batch_metrics(r)["env/judge_errors"] == 2.0


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="max_score"):
        JudgeEnvironment(backend=FunctionJudge(str), min_score=5, max_score=5)
    with pytest.raises(ValueError, match="group"):
        JudgeEnvironment(backend=FunctionJudge(str), pattern=r"Score: \d+")
    assert DEFAULT_PATTERN and isinstance(make_environment("judge", cache_size=0), JudgeEnvironment)


def test_a_real_transformers_judge(tiny_model_dir) -> None:
    """A tiny random model as the judge: it writes text (no score: the samples are masked), and
    the verdict is cached, so the second step does not generate again."""
    backend = TransformersJudge(str(tiny_model_dir), max_new_tokens=8, batch_size=2)
    env = JudgeEnvironment(backend=backend)
    logs = [sample("What is 2+2?", "4"), sample("What is 2+2?", "5"), sample("Name a colour.", "red")]
    r = env.step(logs, [{}] * 3)
    texts = [i["judge_text"] for i in r.info]
    assert all(isinstance(t, str) and t for t in texts)
    for text, ok in zip(texts, r.scored, strict=True):
        assert ok == (parse_score(text) is not None)
    again = env.step(logs, [{}] * 3)
    assert [i["cache_hit"] for i in again.info] == [True] * 3 and [
        i["judge_text"] for i in again.info
    ] == texts
