"""The gradient of one step must not depend on how the global batch is split."""

import pytest
import torch
from conftest import write_sft_jsonl

from posttrain.config.common import (
    ClusterConfig,
    DatasetConfig,
    OptimizerConfig,
    PolicyConfig,
    SchedulerConfig,
)
from posttrain.data.batching import collate
from posttrain.data.sft import build_sft_dataset
from posttrain.distributed.policy_group import PolicyGroup
from posttrain.models.policy import Policy
from posttrain.trainers.sft import sft_loss
from posttrain.weights.refit import weights_checksum


@pytest.fixture(scope="module")
def batch(tmp_path_factory, tokenizer):
    path = write_sft_jsonl(tmp_path_factory.mktemp("data") / "d.jsonl", n=8)
    ds = build_sft_dataset(DatasetConfig(path=str(path)), tokenizer, max_seq_len=128)
    lengths = sorted(len(e) for e in ds.examples)
    assert len(set(lengths)) > 4, "the 8 sequences must differ in length"
    return collate(ds.examples)


def _policy_cfg(micro: int) -> PolicyConfig:
    # No clipping, no warmup, so the step uses the raw gradient; SGD-like check via grad_norm too.
    return PolicyConfig(
        train_micro_batch_size=micro,
        optimizer=OptimizerConfig(lr=1e-2, max_grad_norm=None),
        scheduler=SchedulerConfig(name="constant"),
    )


def _assert_close(a: dict, b: dict, tolerance: float = 1e-5) -> None:
    """Every parameter tensor equal to relative 1e-5 (in norm: ||a - b|| <= 1e-5 ||b||).

    Elementwise comparison is not meaningful after one AdamW step: for a gradient entry near
    eps the update lr * g / (|g| + eps) amplifies float rounding in g.
    """
    assert a.keys() == b.keys()
    for name in a:
        error = (a[name] - b[name]).norm() / b[name].norm()
        assert error <= tolerance, f"{name}: relative error {error:.2e}"


def test_microbatch_layouts_give_the_same_step(tiny_model_dir, batch):
    """In float64: the claim is exact math (a sum split into microbatches), so only float64 rounding
    (~1e-16 relative, ~1e-13 after one AdamW step) may separate the layouts, on any CPU. In fp32 the
    reduction order of the matmuls differs between CPUs (AVX2 vs AVX-512/AMX kernels) and the first
    AdamW step, ~lr * g / (|g| + eps), turns that rounding near g = 0 into visible differences."""
    results = {}
    for micro in (8, 1, 4):  # 1x8, 8x1, 2x4
        policy = Policy(_policy_cfg(micro), model_path=str(tiny_model_dir), total_steps=1)
        policy.model.double()  # in place: the optimizer keeps the same parameters
        out = policy.train(batch, sft_loss, normalizer=batch.num_target_tokens)
        results[micro] = (out, policy.state_dict_cpu())
    (ref, ref_params) = results[8]
    assert ref.loss_metrics["loss"] > 1.0
    assert ref_params["model.embed_tokens.weight"].dtype == torch.float64
    for micro in (1, 4):
        out, params = results[micro]
        assert out.loss_metrics["loss"] == pytest.approx(ref.loss_metrics["loss"], rel=1e-12)
        assert out.grad_norm == pytest.approx(ref.grad_norm, rel=1e-12)
        _assert_close(params, ref_params, tolerance=1e-10)


def test_per_microbatch_mean_would_differ(tiny_model_dir, batch):
    """Guard: the test above can fail. Normalising by each microbatch's own count changes the step."""

    def local_mean_loss(lp, micro, normalizer):
        return sft_loss(lp, micro, micro.num_target_tokens / 2)  # 2 microbatches: mean of means

    a = Policy(_policy_cfg(4), model_path=str(tiny_model_dir), total_steps=1)
    b = Policy(_policy_cfg(4), model_path=str(tiny_model_dir), total_steps=1)
    ga = a.train(batch, sft_loss, normalizer=batch.num_target_tokens).grad_norm
    gb = b.train(batch, local_mean_loss, normalizer=batch.num_target_tokens).grad_norm
    assert abs(ga - gb) / ga > 1e-3


def _checksum_of(state: dict) -> tuple[float, float]:
    """weights_checksum of a state dict's copies (lm_head.weight is the tied embedding: counted once)."""
    return weights_checksum(v for k, v in state.items() if k != "lm_head.weight")


@pytest.mark.ray
def test_fsdp2_on_two_cpu_workers_matches_one_plain_worker(ray_cluster, tiny_model_dir, batch, tmp_path):
    """FSDP2 (fully_shard) over gloo: the same step as one unsharded worker; full state gathered for
    state_dict, checksums and a checkpoint round trip."""
    one = PolicyGroup(
        _policy_cfg(2),
        ClusterConfig(backend="local", num_workers=1),
        model_path=str(tiny_model_dir),
        total_steps=2,
    )
    try:
        ref = one.train(batch, sft_loss, normalizer=batch.num_target_tokens)
        ref_params = one.state_dict()
        ref_checksum = one.parameters_checksum()[0]
        assert ref_checksum == pytest.approx(_checksum_of(ref_params), rel=1e-9)
    finally:
        one.shutdown()
    cfg = _policy_cfg(2).model_copy(update={"fsdp": True})
    group = PolicyGroup(
        cfg, ClusterConfig(backend="ray", num_workers=2), model_path=str(tiny_model_dir), total_steps=2
    )
    try:
        out = group.train(batch, sft_loss, normalizer=batch.num_target_tokens)
        params = group.state_dict()
        assert out.loss_metrics["loss"] == pytest.approx(ref.loss_metrics["loss"], rel=1e-5)
        # fp32 gradients are reduce-scattered (summed in another order) and their norm is summed over
        # shards; the first AdamW step (~ lr * sign(g)) amplifies that rounding where g is near 0, so the
        # tolerances are looser than for plain data parallelism. A wrong loss scale shows in grad_norm.
        assert out.grad_norm == pytest.approx(ref.grad_norm, rel=1e-4)
        _assert_close(params, ref_params, tolerance=5e-5)
        # every rank's checksum (its shard's sums added over ranks) fingerprints the full weights
        full = _checksum_of(params)
        for checksum in group.parameters_checksum():
            assert checksum == pytest.approx(full, rel=1e-9)
        assert checksum != pytest.approx(ref_checksum, rel=1e-12)  # sensitive to the last bits
        group.save_checkpoint(tmp_path / "ckpt")
        group.train(batch, sft_loss, normalizer=batch.num_target_tokens)
        group.load_checkpoint(tmp_path / "ckpt")
        _assert_close(group.state_dict(), params)
    finally:
        group.shutdown()
