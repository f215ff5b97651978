"""The async replay buffer: staleness eviction, the sampling rule, the size bound, checkpoint/restore."""

import pytest

from posttrain.data.trajectory import ClosedContext, Trajectory
from posttrain.rollout.replay_buffer import ReplayBuffer, RolloutGroup


def _group(version: int, batch: int, gid: int = 0) -> RolloutGroup:
    t = Trajectory(
        [1, 2, 3], [0, 1, 1], [0.0, -0.5, -1.25], [{"role": "user", "content": "q"}], {"a": 1}, gid
    )
    t.turn_spans, t.stop_strings, t.policy_version = [(1, 2), (1, 3)], ("</s>",), version
    t.contexts = [ClosedContext([1, 2], [0, 1], [0.0, -0.25], [(1, 2)])]  # a turn of its own sequence
    return RolloutGroup([t], version, batch, {"env/accuracy": 0.5})


def test_stale_groups_are_evicted_and_counted():
    buffer = ReplayBuffer(capacity=8, max_age=1)
    for version in (0, 1, 2, 2):
        buffer.put(_group(version, version))
    # trainer at version 3: versions 0 and 1 are 3 and 2 updates old (> 1): dropped
    got = buffer.sample(2, version=3)
    assert [g.policy_version for g in got] == [2, 2]
    assert buffer.dropped == 2 and len(buffer) == 0


def test_sampling_takes_the_oldest_fresh_groups_of_any_version():
    buffer = ReplayBuffer(capacity=8, max_age=2)
    for i, version in enumerate((1, 2, 3, 3)):
        buffer.put(_group(version, i, gid=i))
    got = buffer.sample(3, version=3)  # no waiting for version 3: the oldest fresh groups first
    assert [g.trajectories[0].group_id for g in got] == [0, 1, 2]
    assert buffer.dropped == 0 and len(buffer) == 1


def test_sampling_returns_none_and_keeps_groups_when_short():
    buffer = ReplayBuffer(capacity=4, max_age=0)
    buffer.put(_group(5, 0))
    assert buffer.sample(2, version=5) is None
    assert len(buffer) == 1  # nothing taken while short
    assert buffer.sample(1, version=5)[0].policy_version == 5


def test_size_bound():
    buffer = ReplayBuffer(capacity=2, max_age=0)
    buffer.put(_group(0, 0))
    buffer.put(_group(0, 0))
    assert buffer.free == 0 and buffer.fill == 1.0
    with pytest.raises(OverflowError):
        buffer.put(_group(0, 1))
    with pytest.raises(ValueError):
        ReplayBuffer(capacity=0, max_age=0)


def test_checkpoint_restores_groups_order_versions_and_counters(tmp_path):
    import torch

    buffer = ReplayBuffer(capacity=4, max_age=1)
    for i, version in enumerate((0, 1, 1)):
        buffer.put(_group(version, i, gid=10 + i))
    buffer.sample(1, version=2)  # version 0 is 2 old: dropped; takes version 1
    torch.save(buffer.state_dict(), tmp_path / "state.pt")
    restored = ReplayBuffer(capacity=4, max_age=1)
    restored.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    assert restored.dropped == 1
    assert [(g.policy_version, g.batch_index) for g in restored.groups] == [(1, 2)]
    original, copy = buffer.groups[0].trajectories[0], restored.groups[0].trajectories[0]
    assert copy == original  # every field, tuples included
    small = ReplayBuffer(capacity=1, max_age=1)
    buffer.put(_group(2, 3))
    with pytest.raises(ValueError, match="async_buffer_groups"):
        small.load_state_dict(buffer.state_dict())
