"""Continuous batching: rows that join a running batch decode as they would alone."""

from __future__ import annotations

import pytest
import torch

from posttrain.generation.continuous import ContinuousDecoder
from posttrain.generation.sampler import sample
from posttrain.models.policy import load_causal_lm


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    m = load_causal_lm(str(tiny_model_dir), torch.float32)
    m.eval()
    return m


def _prompts(tokenizer):
    texts = ["What is 2 + 2?", "Name a colour.", "Count to three, please, slowly and clearly."]
    return [tokenizer(t)["input_ids"] for t in texts]


def _decode_all(decoder: ContinuousDecoder, joins: dict[int, list], budget: int) -> dict:
    """Run until empty; `joins[step]` = [(key, prompt)] added before that step. Returns key -> Row."""
    done, step = {}, 0
    while len(decoder) or any(s >= step for s in joins):
        for key, prompt in joins.get(step, []):
            decoder.add([key], [prompt], [budget], [()])
        for row in decoder.step():
            done[row.key] = row
        step += 1
    return done


def _decoder(model, tok, **kw):
    return ContinuousDecoder(model, eos_ids={tok.eos_token_id}, pad_id=tok.pad_token_id, **kw)


def test_all_rows_at_once_decode_like_the_sampler(model, tokenizer):
    prompts = _prompts(tokenizer)
    eos = {tokenizer.eos_token_id}
    for temperature in (0.0, 1.0):
        seed = 3 if temperature else None
        want, want_lp = sample(
            model,
            prompts,
            max_new_tokens=12,
            eos_ids=eos,
            pad_id=tokenizer.pad_token_id,
            temperature=temperature,
            seed=seed,
        )
        gen = torch.Generator().manual_seed(3) if temperature else None
        decoder = _decoder(model, tokenizer, temperature=temperature, generator=gen, room=4)
        decoder.add(list(range(3)), prompts, [12] * 3, [()] * 3)
        rows = {}
        while len(decoder):
            rows.update({r.key: r for r in decoder.step()})
        for i in range(3):
            assert rows[i].tokens == want[i]
            torch.testing.assert_close(
                torch.tensor(rows[i].logprobs), torch.tensor(want_lp[i]), rtol=0, atol=1e-5
            )


def test_a_row_joining_late_decodes_as_it_would_alone(model, tokenizer):
    """Greedy: the late row (shorter and longer prompts than the running rows, so both re-layouts
    happen) gets the tokens it gets alone, and the running rows are not disturbed by its arrival."""
    a, b, c = _prompts(tokenizer)
    alone = {}
    for key, prompt in (("a", a), ("b", b), ("c", c)):
        alone[key] = _decode_all(
            _decoder(model, tokenizer, temperature=0.0, room=3), {0: [(key, prompt)]}, 10
        )[key]
    mixed = _decode_all(
        _decoder(model, tokenizer, temperature=0.0, room=3), {0: [("b", b)], 2: [("a", a)], 5: [("c", c)]}, 10
    )
    for key in "abc":
        assert mixed[key].tokens == alone[key].tokens, key
        torch.testing.assert_close(
            torch.tensor(mixed[key].logprobs), torch.tensor(alone[key].logprobs), rtol=0, atol=1e-5
        )
        assert mixed[key].finished_by == alone[key].finished_by


def test_stop_strings_and_budgets_end_rows(model, tokenizer):
    prompt = _prompts(tokenizer)[0]
    free = _decode_all(_decoder(model, tokenizer, temperature=0.0), {0: [("x", prompt)]}, 8)["x"]
    assert free.finished_by in ("length", "eos") and len(free.tokens) <= 8
    text = tokenizer.decode(free.tokens[:3])
    stop = text[-2:]  # a stop string the greedy reply reaches by its third token
    decoder = _decoder(model, tokenizer, temperature=0.0, tokenizer=tokenizer)
    decoder.add(["x"], [prompt], [8], [(stop,)])
    rows = []
    while len(decoder):
        rows += decoder.step()
    assert rows[0].finished_by == "stop" and len(rows[0].tokens) <= 3
    assert rows[0].tokens == free.tokens[: len(rows[0].tokens)]
