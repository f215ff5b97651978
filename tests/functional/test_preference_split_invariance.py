"""DPO and reward-model steps must not depend on how the global batch of pairs is split."""

import functools

import pytest
import torch
from preference_helpers import write_preference_jsonl

from posttrain.algorithms.preference import sequence_logprobs
from posttrain.config.common import ClusterConfig, OptimizerConfig, PolicyConfig, SchedulerConfig
from posttrain.config.supervised import PreferenceDatasetConfig
from posttrain.data.preference import build_preference_dataset, collate_pairs
from posttrain.distributed.actor import ActorPolicy
from posttrain.distributed.actor_group import ActorGroup
from posttrain.models.reward_model import RewardPolicy
from posttrain.trainers.dpo import dpo_loss
from posttrain.trainers.rm import RewardModelGroup, rm_loss

DPO_VARIANTS = {
    "dpo_sum_sft": dict(
        loss_type="sigmoid", beta=0.5, label_smoothing=0.1, average_logprobs=False, sft_weight=0.5
    ),
    "ipo_mean": dict(loss_type="ipo", beta=0.5, label_smoothing=0.0, average_logprobs=True, sft_weight=0.0),
}


@pytest.fixture(scope="module")
def batch(tmp_path_factory, tokenizer):
    path = write_preference_jsonl(tmp_path_factory.mktemp("pref") / "d.jsonl", n=8)
    ds = build_preference_dataset(PreferenceDatasetConfig(path=str(path)), tokenizer, max_seq_len=128)
    assert len({len(p.chosen) for p in ds.pairs}) > 4, "the pairs must differ in length"
    return collate_pairs(ds.pairs, pad_id=tokenizer.pad_token_id)


def _policy_cfg(micro: int) -> PolicyConfig:
    return PolicyConfig(
        train_micro_batch_size=micro,
        # eps 1e-6: AdamW's first step lr*g/(|g|+eps) would turn float rounding of gradient entries
        # near 1e-8 into visible parameter differences; gradients are compared directly as well
        optimizer=OptimizerConfig(lr=1e-2, max_grad_norm=None, eps=1e-6),
        scheduler=SchedulerConfig(name="constant"),
    )


def _assert_close(a: dict, b: dict, tolerance: float = 1e-5) -> None:
    """Every tensor equal to relative `tolerance` in norm (see test_sft_split_invariance)."""
    assert a.keys() == b.keys()
    for name in a:
        error = (a[name] - b[name]).norm() / b[name].norm()
        assert error <= tolerance, f"{name}: relative error {error:.2e}"


def _grads(policy) -> dict:
    return {n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None}


def _dpo_loss_fn(batch, knobs):
    return functools.partial(dpo_loss, chosen_tokens=float(batch.loss_mask[0::2].sum()), **knobs)


def _with_reference(batch, reference_token_logprobs, knobs):
    """Reference sequence logprobs, shifted per sequence so that h != 0 (as after some training)."""
    seq = sequence_logprobs(reference_token_logprobs, batch.loss_mask, average=knobs["average_logprobs"])
    batch.reference_logps = seq + torch.linspace(-1.0, 1.0, len(seq))
    return batch


@pytest.mark.parametrize("variant", sorted(DPO_VARIANTS))
def test_dpo_microbatch_layouts_give_the_same_step(tiny_model_dir, batch, variant):
    """In float64 (the policy; the reference logprobs are fixed inputs): the claim is exact math, and
    fp32 rounding differs between CPUs (2.9e-5 relative seen on an AVX2-only AMD EPYC at rel 1e-5)."""
    knobs = DPO_VARIANTS[variant]
    results = {}
    for micro in (16, 8, 2):  # 1x8, 2x4 and 8x1 pairs
        policy = ActorPolicy(
            _policy_cfg(micro),
            model_path=str(tiny_model_dir),
            total_steps=1,
            tokenizer_path=str(tiny_model_dir),
            reference=True,
        )
        _with_reference(batch, policy.reference_logprobs(batch), knobs)
        policy.model.double()  # in place: the optimizer keeps the same parameters
        out = policy.train(batch, _dpo_loss_fn(batch, knobs), float(batch.num_pairs))
        results[micro] = (out, policy.state_dict_cpu(), _grads(policy))
    ref, ref_params, ref_grads = results[16]
    assert ref.grad_norm > 0 and ref.loss_metrics["rewards/margin"] != 0
    assert ref_params["model.embed_tokens.weight"].dtype == torch.float64
    for micro in (8, 2):
        out, params, grads = results[micro]
        for key, value in ref.loss_metrics.items():
            assert out.loss_metrics[key] == pytest.approx(value, rel=1e-10, abs=1e-12), key
        assert out.grad_norm == pytest.approx(ref.grad_norm, rel=1e-12)
        _assert_close(grads, ref_grads, tolerance=1e-10)
        _assert_close(params, ref_params, tolerance=1e-10)


def test_rm_microbatch_layouts_give_the_same_step(tiny_model_dir, batch, tokenizer):
    """In float64, so that the comparison is tight: the reward head's gradient reaching the first layers
    is small, and fp32 rounding (relative ~2e-6 in those gradients, measured) becomes ~3e-5 in the
    parameters after one AdamW step; in float64 both agree to ~1e-13."""
    results = {}
    for micro in (16, 8, 2):
        policy = RewardPolicy(
            _policy_cfg(micro),
            model_path=str(tiny_model_dir),
            total_steps=1,
            pad_token_id=tokenizer.pad_token_id,
        )
        policy.model.double()  # in place: the optimizer keeps the same parameters
        out = policy.train(batch, rm_loss, float(batch.num_pairs))
        results[micro] = (out, policy.state_dict_cpu(), _grads(policy))
    ref, ref_params, ref_grads = results[16]
    assert ref.grad_norm > 0 and "score.weight" in ref_params
    assert ref_params["score.weight"].dtype == torch.float64
    for micro in (8, 2):
        out, params, grads = results[micro]
        assert out.loss_metrics["loss"] == pytest.approx(ref.loss_metrics["loss"], rel=1e-12)
        assert out.loss_metrics["margin"] == pytest.approx(ref.loss_metrics["margin"], rel=1e-10, abs=1e-12)
        assert out.grad_norm == pytest.approx(ref.grad_norm, rel=1e-12)
        _assert_close(grads, ref_grads, tolerance=1e-10)
        _assert_close(params, ref_params, tolerance=1e-10)


def test_per_microbatch_pair_mean_would_differ(tiny_model_dir, batch, tokenizer):
    """Guard: the tests above can fail. Normalising by each microbatch's own pair count changes the step."""

    def local_mean(scores, micro, normalizer):
        return rm_loss(scores, micro, micro.num_pairs * 2.0)  # 2 microbatches: mean of means

    kwargs = dict(model_path=str(tiny_model_dir), total_steps=1, pad_token_id=tokenizer.pad_token_id)
    uneven = batch.select(0, 12)  # 6 pairs in microbatches of 4 + 2: means of means differ from the mean
    a = RewardPolicy(_policy_cfg(8), **kwargs).train(uneven, rm_loss, 6.0).grad_norm
    b = RewardPolicy(_policy_cfg(8), **kwargs).train(uneven, local_mean, 6.0).grad_norm
    assert abs(a - b) / a > 1e-3


@pytest.mark.ray
def test_two_data_parallel_ray_workers_match_one_local_worker(ray_cluster, tiny_model_dir, batch, tokenizer):
    """The reward model (DPO's two Ray workers: test_preference_trainers.py's run on Ray, which takes
    the steps of one local worker)."""
    algorithm = "rm"
    knobs = DPO_VARIANTS["dpo_sum_sft"]
    params = {}
    for workers in (1, 2):
        cluster = ClusterConfig(backend="ray" if workers > 1 else "local", num_workers=workers)
        common = dict(model_path=str(tiny_model_dir), total_steps=1)
        if algorithm == "dpo":
            group = ActorGroup(
                _policy_cfg(4), cluster, tokenizer_path=str(tiny_model_dir), reference=True, **common
            )
        else:
            group = RewardModelGroup(_policy_cfg(4), cluster, pad_token_id=tokenizer.pad_token_id, **common)
        try:
            if algorithm == "dpo":
                _with_reference(batch, group.reference_logprobs(batch), knobs)
                out = group.train(batch, _dpo_loss_fn(batch, knobs), float(batch.num_pairs))
            else:
                out = group.train(batch, rm_loss, float(batch.num_pairs))
            params[workers] = (out, group.state_dict())
            assert len(set(group.parameters_checksum())) == 1, "data-parallel replicas diverged"
        finally:
            group.shutdown()
    (one, p1), (two, p2) = params[1], params[2]
    assert two.loss_metrics["loss"] == pytest.approx(one.loss_metrics["loss"], rel=1e-5)
    assert two.grad_norm == pytest.approx(one.grad_norm, rel=1e-5)
    _assert_close(p2, p1)


@pytest.mark.ray
def test_dpo_fsdp2_on_two_cpu_workers_matches_one_plain_worker(ray_cluster, tiny_model_dir, batch):
    """DPO with the policy sharded by FSDP2 (gloo) and a replicated reference model: the step of one
    unsharded worker (tolerances as for SFT under FSDP2: reduce-scatter order, first AdamW step)."""
    knobs = DPO_VARIANTS["dpo_sum_sft"]
    results = {}
    for workers, fsdp in ((1, False), (2, True)):
        cfg = _policy_cfg(4).model_copy(update={"fsdp": fsdp})
        group = ActorGroup(
            cfg,
            ClusterConfig(backend="ray" if workers > 1 else "local", num_workers=workers),
            tokenizer_path=str(tiny_model_dir),
            reference=True,
            model_path=str(tiny_model_dir),
            total_steps=1,
        )
        try:
            _with_reference(batch, group.reference_logprobs(batch), knobs)
            out = group.train(batch, _dpo_loss_fn(batch, knobs), float(batch.num_pairs))
            results[workers] = (out, group.state_dict())
        finally:
            group.shutdown()
    (one, p1), (two, p2) = results[1], results[2]
    assert two.loss_metrics["loss"] == pytest.approx(one.loss_metrics["loss"], rel=1e-5)
    assert two.grad_norm == pytest.approx(one.grad_norm, rel=1e-4)
    _assert_close(p2, p1, tolerance=5e-5)
