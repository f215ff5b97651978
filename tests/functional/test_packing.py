"""Packed (unpadded) forward: same hidden states, log-probabilities and gradients as the padded batch."""

import pytest
import torch
from conftest import make_tiny_model_dir
from transformers import AutoModelForCausalLM

from posttrain.modeling.packing import PackedLayout, packed_hidden_states
from posttrain.models.logprobs import token_logprobs


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """3 sequences: left-padded by 2, full, right-padded by 4 (lengths 8, 10, 6)."""
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[0, :2] = 0
    mask[2, 6:] = 0
    return ids, mask


def test_layout_positions_and_grid_index_by_hand():
    _, mask = padded_batch()
    layout = PackedLayout(mask)
    assert layout.max_len == 10 and layout.batch_size == 3
    expected_positions = list(range(8)) + list(range(10)) + list(range(6))
    assert layout.positions.tolist() == [expected_positions]
    # row b, position p -> b * 10 + p
    assert layout.grid_index.tolist() == list(range(8)) + list(range(10, 20)) + list(range(20, 26))


@pytest.mark.parametrize("kv_heads", [4, 2])  # plain multi-head and grouped-query attention
def test_packed_hidden_states_equal_padded_forward(tmp_path, tokenizer, kv_heads):
    model_dir = make_tiny_model_dir(tmp_path, tokenizer, num_key_value_heads=kv_heads)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids, mask = padded_batch()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        padded = model.base_model(
            input_ids=ids, attention_mask=mask, position_ids=positions
        ).last_hidden_state
        packed = packed_hidden_states(model, ids, mask)
    valid = mask.bool()
    torch.testing.assert_close(packed[valid], padded[valid], rtol=1e-5, atol=1e-5)
    assert torch.all(packed[~valid] == 0)
    assert model.config._attn_implementation == "sdpa"  # restored after the packed forward


def test_packed_logprobs_and_gradients_equal_padded(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids, mask = padded_batch()
    target = mask.clone().float()
    target[:, :4] = 0  # "prompt" tokens are not targets

    def logprobs_and_grads(packed: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        lp = token_logprobs(model, ids, mask, target, packed=packed)
        (lp * torch.linspace(0.5, 1.5, lp.numel()).view_as(lp)).sum().backward()
        return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    lp_padded, grads_padded = logprobs_and_grads(packed=False)
    lp_packed, grads_packed = logprobs_and_grads(packed=True)
    torch.testing.assert_close(lp_packed, lp_padded, rtol=1e-5, atol=1e-5)
    assert torch.all(lp_packed[target == 0] == 0)
    for name, grad in grads_padded.items():
        torch.testing.assert_close(grads_packed[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("packed", [True, False])
def test_activation_checkpointing_gives_the_same_logprobs_and_gradients(tiny_model_dir, packed):
    """Recomputing each layer in backward changes no number: the recomputation runs with the attention
    the forward ran with (a packed forward's layers were once recomputed with the model's "sdpa":
    torch refused, "a different number of tensors was saved", and policy.activation_checkpointing
    with the default packed_sequences could not train at all). float64: equal to 1e-12."""
    from posttrain.modeling.attention import enable_activation_checkpointing

    ids, mask = padded_batch()
    target = mask.clone().double()
    target[:, :4] = 0

    def logprobs_and_grads(checkpointing: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float64).train()
        if checkpointing:
            enable_activation_checkpointing(model)
        lp = token_logprobs(model, ids, mask, target, packed=packed)
        (lp * torch.linspace(0.5, 1.5, lp.numel(), dtype=torch.float64).view_as(lp)).sum().backward()
        assert model.config._attn_implementation == "sdpa"  # restored after forward and backward
        return lp.detach(), {n: p.grad for n, p in model.named_parameters()}

    lp_plain, grads_plain = logprobs_and_grads(checkpointing=False)
    lp_ckpt, grads_ckpt = logprobs_and_grads(checkpointing=True)
    torch.testing.assert_close(lp_ckpt, lp_plain, rtol=0, atol=1e-12)
    for name, grad in grads_plain.items():
        torch.testing.assert_close(grads_ckpt[name], grad, rtol=0, atol=1e-12, msg=name)


class _NoAttentionDecoder(torch.nn.Module):
    """A decoder that never calls transformers' attention functions (as a custom model might)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.embed = torch.nn.Embedding(1000, 8)

    def forward(self, input_ids, **kwargs):
        from types import SimpleNamespace

        return SimpleNamespace(last_hidden_state=self.embed(input_ids))


def test_model_that_bypasses_attention_interface_is_refused(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.model = _NoAttentionDecoder(model.config)  # base_model -> the custom decoder
    ids, mask = padded_batch()
    with pytest.raises(RuntimeError, match="packed_sequences=false"):
        packed_hidden_states(model, ids, mask)
    assert model.config._attn_implementation == "sdpa"


def test_packed_reward_scores_equal_padded(tiny_model_dir, tokenizer):
    from posttrain.models.reward_model import load_reward_model, sequence_scores

    model = load_reward_model(str(tiny_model_dir), torch.float32, pad_token_id=tokenizer.pad_token_id).eval()
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 7:] = 0  # right-padded, as reward-model batches are
    mask[2, 4:] = 0
    with torch.no_grad():
        padded = sequence_scores(model, ids, mask)
        packed = sequence_scores(model, ids, mask, packed=True)
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


def test_gqa_sdpa_attention_equals_transformers_sdpa_with_padding_mask():
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from posttrain.modeling.attention import gqa_sdpa_attention

    torch.manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    query, key, value = torch.randn(2, 6, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[0, ..., :2] = False  # row 0 is left-padded by 2
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.5)
    got, _ = gqa_sdpa_attention(module, query, key, value, mask, scaling=0.5)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def tiny_gemma2_dir(tmp_path):
    """A random 2-layer Gemma 2 whose soft-caps bind: attention scores capped at 1, logits at 2, and a
    sliding window of 4 on its first layer (shorter than the test's sequences)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        attn_logit_softcapping=1.0,
        final_logit_softcapping=2.0,
        sliding_window=4,
    )
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5)  # large scores and logits, so that both soft-caps change them
    model.save_pretrained(tmp_path / "gemma2")
    return tmp_path / "gemma2"


def reference_logprobs(model, ids, mask, target):
    """log p of each target token from the model's plain forward on each sequence alone (no padding)."""
    out = torch.zeros(ids.shape, dtype=torch.float64)
    for b in range(ids.shape[0]):
        cols = mask[b].bool().nonzero().squeeze(1)
        with torch.no_grad():
            logits = model(input_ids=ids[b, cols].unsqueeze(0)).logits[0].double()
        lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[b, cols[1:]].unsqueeze(1)).squeeze(1)
        keep = target[b, cols[1:]].bool()
        out[b, cols[1:][keep]] = lp[keep]
    return out


@pytest.mark.parametrize("packed", [False, True])
def test_gemma2_softcapped_logprobs_equal_eager_forward(tmp_path, packed):
    from posttrain.models.policy import load_causal_lm

    model_dir = tiny_gemma2_dir(tmp_path)
    eager = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager")
    sdpa = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="sdpa")
    # fp32, as policies train (transformers' eager attention on a padded fp64 batch returns NaN)
    policy = load_causal_lm(str(model_dir), torch.float32).eval()
    assert policy.config._attn_implementation == "eager"  # transformers' sdpa drops the attention soft-cap
    ids, mask = padded_batch()
    ids = ids % 64
    target = mask.clone()
    target[:, :4] = 0
    want = reference_logprobs(eager.eval(), ids, mask, target)
    # the soft-cap matters here: sdpa, which ignores it, is far off
    assert float((reference_logprobs(sdpa.eval(), ids, mask, target) - want).abs().max()) > 0.05
    with torch.no_grad():
        got = token_logprobs(policy, ids, mask, target, packed=packed)
    # fp32 rounding: a few dozen roundings (eps 1.2e-7) at the logprobs' magnitude; ignoring either
    # soft-cap is off by more than 0.05
    tolerance = 64 * torch.finfo(torch.float32).eps * (1.0 + float(want.abs().max()))
    torch.testing.assert_close(got.double(), want, rtol=0, atol=tolerance)
