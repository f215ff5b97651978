"""The sampling loop against transformers' own `generate` on a tiny random model."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from posttrain.generation.sampler import sample
from posttrain.generation.sampling import SamplingParams, hf_generate


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _prompts(tokenizer):
    texts = ["What is 2 + 3?", "Add 4 and 5, then say hello to everyone in the room", "7 + 1 ="]
    return [tokenizer(t)["input_ids"] for t in texts]


def test_greedy_equals_transformers_generate(model, tokenizer):
    """Same tokens as `model.generate(do_sample=False)` on prompts of different lengths, with a
    repeated prompt (shared prefill) and rows finishing at different steps."""
    prompts = _prompts(tokenizer)
    prompts = [prompts[0], prompts[1], prompts[0], prompts[2]]
    eos = {tokenizer.eos_token_id}
    tokens, _ = sample(
        model, prompts, max_new_tokens=12, eos_ids=eos, pad_id=tokenizer.pad_token_id, temperature=0
    )
    for prompt, got in zip(prompts, tokens, strict=True):
        ids = torch.tensor([prompt])
        ref = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=12,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )[0, len(prompt) :].tolist()
        ref = ref[: ref.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in ref else ref
        assert got == ref


def test_rows_that_finish_leave_the_others_unchanged(model, tokenizer):
    """Pretending a frequent token is EOS makes rows finish early and the batch shrink; the rows still
    running must decode exactly as in a batch where nothing finishes."""
    prompts = _prompts(tokenizer) * 2
    full, _ = sample(
        model, prompts, max_new_tokens=10, eos_ids={-1}, pad_id=tokenizer.pad_token_id, temperature=0
    )
    stop_token = full[1][2]
    cut, _ = sample(
        model, prompts, max_new_tokens=10, eos_ids={stop_token}, pad_id=tokenizer.pad_token_id, temperature=0
    )
    for a, b in zip(full, cut, strict=True):
        n = a.index(stop_token) + 1 if stop_token in a else len(a)
        assert b == a[:n]


def test_seeded_sampling_is_reproducible_and_seed_dependent(model, tokenizer):
    prompts = _prompts(tokenizer) * 4
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    a = hf_generate(model, tokenizer, prompts, params)
    b = hf_generate(model, tokenizer, prompts, params)
    c = hf_generate(model, tokenizer, prompts, SamplingParams(temperature=1.0, max_new_tokens=8, seed=4))
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert a.token_ids != c.token_ids


def test_stop_strings_end_the_completion(model, tokenizer):
    prompts = _prompts(tokenizer)
    free = hf_generate(model, tokenizer, prompts, SamplingParams(temperature=0, max_new_tokens=12))
    text = tokenizer.decode(free.token_ids[0])
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), f"pick a visible stop string from {text!r}"
    stopped = hf_generate(
        model, tokenizer, prompts, SamplingParams(temperature=0, max_new_tokens=12, stop_strings=(stop,))
    )
    first = stopped.token_ids[0]
    assert stop in tokenizer.decode(first) and stop not in tokenizer.decode(first[:-1])
    assert free.token_ids[0][: len(first)] == first
    assert stopped.truncated[0] is False
