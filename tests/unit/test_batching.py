import pytest
import torch

from posttrain.data.batching import EpochSampler, collate, concat_batches
from posttrain.data.tokenize import TokenizedExample


def _examples(lengths):
    return [TokenizedExample(list(range(1, n + 1)), [0] + [1] * (n - 1)) for n in lengths]


def test_collate_pads_right_and_never_targets_position_zero():
    batch = collate(_examples([3, 1]), pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3], [1, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 1, 1], [0, 0, 0]]
    assert batch.num_target_tokens == 2 and batch.num_tokens == 4


def test_select_trims_to_longest_row_and_shards_split_evenly():
    batch = collate(_examples([5, 2, 3, 1]))
    first, second = batch.shards(2)
    assert first.input_ids.shape == (2, 5) and second.input_ids.shape == (2, 3)
    assert torch.equal(second.loss_mask, batch.loss_mask[2:, :3])
    with pytest.raises(ValueError, match="does not split evenly"):
        batch.shards(3)
    assert [len(c) for c in batch.chunks(3)] == [1, 2, 1]


def test_sampler_reshuffles_per_epoch_and_resumes_from_state():
    a = EpochSampler(10, 4, seed=3)
    order = [a.next_batch() for _ in range(5)]  # 2 batches per epoch (last 2 items dropped)
    assert a.epoch == 2
    assert sorted(order[0] + order[1]) != list(range(8)) or order[0] != order[2]
    assert len(set(order[0]) | set(order[1])) == 8  # no repeats within an epoch
    b = EpochSampler(10, 4, seed=3)
    [b.next_batch() for _ in range(3)]
    c = EpochSampler(10, 4, seed=3)
    c.load_state_dict(b.state_dict())
    assert [c.next_batch() for _ in range(2)] == order[3:5]


def test_a_sampler_refuses_the_state_of_a_sampler_over_other_data():
    """A resumed run whose training set changed size (e.g. a changed validation set dropped other
    training tasks) would continue with batches the run never planned: a clear error instead."""
    from posttrain.data.batching import ChangedDataError

    a = EpochSampler(10, 4, seed=3)
    a.next_batch()
    with pytest.raises(ChangedDataError, match="sampling 10 training items and this run has 9"):
        EpochSampler(9, 4, seed=3).load_state_dict(a.state_dict())
    old = {"epoch": 0, "offset": 4}  # a checkpoint written before the count was saved
    b = EpochSampler(9, 4, seed=3)
    b.load_state_dict(old)
    assert b.offset == 4


def test_reorder_moves_every_tensor_field_together():
    batch = collate(_examples([3, 1, 2]))
    out = batch.reorder([2, 0, 1])
    assert out.input_ids.tolist() == [[1, 2, 0], [1, 2, 3], [1, 0, 0]]
    assert torch.equal(out.loss_mask, batch.loss_mask[[2, 0, 1]])
    assert torch.equal(out.attention_mask, batch.attention_mask[[2, 0, 1]])
    with pytest.raises(ValueError, match="permutation"):
        batch.reorder([0, 0, 1])


def test_concat_batches_pads_every_token_field_to_the_longest():
    from posttrain.rollout.rollout import RLBatch

    a = RLBatch(**vars(collate(_examples([2, 1]), pad_id=9)), advantages=torch.tensor([0.5, -1.0]))
    b = RLBatch(**vars(collate(_examples([3]), pad_id=9)), advantages=torch.tensor([2.0]))
    out = concat_batches([a, b], pad_id=9)
    assert type(out) is RLBatch
    assert out.input_ids.tolist() == [[1, 2, 9], [1, 9, 9], [1, 2, 3]]
    assert out.attention_mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    assert out.loss_mask.tolist() == [[0, 1, 0], [0, 0, 0], [0, 1, 1]]
    assert out.advantages.tolist() == [0.5, -1.0, 2.0] and out.old_logprobs is None
    with pytest.raises(ValueError, match="'advantages' is set in some batches only"):
        concat_batches([a, RLBatch(**vars(collate(_examples([3]))))])
