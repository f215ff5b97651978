"""Split placement on CUDA: the collective refit transport over NCCL (what refit_transport=auto picks
with GPUs on Ray). Needs 2 GPUs (NCCL puts each rank on its own GPU); skipped otherwise."""

import pytest
import torch

from posttrain.config.common import ClusterConfig, OptimizerConfig, PolicyConfig, SchedulerConfig
from posttrain.config.rollout import GenerationConfig

pytestmark = [pytest.mark.gpu, pytest.mark.ray]


def test_split_refit_over_nccl_gives_bit_identical_weights(ray_cluster, tiny_model_dir, tokenizer):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: one for the policy, one for the generation worker")
    from posttrain.data.batching import collate
    from posttrain.data.tokenize import tokenize_conversation
    from posttrain.distributed.actor_group import ActorGroup, GenerationGroup
    from posttrain.generation.worker import GenerationWorker
    from posttrain.trainers.sft import sft_loss

    cfg = PolicyConfig(
        dtype="bfloat16",
        max_seq_len=64,
        optimizer=OptimizerConfig(lr=1e-2),
        scheduler=SchedulerConfig(name="constant"),
    )
    cluster = ClusterConfig(backend="ray", gpus_per_node=2, num_workers=1)
    generation_cfg = GenerationConfig(placement="split")
    transport = generation_cfg.resolved_refit_transport(cluster)
    assert transport == "collective"
    batch = collate(
        [
            tokenize_conversation(
                tokenizer, [{"role": "user", "content": f"{i}?"}, {"role": "assistant", "content": f"{i}"}]
            )
            for i in range(4)
        ]
    )
    policy = ActorGroup(
        cfg, cluster, model_path=str(tiny_model_dir), total_steps=2, tokenizer_path=str(tiny_model_dir)
    )
    generation = GenerationGroup(
        generation_cfg,
        cfg,
        cluster,
        model_path=str(tiny_model_dir),
        tokenizer_path=str(tiny_model_dir),
        transport=transport,
    )
    try:
        for _ in range(2):  # the second refit reuses the NCCL group
            policy.train(batch, sft_loss, float(batch.num_target_tokens))
            assert generation.refit(policy) > 0
            want = policy.state_dict()
            [got] = generation.workers.run(GenerationWorker.state_dict_cpu)
            assert got.keys() == want.keys()
            for name, tensor in want.items():
                assert tensor.dtype == torch.bfloat16 and torch.equal(got[name], tensor), name
    finally:
        generation.shutdown()
        policy.shutdown()
