"""vLLM on CUDA, colocated with the policy: in-place refit parity, and sleep / wake around training.
Skipped without CUDA or without vLLM."""

import pytest
import torch

from posttrain.config.common import OptimizerConfig, PolicyConfig, SchedulerConfig
from posttrain.config.rollout import GenerationConfig, VLLMConfig

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]


def test_colocated_refit_and_sleep_on_cuda(tmp_path_factory, tokenizer):
    from conftest import make_tiny_model_dir, require_vllm

    require_vllm()

    from posttrain.algorithms.metrics import token_mult_prob_error
    from posttrain.distributed.actor import ActorPolicy
    from posttrain.distributed.refit_check import probe_batch
    from posttrain.generation.sampling import SamplingParams

    model_dir = make_tiny_model_dir(
        tmp_path_factory.mktemp("cuda_vllm"),
        tokenizer,
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=256,
    )
    cfg = PolicyConfig(
        max_seq_len=128,
        optimizer=OptimizerConfig(lr=1e-2),
        scheduler=SchedulerConfig(name="constant"),
    )
    generation = GenerationConfig(backend="vllm", vllm=VLLMConfig(sleep=True, gpu_memory_utilization=0.2))
    actor = ActorPolicy(
        cfg,
        model_path=str(model_dir),
        total_steps=2,
        tokenizer_path=str(model_dir),
        gpus=1,
        generation=generation,
    )
    prompts = [tokenizer(f"{i} + {i} =")["input_ids"] for i in range(4)]

    def parity() -> float:
        out = actor.generate(prompts, SamplingParams(max_new_tokens=16, seed=0), 4)
        batch, gen = probe_batch(prompts, out, tokenizer.pad_token_id)
        return float(token_mult_prob_error(actor.logprobs(batch), gen, batch.loss_mask))

    assert parity() <= 1.01
    free_awake = torch.cuda.mem_get_info()[0]
    actor.sleep_engine()
    assert torch.cuda.mem_get_info()[0] > free_awake  # sleeping released memory
    with torch.no_grad():
        for p in actor.model.parameters():
            p.mul_(1.01)
    actor.refit_engine()  # wakes the engine, then copies in place
    assert parity() <= 1.01
    assert actor.engine_checksum() == pytest.approx(actor.parameters_checksum(), rel=1e-9)
