"""LLM-as-judge: score and label parsing (hand cases and seeded fuzz), mapping, parse failures and
backend failures masked (scored=False), the verdict cache, pairwise win rates and the position-swap
cancellation, reference-match (verifier first), and a real transformers judge (tiny model)."""

from __future__ import annotations

import random

import pytest

from posttrain.environments import make_environment
from posttrain.environments.judge import (
    DEFAULT_PATTERN,
    PAIRWISE_LABELS,
    PAIRWISE_PATTERN,
    REFERENCE_LABELS,
    REFERENCE_PATTERN,
    FunctionJudge,
    JudgeEnvironment,
    TransformersJudge,
    normalise,
    parse_label,
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


@pytest.mark.slow
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


# ---------------------------------------------------------------------------- pairwise and reference


def test_parse_label_hand_cases() -> None:
    cases = {
        "A is clearer.\nWinner: A": 1.0,
        "Winner: B": 0.0,
        "winner = tie": 0.5,
        "**Winner:** Answer B": 0.0,
        "Winner: A ... no, Winner: B": 0.0,  # the last one counts
        "Winner: C": None,
        "Winner: Alice": None,  # not the label A
        "Winner: a tie": None,  # lower-case a is not a label; 'tie' is not after the colon
        "I prefer A.": None,
        "": None,
    }
    for text, expected in cases.items():
        assert parse_label(text, PAIRWISE_PATTERN, PAIRWISE_LABELS) == expected, text
    assert parse_label("Verdict: YES", REFERENCE_PATTERN, REFERENCE_LABELS) == 1.0
    assert parse_label("verdict: no.", REFERENCE_PATTERN, REFERENCE_LABELS) == 0.0
    assert parse_label("Verdict: nope", REFERENCE_PATTERN, REFERENCE_LABELS) is None
    assert parse_label("Verdict: maybe", REFERENCE_PATTERN, REFERENCE_LABELS) is None


def test_parsers_never_raise_on_adversarial_replies() -> None:
    """Seeded fuzz over junk, regex metacharacters, huge numbers and control characters: every parser
    returns a value of its own kind or None, and never raises."""
    rng = random.Random(1)
    alphabet = "AaBbTtieYesNo Winner Verdict Score:=*\n\t.-+0123456789()[]{}\\$^|?é😀\x00"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        if rng.random() < 0.3:
            text += rng.choice(["Winner: ", "Verdict: ", "Score: "]) + rng.choice(
                ["A", "B", "tie", "yes", "no", "1e999", "-0", "nan", "10.0000001", "7", "", "**"]
            )
        score = parse_score(text)
        assert score is None or 1 <= score <= 10
        assert parse_label(text, PAIRWISE_PATTERN, PAIRWISE_LABELS) in (None, 0.0, 0.5, 1.0)
        assert parse_label(text, REFERENCE_PATTERN, REFERENCE_LABELS) in (None, 0.0, 1.0)


def test_environments_fed_junk_replies_never_crash_and_mask_exactly_the_unparsed() -> None:
    """Every mode under a judge that replies junk: nothing raises, rewards stay in [0, 1], and a sample
    is scored exactly when some verdict of it parsed."""
    rng = random.Random(2)
    pieces = ["Score: 7", "Score: 99", "Winner: A", "Winner: B", "Winner: tie", "Verdict: yes", "Verdict: no"]

    def junk(prompt: str) -> str:
        if rng.random() < 0.1:
            raise TimeoutError("judge timed out")
        return "".join(
            rng.choice(["x", "\n", "*", ":", " ", rng.choice(pieces)]) for _ in range(rng.randint(0, 6))
        )

    logs = [sample("q1", f"reply {k % 3}") for k in range(4)] + [sample("q2", f"r {k}") for k in range(4)]
    for mode in ("pointwise", "pairwise", "reference"):
        env = JudgeEnvironment(mode=mode, backend=FunctionJudge(junk), cache_size=0, verifier=None)
        for _ in range(20):
            r = env.step(logs, [{"answer": "42"}] * len(logs))
            assert all(0.0 <= x <= 1.0 for x in r.rewards)
            for reward, ok, info in zip(r.rewards, r.scored, r.info, strict=True):
                assert ok == ("judge_error" not in info)
                assert ok or reward == 0.0
            metrics = env.batch_metrics(r)
            assert metrics["env/judge_masked"] == r.scored.count(False)


def group(question: str, replies: list[str]) -> list[list[dict]]:
    return [sample(question, r) for r in replies]


def test_pairwise_win_rates_hand_worked() -> None:
    """A fair judge (the longer reply wins, equal lengths tie): in a group with replies of lengths
    1, 2, 2 and 3, sample wins/ties over its 6 ordered comparisons give 0/6, 3/6, 3/6, 6/6."""

    def longer(prompt: str) -> str:
        a = prompt.split("Answer A:\n")[1].split("\n\nAnswer B:")[0]
        b = prompt.split("Answer B:\n")[1].split("\n\n")[0]
        return "Winner: tie" if len(a) == len(b) else f"Winner: {'A' if len(a) > len(b) else 'B'}"

    env = JudgeEnvironment(mode="pairwise", backend=FunctionJudge(longer))
    logs = group("q", ["x", "yy", "zz", "www"]) + group("other", ["a", "bb"])
    r = env.step(logs, [{}] * 6)
    assert r.rewards == [0.0, 0.5, 0.5, 1.0, 0.0, 1.0] and all(r.scored)
    assert [i["judge_comparisons"] for i in r.info] == [6, 6, 6, 6, 2, 2]
    m = env.batch_metrics(r)
    assert m["env/judge_calls"] == 6 * 2 + 1 * 2 and m["env/judge_position_consistency"] == 1.0


def test_pairwise_cancels_a_position_bias() -> None:
    """A judge that always prefers the answer in position A gives every sample of a group the same
    reward (0.5), whatever the replies: each pair is judged in both orders."""
    env = JudgeEnvironment(mode="pairwise", backend=FunctionJudge(lambda p: "Winner: A"))
    logs = group("q", ["great answer", "bad", "meh", "wrong"])
    r = env.step(logs, [{}] * 4)
    assert r.rewards == [0.5] * 4 and all(r.scored)
    assert env.batch_metrics(r)["env/judge_position_consistency"] == 0.0
    # a judge that always says B: the same
    env_b = JudgeEnvironment(mode="pairwise", backend=FunctionJudge(lambda p: "Winner: B"))
    assert env_b.step(logs, [{}] * 4).rewards == [0.5] * 4


def test_pairwise_identical_replies_tie_without_the_judge_and_failures_mask() -> None:
    calls: list[str] = []

    def judge(prompt: str) -> str:
        calls.append(prompt)
        if "broken" in prompt:
            raise ConnectionError("judge down")
        return "Winner: A"

    env = JudgeEnvironment(mode="pairwise", backend=FunctionJudge(judge))
    r = env.step(group("q", ["same", "same"]), [{}, {}])
    assert r.rewards == [0.5, 0.5] and r.scored == [True, True] and calls == []
    # every comparison of 'broken' fails: it is masked, the other two still compare with each other
    r = env.step(group("q2", ["broken", "b", "c"]), [{}] * 3)
    assert r.scored == [False, True, True] and r.rewards == [0.0, 0.5, 0.5]
    assert "ConnectionError: judge down" in r.info[0]["judge_error"]
    alone = env.step([sample("q3", "only one")], [{}])
    assert alone.scored == [False] and alone.info[0]["judge_error"] == "no_comparison"


@pytest.mark.slow
def test_reference_mode_verifies_first_and_judges_the_rest() -> None:
    prompts: list[str] = []

    def judge(prompt: str) -> str:
        prompts.append(prompt)
        return "Verdict: yes" if "five" in prompt else ("Verdict: no" if "6" in prompt else "hmm")

    env = JudgeEnvironment(mode="reference", backend=FunctionJudge(judge))
    try:
        logs = group("2+3?", ["\\boxed{5}", "\\boxed{5.0}", "it is five", "\\boxed{6}", "no idea"])
        r = env.step(logs, [{"answer": "5"}] * 5)
        assert r.rewards == [1.0, 1.0, 1.0, 0.0, 0.0] and r.scored == [True, True, True, True, False]
        assert [i["verifier_match"] for i in r.info] == [True, True, False, False, False]
        assert len(prompts) == 3 and "Reference answer:\n5" in prompts[0]  # the verified two are not judged
        m = env.batch_metrics(r)
        assert m["env/verifier_match_rate"] == 0.4 and m["env/judge_calls"] == 3
        assert m["env/judge_parse_failures"] == 1 and m["env/judge_masked"] == 1
        assert m["env/accuracy"] == 0.2  # ground truth: only "\\boxed{5}" equals "5" as a string
        with pytest.raises(ValueError, match="reference"):
            env.step([sample("q", "a")], [{}])
    finally:
        env.close()


def test_reply_prefix_is_sent_and_parsed() -> None:
    seen: list[list[dict]] = []

    class Continues:
        def complete(self, conversations):
            seen.extend(conversations)
            return [" 8" for _ in conversations]

    env = JudgeEnvironment(backend=Continues(), reply_prefix="Score:")
    r = env.step([sample("q", "a")], [{}])
    assert seen[0][-1] == {"role": "assistant", "content": "Score:"}
    assert r.info[0]["judge_text"] == "Score: 8" and r.rewards == [pytest.approx(7 / 9)]


def test_repeats_in_one_batch_hit_the_cache_and_metrics_count_them() -> None:
    calls: list[str] = []
    env = JudgeEnvironment(backend=FunctionJudge(lambda p: calls.append(p) or "Score: 10"))
    r = env.step(group("q", ["a", "a", "a", "b"]), [{}] * 4)
    assert len(calls) == 2 and [i["cache_hit"] for i in r.info] == [False, True, True, False]
    m = env.batch_metrics(r)
    assert m["env/judge_requests"] == 2 and m["env/judge_cache_hit_rate"] == 0.5
    assert m["env/judge_latency_s"] >= 0 and m["env/judge_parse_failure_rate"] == 0.0


def test_a_backend_that_raises_or_returns_too_few_masks_the_call() -> None:
    class Short:
        def complete(self, conversations):
            return ["Score: 5"]

    r = JudgeEnvironment(backend=Short()).step(group("q", ["a", "b"]), [{}, {}])
    assert r.scored == [False, False] and "1 replies for 2" in r.info[0]["judge_error"]


def test_backend_config_errors() -> None:
    with pytest.raises(ValueError, match="base_url"):
        JudgeEnvironment(backend="http")
    with pytest.raises(ValueError, match="backend"):
        JudgeEnvironment(backend="openai")
    with pytest.raises(ValueError, match="mode"):
        JudgeEnvironment(mode="listwise", backend=FunctionJudge(str))


def test_the_docs_example_runs() -> None:
    """The `FunctionJudge` example of docs/environments.md (LLM as judge) works as written."""
    import re
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "environments.md").read_text()
    section = page[page.index("## LLM as judge") : page.index("## Run environments in workers")]
    (block,) = [b for b in re.findall(r"```py\n(.*?)```", section, re.S) if "FunctionJudge(" in b]
    namespace: dict = {}
    exec(block, namespace)
    r = namespace["env"].step([sample("q", "\\boxed{3}"), sample("q", "3")], [{}, {}])
    assert r.rewards == [1.0, 0.0] and r.scored == [True, True]
