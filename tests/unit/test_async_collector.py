"""The async collector with plain functions for generation: the staleness throttle, faults (a raising
and a hung generator stop the trainer with an error in bounded time), pausing, and weight snapshots
that cannot tear."""

import threading

import pytest
import torch

from posttrain.data.trajectory import Trajectory
from posttrain.rollout.async_collector import (
    AsyncCollector,
    GenerationFailed,
    GenerationStalled,
    busy_time,
    overlap_time,
)
from posttrain.rollout.replay_buffer import ReplayBuffer, RolloutGroup
from posttrain.weights.refit import SharedSnapshot, map_shared


def _groups(index: int, version: int, n: int = 2) -> list[RolloutGroup]:
    return [
        RolloutGroup([Trajectory([1], [0], [0.0], [], {}, group_id=index * n + i)], version, index)
        for i in range(n)
    ]


def _run_trainer(max_age: int, steps: int = 6) -> list[tuple[int, int, int]]:
    """A trainer that takes a batch and publishes the next version, `steps` times; (step, batch,
    age) of every group it trained on."""
    produced: list[tuple[int, int]] = []

    def produce(index: int, version: int) -> list[RolloutGroup]:
        produced.append((index, version))
        return _groups(index, version)

    collector = AsyncCollector(
        produce, lambda v: None, ReplayBuffer(2 * (max_age + 1), max_age), groups_per_batch=2, watchdog_s=30
    )
    collector.publish(0, lambda: None)
    collector.start()
    seen = []
    try:
        for step in range(steps):
            for g in collector.take(step):
                seen.append((step, g.batch_index, g.age(step)))
            collector.publish(step + 1, lambda: None)
    finally:
        collector.stop()
    assert collector.buffer.dropped == 0  # the throttle never makes a group only to drop it
    return seen


def test_age_zero_is_exactly_on_policy_in_order():
    seen = _run_trainer(max_age=0)
    assert [(s, b) for s, b, _ in seen] == [(s, s) for s in range(6) for _ in range(2)]
    assert all(age == 0 for _, _, age in seen)


def test_age_bound_holds_and_the_generator_runs_ahead():
    seen = _run_trainer(max_age=2, steps=8)
    assert [b for _, b, _ in seen] == [s for s in range(8) for _ in range(2)]  # FIFO, nothing skipped
    assert all(0 <= age <= 2 for _, _, age in seen)


def test_a_raising_generator_stops_the_trainer_with_its_error():
    def produce(index: int, version: int) -> list[RolloutGroup]:
        raise ConnectionError("environment worker gone")

    collector = AsyncCollector(produce, lambda v: None, ReplayBuffer(4, 1), groups_per_batch=2, watchdog_s=30)
    collector.publish(0, lambda: None)
    collector.start()
    with pytest.raises(GenerationFailed, match="environment worker gone") as info:
        collector.take(0)
    assert isinstance(info.value.__cause__, ConnectionError)


def test_a_hung_generator_trips_the_watchdog():
    release = threading.Event()

    def produce(index: int, version: int) -> list[RolloutGroup]:
        release.wait()
        return _groups(index, version)

    collector = AsyncCollector(
        produce, lambda v: None, ReplayBuffer(2, 0), groups_per_batch=2, watchdog_s=0.3
    )
    collector.publish(0, lambda: None)
    collector.start()
    try:
        with pytest.raises(GenerationStalled, match="async_watchdog_s"):
            collector.take(0)
        with pytest.raises(GenerationStalled):
            with collector.paused():
                pass
    finally:
        release.set()
        collector.stop()


def test_no_batch_starts_while_paused():
    started = []
    collector = AsyncCollector(
        lambda i, v: started.append(i) or _groups(i, v),
        lambda v: None,
        ReplayBuffer(8, 3),
        groups_per_batch=2,
        watchdog_s=30,
    )
    collector.publish(0, lambda: None)
    with collector.paused():
        collector.start()
        threading.Event().wait(0.2)
        assert started == []
    assert collector.take(0)[0].batch_index == 0
    collector.stop()


def test_weights_never_tear_between_publish_and_load():
    """The trainer rewrites a snapshot of 3 parameters (all equal to the version) while the generator
    loads it between batches; every load must see one version in every parameter."""
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(3)])
    snapshot = SharedSnapshot(model)
    views = [t for _, t in map_shared(snapshot.handle)]
    snapshot.close()
    loads: list[set[float]] = []

    def load(version: int) -> None:
        loads.append({float(v.min()) for v in views} | {float(v.max()) for v in views} | {float(version)})

    collector = AsyncCollector(
        lambda i, v: _groups(i, v), load, ReplayBuffer(64, 31), groups_per_batch=2, watchdog_s=30
    )

    def publish(version: int) -> None:
        def write() -> None:
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(float(version))
            snapshot.write(model)

        collector.publish(version, write)

    publish(0)
    collector.start()
    try:
        for step in range(30):
            collector.take(step)
            publish(step + 1)
    finally:
        collector.stop()
    assert len(loads) >= 2
    assert all(len(seen) == 1 for seen in loads), [s for s in loads if len(s) > 1][:3]


def test_busy_and_overlap_time():
    assert busy_time([(0.0, 2.0), (3.0, 5.0)], 1.0, 4.0) == pytest.approx(2.0)
    assert overlap_time([(0.0, 2.0), (3.0, 5.0)], [(1.5, 3.5)], 0.0, 10.0) == pytest.approx(1.0)
