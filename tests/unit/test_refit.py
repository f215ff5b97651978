"""Refit transports (packed buckets, their numpy form for the object store, shared flat weights) and
the weights checksum, on small hand-made tensors."""

import os

import torch

from posttrain.models.refit import (
    NumpyBucket,
    SharedFlatWeights,
    load_packed,
    map_shared,
    pack_state_dict,
    unpack,
    weights_checksum,
)


def _state():
    return {
        "a": torch.arange(6, dtype=torch.float32).view(2, 3),
        "b": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "c": torch.ones(4, dtype=torch.float32),
    }


def test_pack_and_unpack_round_trip_by_dtype_and_bucket_size():
    state = _state()
    buckets = pack_state_dict(state, bucket_bytes=24)  # a (24 bytes) alone, then c; b in its own dtype
    assert sorted(len(b.entries) for b in buckets) == [1, 1, 1]
    out = dict(unpack(buckets))
    assert out.keys() == state.keys()
    for name, tensor in state.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor)


def test_numpy_form_round_trips_float32_and_bfloat16():
    for bucket in pack_state_dict(_state()):
        back = NumpyBucket.of(bucket).to_packed()
        assert back.buffer.dtype == bucket.buffer.dtype and torch.equal(back.buffer, bucket.buffer)
        assert back.entries == bucket.entries


def test_load_packed_copies_into_a_model():
    model = torch.nn.Linear(3, 2)
    source = {k: torch.full_like(v, 0.5) for k, v in model.state_dict().items()}
    assert load_packed(model, pack_state_dict(source)) == 2
    assert torch.equal(model.weight, torch.full((2, 3), 0.5)) and torch.equal(
        model.bias, torch.full((2,), 0.5)
    )


def test_shared_flat_weights_show_training_updates_to_a_reader(tmp_path):
    model = torch.nn.Linear(3, 2)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    shared = SharedFlatWeights(model, directory=str(tmp_path))
    views = dict(map_shared(shared.handle))
    for name, tensor in before.items():  # same values after the move
        assert torch.equal(views[name], tensor) and torch.equal(dict(model.named_parameters())[name], tensor)
    torch.optim.SGD(model.parameters(), lr=1.0).zero_grad()
    model(torch.ones(1, 3)).sum().backward()
    torch.optim.SGD(model.parameters(), lr=1.0).step()  # in place, as every optimizer
    assert torch.equal(views["bias"], before["bias"] - 1.0)  # d(sum)/d(bias) = 1
    shared.close()
    assert not any(os.scandir(tmp_path))  # names removed; the mapping still reads
    assert torch.equal(views["weight"], model.weight.detach())


def test_checksum_is_the_same_for_fused_and_split_layouts():
    q, k, v = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, -1.0]]), torch.tensor([[0.5, 0.5]])
    split = weights_checksum([q, k, v])
    fused = weights_checksum([torch.cat([q, k, v])])
    # Σw = 1 + 2 + 3 - 1 + 0.5 + 0.5 = 6; Σw² = 1 + 4 + 9 + 1 + 0.25 + 0.25 = 15.5
    assert split == fused == (6.0, 15.5)
    assert weights_checksum([q, q]) == (3.0, 5.0)  # one tensor passed twice (tied weights) counts once
