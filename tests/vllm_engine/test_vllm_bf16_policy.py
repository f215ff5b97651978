"""policy.dtype=bfloat16 with a colocated vLLM engine (vllm.dtype=auto): the engine runs bf16 weights, the
policy fp32 master weights under bf16 autocast (issue 12, item 3). Refits cast, and the checksum gate
compares the policy's weights cast to bf16 with the engine's."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import OneActorGroup, require_vllm

require_vllm()

from posttrain.algorithms.metrics import token_mult_prob_error  # noqa: E402
from posttrain.config.common import OptimizerConfig, PolicyConfig, SchedulerConfig  # noqa: E402
from posttrain.config.rollout import GenerationConfig  # noqa: E402
from posttrain.data.batching import collate  # noqa: E402
from posttrain.data.tokenize import tokenize_conversation  # noqa: E402
from posttrain.distributed.actor import ActorPolicy  # noqa: E402
from posttrain.distributed.refit_check import RefitError, check_refit, probe_batch  # noqa: E402
from posttrain.generation.sampling import SamplingParams  # noqa: E402
from posttrain.generation.worker import refit_cast_dtype  # noqa: E402
from posttrain.trainers.sft import sft_loss  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm_tiny_dir(tmp_path_factory, tokenizer):
    """As in test_vllm_backend: head_dim 64 (vLLM's CPU attention), a wide init."""
    from conftest import make_tiny_model_dir

    return make_tiny_model_dir(
        tmp_path_factory.mktemp("vllm_tiny_bf16"),
        tokenizer,
        initializer_range=0.1,
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=256,
    )


def _prompts(tokenizer, n=8):
    return [tokenizer(f"Question {i}: what is {i} + {2 * i}?")["input_ids"] for i in range(n)]


def _parity(actor: ActorPolicy, tokenizer) -> float:
    prompts = _prompts(tokenizer)
    out = actor.generate(prompts, SamplingParams(max_new_tokens=16, seed=5), 8)
    batch, gen_logprobs = probe_batch(prompts, out, tokenizer.pad_token_id)
    return float(token_mult_prob_error(actor.logprobs(batch), gen_logprobs, batch.loss_mask))


def test_bf16_policy_refits_a_bf16_engine(vllm_tiny_dir, tokenizer):
    cfg = PolicyConfig(
        dtype="bfloat16",
        max_seq_len=128,
        optimizer=OptimizerConfig(lr=1e-2),
        scheduler=SchedulerConfig(name="constant"),
    )
    generation = GenerationConfig(backend="vllm")
    engine_dtype = refit_cast_dtype(generation, cfg)
    assert engine_dtype == "bfloat16"
    actor = ActorPolicy(
        cfg,
        model_path=str(vllm_tiny_dir),
        total_steps=4,
        tokenizer_path=str(vllm_tiny_dir),
        generation=generation,
    )
    actor.model.config.use_cache = False
    assert next(actor.model.parameters()).dtype == torch.float32
    check = functools.partial(
        check_refit,
        generation.refit_check,
        OneActorGroup(actor),
        OneActorGroup(actor),
        [],
        SamplingParams(),
        0,
    )
    check(engine_dtype=engine_dtype)
    with pytest.raises(RefitError):  # the fp32 masters' sums differ from the bf16 engine's
        check()
    conversations = [
        [{"role": "user", "content": f"{i} + {i}?"}, {"role": "assistant", "content": f"{2 * i}"}]
        for i in range(4)
    ]
    batch = collate([tokenize_conversation(tokenizer, c) for c in conversations])
    actor.train(batch, sft_loss, batch.num_target_tokens)
    with pytest.raises(RefitError, match="sum"):
        check(engine_dtype=engine_dtype)
    actor.refit_engine()
    check(engine_dtype=engine_dtype)
    assert _parity(actor, tokenizer) <= 1.05
