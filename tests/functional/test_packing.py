"""Packed (unpadded) forward: same hidden states, log-probabilities and gradients as the padded batch."""

import pytest
import torch
from conftest import make_tiny_model_dir
from transformers import AutoModelForCausalLM

from posttrain.models.logprobs import token_logprobs
from posttrain.models.packing import PackedLayout, packed_hidden_states


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

    from posttrain.models.attention import gqa_sdpa_attention

    torch.manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    query, key, value = torch.randn(2, 6, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[0, ..., :2] = False  # row 0 is left-padded by 2
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.5)
    got, _ = gqa_sdpa_attention(module, query, key, value, mask, scaling=0.5)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
