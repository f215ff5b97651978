"""FSDP2 + colocated HF generation and scoring never leave a rank out of a collective (issue 12, item 4).

Under FSDP2 every forward all-gathers each layer's parameters from all ranks. The sampler used to
stop decoding on a rank once its own rows finished, and a call reached only as many ranks as the
work had pieces (fewer prompts or rows than ranks; uneven batch counts): the ranks still in a
forward then waited forever. Two FSDP2 ranks over gloo on CPU. Every group call runs under a
deadline (`_within`: a blocked `ray.get` does not see pytest-timeout's signal), and every test has a
timeout as a backstop, so a deadlock fails instead of hanging.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from posttrain.config.common import ClusterConfig, PolicyConfig
from posttrain.config.rollout import GenerationConfig, RefitCheckConfig
from posttrain.data.batching import TokenBatch
from posttrain.distributed.refit_check import check_refit
from posttrain.generation.sampling import SamplingParams

pytestmark = pytest.mark.ray

NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS)
DEADLINE_S = 120.0  # each call takes seconds; the old code's deadlocks never return


def _within(call: Callable[..., Any], *args: Any) -> Any:
    """call(*args), failing the test if it has not returned after DEADLINE_S (a deadlocked collective)."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call(*args)
        except BaseException as e:  # re-raised in the test's thread
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)  # a deadlocked one must not block the exit
    thread.start()
    thread.join(DEADLINE_S)
    if thread.is_alive():
        if "group" in _GROUP:  # its ranks are stuck in a collective: the next test gets a new group
            _GROUP.pop("group").shutdown()
        pytest.fail(
            f"{getattr(call, '__name__', call)} did not return in {DEADLINE_S:.0f} s: a rank left a collective"
        )
    if "error" in result:
        raise result["error"]
    return result["value"]


@pytest.fixture(scope="module")
def early_eos(tmp_path_factory, tiny_model_dir, tokenizer):
    """The tiny model with its EOS set to the first token it greedily answers prompt A with: A finishes
    after one token; prompts B and C run the full NEW_TOKENS. (folder, [A, B, C])"""
    from transformers import AutoModelForCausalLM

    from posttrain.generation.sampler import sample

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    texts = ["The capital of France", "Count to", "Tell me a story about", "2 + 2 =", "Question 1: what"]
    candidates = [tokenizer(text)["input_ids"] for text in texts]  # a random model repeats the last token
    greedy = [
        sample(
            model, [p], max_new_tokens=NEW_TOKENS, eos_ids={tokenizer.eos_token_id}, pad_id=0, temperature=0
        )[0][0]
        for p in candidates
    ]
    eos = greedy[0][0]
    long = [candidates[i] for i in range(1, len(candidates)) if eos not in greedy[i]][:2]
    assert len(long) == 2, "no prompts that run longer than A"
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    path = tmp_path_factory.mktemp("early_eos")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, [candidates[0], *long]


def _cfg(**kw) -> PolicyConfig:
    return PolicyConfig(logprob_batch_size=1, train_micro_batch_size=1, **kw)


@pytest.fixture(scope="module")
def plain(early_eos):
    """One unsharded policy: what the sharded ranks must reproduce."""
    from posttrain.distributed.actor import ActorPolicy

    path, _ = early_eos
    return ActorPolicy(_cfg(), model_path=str(path), total_steps=1, tokenizer_path=str(path))


_GROUP: dict[str, Any] = {}  # the module's FSDP2 group; dropped (and rebuilt) after a deadlock


@pytest.fixture(scope="module")
def _group_holder(ray_cluster):
    yield _GROUP
    if "group" in _GROUP:
        _GROUP.pop("group").shutdown()


@pytest.fixture
def fsdp_group(_group_holder, early_eos):
    """Two FSDP2 ranks (gloo), shared by the tests unless one left them deadlocked."""
    from posttrain.distributed.actor_group import ActorGroup

    if "group" not in _group_holder:
        path, _ = early_eos
        _group_holder["group"] = ActorGroup(
            _cfg(fsdp=True),
            ClusterConfig(backend="ray", num_workers=2),
            model_path=str(path),
            total_steps=1,
            tokenizer_path=str(path),
            generation=GenerationConfig(),
        )
    return _group_holder["group"]


def _batch(prompts: list[list[int]], completions: list[list[int]]) -> TokenBatch:
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    length = max(map(len, rows))
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    attention = torch.zeros_like(ids)
    loss_mask = torch.zeros(len(rows), length)
    for i, (p, row) in enumerate(zip(prompts, rows, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        loss_mask[i, len(p) : len(row)] = 1
    return TokenBatch(ids, attention, loss_mask)


@pytest.mark.timeout(300)
def test_a_rank_whose_rows_finish_first_keeps_joining_the_forwards(fsdp_group, plain, early_eos):
    """Rank 0 gets A (EOS after one token), rank 1 gets B (NEW_TOKENS tokens)."""
    _, (a, b, _) = early_eos
    want = plain.generate([a, b], GREEDY, 4)
    assert len(want.token_ids[0]) == 1 and not want.truncated[0]
    assert len(want.token_ids[1]) == NEW_TOKENS and want.truncated[1]
    got = _within(fsdp_group.generate, [a, b], GREEDY, 4)
    assert got.token_ids == want.token_ids and got.truncated == want.truncated
    # and the other way round: the rank that finishes first is rank 1
    got = _within(fsdp_group.generate, [b, a], GREEDY, 4)
    assert got.token_ids == want.token_ids[::-1]


@pytest.mark.timeout(300)
def test_a_rank_without_prompts_joins_the_forwards(fsdp_group, plain, early_eos):
    _, (_, b, _) = early_eos
    got = _within(fsdp_group.generate, [b], GREEDY, 4)
    assert got.token_ids == plain.generate([b], GREEDY, 4).token_ids


@pytest.mark.timeout(300)
def test_ranks_with_different_numbers_of_batches(fsdp_group, plain, early_eos):
    """Three prompts, one per batch: rank 0 runs two batches, rank 1 one."""
    _, prompts = early_eos
    params = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=5)
    got = _within(fsdp_group.generate, prompts, params, 1)
    assert len(got.token_ids) == 3 and len(got.token_ids[0]) >= 1


@pytest.mark.timeout(300)
def test_logprobs_of_fewer_rows_than_ranks_and_uneven_microbatches(fsdp_group, plain, early_eos):
    _, prompts = early_eos
    completions = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    one = _batch(prompts[:1], completions[:1])  # one row for two ranks
    torch.testing.assert_close(_within(fsdp_group.logprobs, one), plain.logprobs(one), rtol=1e-4, atol=1e-5)
    three = _batch(prompts, completions)  # rows 2 + 1, one per microbatch: two forwards against one
    torch.testing.assert_close(
        _within(fsdp_group.logprobs, three), plain.logprobs(three), rtol=1e-4, atol=1e-5
    )


@pytest.mark.timeout(300)
def test_refit_check_logprobs_mode_with_fewer_probe_prompts_than_ranks(fsdp_group, early_eos, tokenizer):
    _, prompts = early_eos
    cfg = RefitCheckConfig(mode="logprobs", prompts=1, new_tokens=4)
    params = SamplingParams(temperature=1.0, seed=0)
    metrics = _within(check_refit, cfg, fsdp_group, fsdp_group, prompts[1:], params, tokenizer.pad_token_id)
    assert metrics["refit/probe_mult_prob_error"] <= 1.01


@pytest.mark.timeout(300)
def test_training_on_uneven_shards_joins_every_forward_and_backward(fsdp_group, early_eos):
    """Rank 0 trains on two rows (two microbatches), rank 1 on one: rank 1 adds a zero-loss dummy
    microbatch. The step equals one unsharded worker's on the whole batch. (Last: it trains the group.)"""
    from posttrain.distributed.actor import ActorPolicy
    from posttrain.models.policy import Policy
    from posttrain.trainers.sft import sft_loss

    path, prompts = early_eos
    batch = _batch(prompts, [[5, 6, 7], [8, 9], [10, 11, 12, 13]])
    tokens = batch.num_target_tokens
    shards = [(batch.select(0, 2), sft_loss, tokens), (batch.select(2, 3), sft_loss, tokens)]
    results = _within(fsdp_group.workers.run, ActorPolicy.train, shards)
    reference = Policy(_cfg(), model_path=str(path), total_steps=1).train(batch, sft_loss, tokens)
    loss = sum(r.loss_metrics["loss"] for r in results)
    assert loss == pytest.approx(reference.loss_metrics["loss"], rel=1e-5)
    assert results[0].grad_norm == pytest.approx(reference.grad_norm, rel=1e-4)
