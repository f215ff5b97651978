"""The transformers judge in its own Ray actor: it reserves its CPUs from Ray's scheduler while it
lives (and gives them back on close), judges for a judge environment that itself runs in an
environment actor, and a parse of its reply decides whether the sample is scored."""

from __future__ import annotations

import time

import pytest

from posttrain.environments.group import EnvironmentGroup
from posttrain.environments.judge import JudgeEnvironment, parse_score


def sample(question: str, reply: str) -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]


def free_cpus() -> float:
    import ray

    return ray.available_resources().get("CPU", 0.0)


def wait_for_cpus(expected: float, deadline_s: float = 30.0) -> float:
    """Ray's resource view is eventually consistent: poll until it shows `expected` or time is up."""
    end = time.monotonic() + deadline_s
    while free_cpus() != expected and time.monotonic() < end:
        time.sleep(0.2)
    return free_cpus()


@pytest.mark.ray
def test_the_judge_actor_holds_its_own_cpu(ray_cluster, tiny_model_dir) -> None:
    before = wait_for_cpus(3.0)
    env = JudgeEnvironment(
        model=str(tiny_model_dir), actor=True, actor_cpus=1, reply_prefix="Score:", max_new_tokens=4
    )
    try:
        assert wait_for_cpus(before - 1) == before - 1
        logs = [sample("What is 2+2?", "4"), sample("Name a colour.", "red")]
        r = env.step(logs, [{}, {}])
        texts = [i["judge_text"] for i in r.info]
        assert all(t.startswith("Score:") for t in texts)
        assert r.scored == [parse_score(t) is not None for t in texts]
        assert env.batch_metrics(r)["env/judge_requests"] == 2
    finally:
        env.close()
    assert wait_for_cpus(before) == before


@pytest.mark.ray
def test_a_judge_actor_inside_an_environment_actor(ray_cluster, tiny_model_dir) -> None:
    """EnvironmentGroup's actor builds the judge environment, which starts the judge's own actor;
    shutting the group down ends both."""
    before = wait_for_cpus(3.0)
    kwargs = dict(
        model=str(tiny_model_dir), actor=True, actor_cpus=1, reply_prefix="Score:", max_new_tokens=4
    )
    group = EnvironmentGroup("judge", kwargs, num_workers=1, backend="ray")
    try:
        assert wait_for_cpus(before - 1) == before - 1
        logs = [sample("q", "a"), sample("q", "a")]
        r = group.step(logs, [{}, {}])
        assert [i["cache_hit"] for i in r.info] == [False, True]
        m = group.batch_metrics(r)
        assert m["env/judge_calls"] == 2 and m["env/judge_requests"] == 1 and m["env/judge_cache_hits"] == 1
    finally:
        group.shutdown()
    assert wait_for_cpus(before) == before
