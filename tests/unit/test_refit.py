"""Refit transports (packed buckets, their numpy form for the object store, shared flat weights, the
collective broadcast) and the weights checksum, on small hand-made tensors."""

import os
import threading

import torch

from posttrain.weights.refit import (
    NumpyBucket,
    RefitGroup,
    SharedFlatWeights,
    host_refit_store,
    load_packed,
    map_shared,
    pack_state_dict,
    plan_buckets,
    receive_buckets,
    send_buckets,
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


def test_checksum_of_a_tensor_spanning_several_chunks_is_exact():
    from posttrain.weights.refit import CHECKSUM_CHUNK

    # 2 chunks and 9 elements of the values -3..3: every partial sum is an integer, exact in float64
    w = (torch.arange(2 * CHECKSUM_CHUNK + 9) % 7 - 3).float()
    n = w.numel()
    cycles, rest = divmod(n, 7)
    tail = [i % 7 - 3 for i in range(cycles * 7, n)]  # the last partial cycle: -3, -2, ...
    assert weights_checksum([w]) == (float(sum(tail)), float(cycles * 28 + sum(x * x for x in tail)))
    assert weights_checksum([w], torch.bfloat16) == weights_checksum([w])  # small integers: exact in bf16


def test_bucket_plan_groups_by_dtype_and_gives_a_large_tensor_its_own_bucket():
    specs = [(k, tuple(v.shape), v.dtype) for k, v in _state().items()]
    layouts = plan_buckets(specs, bucket_bytes=24)
    assert [(la.dtype, la.numel, la.entries) for la in layouts] == [
        (torch.float32, 6, (("a", (2, 3), 0),)),
        (torch.float32, 4, (("c", (4,), 0),)),
        (torch.bfloat16, 2, (("b", (2,), 0),)),
    ]
    assert [la.nbytes for la in layouts] == [24, 16, 4]
    [fp32, bf16] = plan_buckets(specs)  # default size: one bucket per dtype, offsets in order
    assert fp32.entries == (("a", (2, 3), 0), ("c", (4,), 6)) and bf16.numel == 2


def test_cast_packs_floating_tensors_in_the_receivers_dtype_and_leaves_integers():
    state = {**_state(), "i": torch.tensor([7, -3], dtype=torch.int64)}
    [bf16, int64] = plan_buckets(
        ((k, tuple(v.shape), v.dtype) for k, v in state.items()), cast=torch.bfloat16
    )
    # a (6) and c (4) join b (2) in one bf16 bucket, in the order given: a, b, c
    assert bf16.dtype == torch.bfloat16 and bf16.entries == (("a", (2, 3), 0), ("b", (2,), 6), ("c", (4,), 8))
    assert bf16.nbytes == 12 * 2 and int64.entries == (("i", (2,), 0),)
    unpacked = dict(unpack(pack_state_dict(state, cast=torch.bfloat16)))
    assert unpacked["a"].dtype == torch.bfloat16 and torch.equal(unpacked["a"], state["a"].to(torch.bfloat16))
    assert torch.equal(unpacked["i"], state["i"])


def test_collective_broadcast_gives_every_receiver_the_exact_tensors():
    """Rank 0 and two receivers in threads of this process, gloo: the real group and bucket code."""
    state = {**_state(), "d": torch.randn(5, 7)}
    layouts = plan_buckets(((k, tuple(v.shape), v.dtype) for k, v in state.items()), bucket_bytes=64)
    assert len(layouts) >= 3
    store, address, port = host_refit_store(3)
    received: dict[int, dict[str, torch.Tensor]] = {}

    def receiver(rank: int) -> None:
        group = RefitGroup.connect(address, port, rank, 3, "cpu")
        received[rank] = {
            name: tensor.clone()
            for bucket in receive_buckets(group, layouts)
            for name, tensor in unpack([bucket])
        }
        group.close()

    threads = [threading.Thread(target=receiver, args=(rank,)) for rank in (1, 2)]
    for t in threads:
        t.start()
    sender = RefitGroup(store, 0, 3, "cpu")
    sent = send_buckets(sender, layouts, lambda layout: state)
    for t in threads:
        t.join(timeout=60)
    sender.close()
    assert sent == sum(v.numel() * v.element_size() for v in state.values())
    for rank in (1, 2):
        assert received[rank].keys() == state.keys()
        for name, tensor in state.items():
            assert received[rank][name].dtype == tensor.dtype and torch.equal(received[rank][name], tensor)
