"""The collective refit transport for real (gloo on CPU): policy rank 0 broadcasts its trained weights to
generation workers over a process group of their own; the workers end up with bit-identical weights,
the group is reused at the next refit, and the parity gate still catches a skipped refit."""

import pytest
import torch

from posttrain.config.common import ClusterConfig, OptimizerConfig, PolicyConfig, SchedulerConfig
from posttrain.config.rollout import GenerationConfig, RefitCheckConfig
from posttrain.distributed.actor_group import ActorGroup, GenerationGroup
from posttrain.distributed.refit_check import RefitError, check_refit
from posttrain.generation.sampling import SamplingParams
from posttrain.generation.worker import GenerationWorker
from posttrain.trainers.sft import sft_loss


def _cfg() -> PolicyConfig:
    return PolicyConfig(
        max_seq_len=64,
        optimizer=OptimizerConfig(lr=1e-2),
        scheduler=SchedulerConfig(name="constant"),
    )


@pytest.fixture(scope="module")
def batch(tokenizer):
    from posttrain.data.batching import collate
    from posttrain.data.tokenize import tokenize_conversation

    return collate(
        [
            tokenize_conversation(
                tokenizer,
                [{"role": "user", "content": f"{i} + {i}?"}, {"role": "assistant", "content": f"{2 * i}"}],
            )
            for i in range(4)
        ]
    )


def _groups(tiny_model_dir, policy_backend: str, generation_workers: int):
    policy = ActorGroup(
        _cfg(),
        ClusterConfig(backend=policy_backend, cpus_per_worker=1),
        model_path=str(tiny_model_dir),
        total_steps=4,
        tokenizer_path=str(tiny_model_dir),
    )
    generation = GenerationGroup(
        GenerationConfig(placement="split", num_workers=generation_workers, refit_transport="collective"),
        _cfg(),
        ClusterConfig(backend="ray" if generation_workers > 1 else policy_backend),
        model_path=str(tiny_model_dir),
        tokenizer_path=str(tiny_model_dir),
        transport="collective",
    )
    return policy, generation


def _assert_generators_run_the_policy(policy: ActorGroup, generation: GenerationGroup) -> None:
    want = policy.state_dict()
    [reference] = policy.parameters_checksum()[:1]
    # the float64 sums may differ in the last bit between processes with different thread counts
    for checksum in generation.generator_checksums():
        assert checksum == pytest.approx(reference, rel=1e-12)
    for got in generation.workers.run(GenerationWorker.state_dict_cpu):
        assert got.keys() == want.keys()
        for name, tensor in want.items():
            assert torch.equal(got[name], tensor), name


def _refit_and_check(policy, generation, batch, tokenizer):
    before = policy.state_dict()
    policy.train(batch, sft_loss, float(batch.num_target_tokens))
    assert generation.refit(policy) == len(list(before)) - 1  # every parameter (lm_head is tied)
    _assert_generators_run_the_policy(policy, generation)
    changed = policy.state_dict()
    assert any(not torch.equal(changed[k], before[k]) for k in before)  # the step did move the weights
    gate = RefitCheckConfig(mode="checksum")
    check_refit(gate, policy, generation, [], SamplingParams(), tokenizer.pad_token_id)
    return gate


@pytest.mark.ray
def test_collective_refit_round_trip_and_the_gate_catches_a_skip(
    ray_cluster, tiny_model_dir, batch, tokenizer
):
    """Two generation workers on Ray; the policy runs in this process (the local backend) and its side
    of the broadcast runs in a thread; the transport still crosses processes. (A policy actor to one
    generation actor: test_grpo.py's split_collective run.)"""
    policy_backend, generation_workers = "local", 2
    policy, generation = _groups(tiny_model_dir, policy_backend, generation_workers)
    try:
        gate = _refit_and_check(policy, generation, batch, tokenizer)
        group_members = generation.refit_source
        # a skipped refit: the policy trains again, the generators keep the old weights
        policy.train(batch, sft_loss, float(batch.num_target_tokens))
        with pytest.raises(RefitError, match="does not run the trained weights"):
            check_refit(gate, policy, generation, [], SamplingParams(), tokenizer.pad_token_id)
        _refit_and_check(policy, generation, batch, tokenizer)  # the same group serves the next refit
        assert generation.refit_source is group_members
    finally:
        generation.shutdown()
        policy.shutdown()


def test_collective_refit_in_one_process(tiny_model_dir, batch, tokenizer):
    """cluster.backend=local: the policy and the generation worker in this process, one thread each."""
    policy, generation = _groups(tiny_model_dir, "local", 1)
    try:
        _refit_and_check(policy, generation, batch, tokenizer)
    finally:
        generation.shutdown()
        policy.shutdown()
