"""Models that transform lm_head's output (issue 12, item 5): the lean logprob path, which calls the
decoder and lm_head apart, must give the logprobs of the model's own logits, which the sampler uses.

Granite divides the logits by `logits_scaling`, Cohere multiplies them by `logit_scale`, Gemma 2
soft-caps them (c * tanh(z / c), `final_logit_softcapping`). A model whose transform posttrain does
not know is detected by a probe and scored through its own forward.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    CohereConfig,
    CohereForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

from posttrain.generation.sampler import sample
from posttrain.models.logprobs import token_logprobs

VOCAB = 96
SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


class TripledLlama(LlamaForCausalLM):
    """A transform that no config field declares: the lean path cannot know it."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 3.0
        return out


def _granite():
    return GraniteForCausalLM(GraniteConfig(**SIZES, logits_scaling=4.0))


def _cohere():
    return CohereForCausalLM(CohereConfig(**SIZES, logit_scale=2.5))


def _gemma2():
    config = Gemma2Config(**SIZES, head_dim=16, final_logit_softcapping=1.5, attn_logit_softcapping=None)
    return Gemma2ForCausalLM(config)


def _tripled():
    return TripledLlama(LlamaConfig(**SIZES))


MODELS = {"granite": _granite, "cohere": _cohere, "gemma2": _gemma2, "unknown_transform": _tripled}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = MODELS[name]()
    with torch.no_grad():  # logits of a few units, so that every transform bends them visibly
        model.get_output_embeddings().weight.mul_(40.0)
    return model.eval()


def _batch():
    torch.manual_seed(1)
    ids = torch.randint(3, VOCAB, (3, 12))
    attention = torch.ones_like(ids)
    attention[1, 9:] = 0
    attention[2, 6:] = 0
    target = torch.zeros(3, 12)
    target[0, 2:] = 1
    target[1, 4:9] = 1
    target[2, 3:6] = 1
    return ids, attention, target


def _reference(model, ids, attention, target, temperature):
    """log softmax(model(...).logits / T) at the targets: what the sampler draws from."""
    logits = model(input_ids=ids, attention_mask=attention).logits
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    full = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    out = torch.zeros(ids.shape, dtype=full.dtype)
    out[:, 1:] = full * target[:, 1:]
    return out


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_lean_logprobs_equal_the_models_own_logits(name, packed, temperature):
    model = _model(name)
    ids, attention, target = _batch()
    with torch.no_grad():
        want = _reference(model, ids, attention, target, temperature)
        assert want[target.bool()].std() > 0.5  # a spread the transforms change
        for chunk in (2, 4096):
            got = token_logprobs(
                model, ids, attention, target, chunk_size=chunk, temperature=temperature, packed=packed
            )
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_lean_logprob_gradients_equal_autograd_of_the_models_logits(name):
    """The training path (grad enabled: the fused LinearLogprobs or the generic path) differentiates the
    transformed logits. In float64: the claim is exact math, so only float64 rounding may differ."""
    ids, attention, target = _batch()
    grads = []
    for lean in (True, False):
        model = _model(name).double()
        if lean:
            lp = token_logprobs(model, ids, attention, target, chunk_size=4, temperature=0.7)
        else:
            lp = _reference(model, ids, attention, target, 0.7)
        (lp * torch.linspace(-1, 2, lp.numel()).view_as(lp)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    lean_grads, own_grads = grads
    assert lean_grads.keys() == own_grads.keys()
    for n in own_grads:
        error = float((lean_grads[n] - own_grads[n]).norm() / own_grads[n].norm())
        assert error < 1e-10, f"{n}: relative error {error:.2e}"


@pytest.mark.parametrize("name", list(MODELS))
def test_sampler_logprobs_equal_training_logprobs(name):
    model = _model(name)
    prompts = [[1, 5, 9, 14], [1, 7], [1, 30, 31]]
    temperature = 0.8
    tokens, gen_logprobs = sample(
        model, prompts, max_new_tokens=6, eos_ids={2}, pad_id=0, temperature=temperature, seed=3
    )
    rows = [p + t for p, t in zip(prompts, tokens, strict=True)]
    length = max(map(len, rows))
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    attention = torch.zeros_like(ids)
    target = torch.zeros(len(rows), length)
    for i, (p, row) in enumerate(zip(prompts, rows, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        target[i, len(p) : len(row)] = 1
    with torch.no_grad():
        train = token_logprobs(model, ids, attention, target, temperature=temperature)
    for i, (p, lps) in enumerate(zip(prompts, gen_logprobs, strict=True)):
        torch.testing.assert_close(
            train[i, len(p) : len(p) + len(lps)], torch.tensor(lps), rtol=1e-4, atol=1e-4
        )
