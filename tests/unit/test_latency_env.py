"""The `latency` benchmark wrapper (issue #34, item 1): its latencies are a function of (seed, episode,
turn) alone, and what it returns is its inner environment's, unchanged."""

from __future__ import annotations

import math
import statistics

import pytest

from posttrain.config.rollout import EnvironmentConfig
from posttrain.environments.group import EnvironmentGroup
from posttrain.environments.latency import LatencyEnvironment, latency_quantile, uniform_of
from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment
from posttrain.rollout.env_calls import concurrency_bound

PUZZLE = {"min_size": 2, "max_size": 2, "max_shuffle_moves": 3, "max_moves": 3}


def test_quantiles_by_hand():
    # every distribution's median is latency_ms
    for distribution in ("fixed", "lognormal", "pareto"):
        assert latency_quantile(0.5, latency_ms=200.0, distribution=distribution) == pytest.approx(
            200.0, rel=1e-15
        )
    # fixed ignores u
    assert latency_quantile(0.999, latency_ms=50.0, distribution="fixed") == 50.0
    # pareto, alpha 2: x_m = 200 / sqrt(2); at u = 0.75, x = x_m * 0.25^(-1/2) = 2 x_m = 200 sqrt(2)
    assert latency_quantile(0.75, latency_ms=200.0, distribution="pareto", alpha=2.0) == pytest.approx(
        200.0 * math.sqrt(2.0), rel=1e-14
    )
    # pareto, alpha 1: x = (200 / 2) / (1 - u); at u = 0.99, 10,000 ms (heavy tail)
    assert latency_quantile(0.99, latency_ms=200.0, distribution="pareto", alpha=1.0) == pytest.approx(
        10_000.0, rel=1e-12
    )
    # lognormal, sigma 0.5: at u = Phi(1), x = 200 e^0.5
    u = statistics.NormalDist().cdf(1.0)
    assert latency_quantile(u, latency_ms=200.0, distribution="lognormal", sigma=0.5) == pytest.approx(
        200.0 * math.exp(0.5), rel=1e-9
    )
    with pytest.raises(ValueError, match="fixed, lognormal or pareto"):
        latency_quantile(0.5, latency_ms=1.0, distribution="uniform")


def test_uniform_is_a_function_of_seed_and_conversation():
    log = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "up"}]
    u = uniform_of(3, log)
    assert 0.0 < u < 1.0
    assert uniform_of(3, [dict(m) for m in log]) == u  # equal content, other objects
    assert uniform_of(4, log) != u  # another seed
    assert uniform_of(3, log + [{"role": "user", "content": "x"}]) != u  # another turn


def _episodes(env, n: int = 4):
    """Episode starts of n puzzles and, per episode, a conversation after one reply."""
    tasks = env.generate_tasks(n, seed=5)
    starts = env.reset(tasks, list(range(n)))
    replies = [f"<action>{move}</action>" for move in ("up", "down", "left", "right", "view")][:n]
    logs = [s.messages + [{"role": "assistant", "content": r}] for s, r in zip(starts, replies, strict=True)]
    return tasks, starts, logs, [s.metadata for s in starts]


def test_same_seed_same_latencies_whatever_the_batch():
    a = LatencyEnvironment("sliding_puzzle", PUZZLE, latency_ms=200, distribution="pareto", seed=7)
    b = LatencyEnvironment("sliding_puzzle", PUZZLE, latency_ms=200, distribution="pareto", seed=7)
    _, _, logs, _ = _episodes(a)
    lat = a.latencies_ms(logs)
    assert b.latencies_ms(logs) == lat  # another instance, the same seed
    assert [a.latencies_ms([log])[0] for log in reversed(logs)] == lat[::-1]  # one at a time, any order
    assert len(set(lat)) == len(lat)  # conversations differ
    assert a.latencies_ms([logs[0], [dict(m) for m in logs[0]]]) == [lat[0]] * 2  # equal ones do not
    for log, x in zip(logs, lat, strict=True):
        want = latency_quantile(uniform_of(7, log), latency_ms=200, distribution="pareto", alpha=1.5)
        assert x == want
    other = LatencyEnvironment("sliding_puzzle", PUZZLE, latency_ms=200, distribution="pareto", seed=8)
    assert other.latencies_ms(logs) != lat
    capped = LatencyEnvironment(
        "sliding_puzzle", PUZZLE, latency_ms=200, distribution="pareto", seed=7, max_latency_ms=250
    )
    assert capped.latencies_ms(logs) == [min(x, 250.0) for x in lat]


def test_rewards_and_trajectories_are_the_inner_environments():
    inner = SlidingPuzzleEnvironment(**PUZZLE)
    wrapped = LatencyEnvironment("sliding_puzzle", PUZZLE, latency_ms=1, distribution="lognormal", seed=1)
    assert wrapped.generate_tasks(6, seed=2) == inner.generate_tasks(6, seed=2)
    tasks, starts, logs, metadata = _episodes(inner)
    assert wrapped.reset(tasks, list(range(len(tasks)))) == starts
    # replies that move, fail to parse and ask for the board: every outcome the inner environment has
    replies = ["<action>up</action>", "nonsense", "<action>view</action>", "<action>left</action>"]
    logs = [s.messages + [{"role": "assistant", "content": r}] for s, r in zip(starts, replies, strict=True)]
    want = inner.step(logs, metadata)
    got = wrapped.step(logs, metadata)
    assert got == want
    assert wrapped.batch_metrics(got) == inner.batch_metrics(want)


def test_a_call_waits_its_slowest_sample(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("posttrain.environments.latency.time.sleep", slept.append)
    env = LatencyEnvironment("sliding_puzzle", PUZZLE, latency_ms=100, distribution="lognormal", seed=2)
    _, _, logs, metadata = _episodes(env, 3)
    env.step(logs, metadata)
    assert slept == [max(env.latencies_ms(logs)) / 1000.0]
    zero = LatencyEnvironment("sliding_puzzle", PUZZLE, latency_ms=0, distribution="pareto")
    zero.step(logs, metadata)
    assert len(slept) == 1  # latency 0: no sleep at all


def test_config_checks_the_inner_turn_limit_and_arguments():
    cfg = EnvironmentConfig(
        name="latency",
        kwargs={"inner": "sliding_puzzle", "inner_kwargs": PUZZLE, "latency_ms": 50},
        max_turns=3,
    )
    assert cfg.max_concurrent_steps == 4
    with pytest.raises(ValueError, match=r"environment.kwargs.inner_kwargs.max_moves=3 is above"):
        EnvironmentConfig(
            name="latency", kwargs={"inner": "sliding_puzzle", "inner_kwargs": PUZZLE}, max_turns=2
        )
    with pytest.raises(ValueError, match="latency_ms must be >= 0"):
        LatencyEnvironment("sliding_puzzle", PUZZLE, latency_ms=-1)
    with pytest.raises(ValueError, match="cannot wrap another"):
        LatencyEnvironment("latency", {"inner": "sliding_puzzle"})


def test_only_environments_safe_for_threads_get_concurrent_calls():
    with EnvironmentGroup(
        "latency",
        {"inner": "sliding_puzzle", "inner_kwargs": PUZZLE},
        backend="local",
        max_concurrent_steps=3,
    ) as group:
        assert concurrency_bound(group) == 3
    with EnvironmentGroup("sliding_puzzle", PUZZLE, backend="local", max_concurrent_steps=3) as group:
        assert concurrency_bound(group) == 1  # not declared safe: one call at a time
    assert concurrency_bound(SlidingPuzzleEnvironment()) == 1
