"""Unpadded ("packed") decoder forward passes.

A training batch is a [B, T] grid: left-padded prompts, right-padded responses. On 16 GRPO
rollouts of the quickstart about a fifth of the grid is padding, and every linear layer, norm
and activation of the decoder would spend that fifth on it. `packed_hidden_states` runs the
decoder on the N real tokens only, laid end to end as one [1, N] row:

- positions restart at 0 for every sequence (`position_ids`), as in generation;
- every projection, norm and MLP sees [1, N, H] - no padding;
- attention, the one place where sequences must not see each other, scatters q, k, v into a
  [B, L, ...] grid with every sequence starting at column 0 (L = longest sequence), runs causal
  SDPA there and gathers the N outputs back. Causal attention on a right-padded row never
  looks at the padding after a token, so no mask is needed.
- a layer that asks for a sliding window (Gemma 2, Mistral) gets a causal window mask when its
  sequences are longer than the window; a layer that asks for attention-logit soft-capping
  (Gemma 2's `attn_logit_softcapping`: scores -> c * tanh(scores / c) before the softmax, which SDPA
  cannot do) computes its scores explicitly on the grid, as transformers' "eager" attention does.

The attention function is registered with transformers under `PACKED_ATTENTION` and selected
only for the duration of one packed forward (`posttrain.modeling.attention`); its mask function
returns no mask, because `packed_attention` does not use one.

The result equals the padded forward up to float rounding (test: tests/functional/test_packing.py).
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.modeling.attention import PACKED_ATTENTION, attention_implementation, gqa_sdpa_attention


class PackedLayout:
    """Where the N real tokens of a [B, T] batch go.

    valid: [B, T] bool, the attention mask. positions: [1, N] position of each token within its
    sequence. grid_index: [N] flat index of each token in the [B, L] attention grid (b * L + position).
    attention_calls: how many attention layers ran `packed_attention` with this layout.

    A plain class, not a dataclass: FSDP2 rebuilds dataclass arguments when it casts forward
    inputs, and the call count must reach the original (torch.compile replays the attribute update).
    """

    def __init__(self, attention_mask: torch.Tensor) -> None:
        valid = attention_mask.bool()
        lengths = valid.sum(-1)
        self.valid = valid
        self.batch_size = valid.shape[0]
        self.max_len = int(lengths.max()) if lengths.numel() else 0
        rows = torch.arange(valid.shape[0], device=valid.device).unsqueeze(1).expand_as(valid)
        positions = (valid.long().cumsum(-1) - 1)[valid]
        self.positions = positions.unsqueeze(0)
        self.grid_index = rows[valid] * self.max_len + positions
        self.attention_calls = 0


def _to_grid(x: torch.Tensor, layout: PackedLayout) -> torch.Tensor:
    """[1, heads, N, D] -> [B, heads, L, D], zeros where a sequence has ended."""
    heads, dim = x.shape[1], x.shape[3]
    tokens = x[0].transpose(0, 1)  # [N, heads, D]
    grid = tokens.new_zeros(layout.batch_size * layout.max_len, heads, dim)
    grid = grid.index_copy(0, layout.grid_index, tokens)
    return grid.view(layout.batch_size, layout.max_len, heads, dim).transpose(1, 2)


def _grid_attention(
    module: torch.nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Causal attention on the [B, heads, L, D] grid -> [B, L, Hq, D], honouring the layer's soft-cap
    and sliding window (the keyword arguments transformers' decoder layers pass)."""
    length = q.shape[2]
    window = sliding_window if sliding_window is not None and sliding_window < length else None
    if softcap is None and window is None:
        return gqa_sdpa_attention(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True)[0]
    mask = _causal_mask(length, window, q.device)
    if softcap is None:
        return gqa_sdpa_attention(module, q, k, v, mask, dropout=dropout, scaling=scaling)[0]
    return _softcapped_attention(module, q, k, v, mask, dropout=dropout, scaling=scaling, softcap=softcap)


def _causal_mask(length: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[L, L] bool, True where query i may attend key j: j <= i, and i - j < window if a window is set
    (transformers' sliding-window mask)."""
    i = torch.arange(length, device=device).unsqueeze(1)
    j = torch.arange(length, device=device).unsqueeze(0)
    allowed = j <= i
    return allowed & (i - j < window) if window is not None else allowed


def _softcapped_attention(
    module: torch.nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    *,
    dropout: float,
    scaling: float | None,
    softcap: float,
) -> torch.Tensor:
    """softmax(c * tanh(q k^T * scaling / c), masked) v, the softmax in fp32, as transformers' eager
    attention computes it for Gemma 2. q [B, Hq, L, D], k/v [B, Hkv, L, D] -> [B, L, Hq, D]."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:  # query head h reads key/value head h // groups (transformers' repeat_kv)
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return (probs @ v).transpose(1, 2).contiguous()


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    packed_layout: PackedLayout | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention of each packed sequence on itself; same signature as transformers' attention functions.

    query [1, Hq, N, D], key/value [1, Hkv, N, D] -> output [1, N, Hq, D] (the layout HF's
    attention functions return). `kwargs`: dropout, scaling, softcap, sliding_window (`_grid_attention`)."""
    if packed_layout is None:
        raise RuntimeError(f"attention '{PACKED_ATTENTION}' runs only inside packed_hidden_states")
    packed_layout.attention_calls += 1
    q, k, v = (_to_grid(x, packed_layout) for x in (query, key, value))
    out = _grid_attention(module, q, k, v, **kwargs)  # [B, L, Hq, D]
    out = out.reshape(-1, out.shape[2], out.shape[3])  # [B * L, Hq, D]
    return out.index_select(0, packed_layout.grid_index).unsqueeze(0), None


def _packed_forward(
    module: torch.nn.Module,
    model: torch.nn.Module,
    layout: PackedLayout,
    input_ids: torch.Tensor,
    **kwargs: Any,
) -> Any:
    """`module` (the decoder or the whole model) on the packed [1, N] row, with packed attention."""
    with attention_implementation(model, PACKED_ATTENTION, packed_attention):
        out = module(
            input_ids=input_ids[layout.valid].unsqueeze(0),
            position_ids=layout.positions,
            packed_layout=layout,
            **kwargs,
        )
    if layout.attention_calls == 0:  # the sequences attended to each other: refuse the result
        raise RuntimeError(
            f"{type(model).__name__} does not call attention through transformers' AttentionInterface, "
            "so its sequences cannot be packed; set policy.packed_sequences=false"
        )
    return out


def packed_hidden_states(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """The decoder's last hidden states [B, T, H] for a padded batch, computed on its real tokens only.

    Padding positions are 0. `model` is a Hugging Face causal LM (its `base_model` is the decoder)."""
    layout = PackedLayout(attention_mask)
    packed = _packed_forward(model.base_model, model, layout, input_ids).last_hidden_state[0]  # [N, H]
    hidden = packed.new_zeros(*input_ids.shape, packed.shape[-1])
    return hidden.index_put((layout.valid,), packed)


def packed_logits_at(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Logits [K, V] of a causal LM at the K real positions set in `positions` ([B, T] bool), in
    row-major order, from one call of the whole model (its lm_head runs on those K positions only,
    through transformers' `logits_to_keep`)."""
    layout = PackedLayout(attention_mask)
    flat = torch.full(attention_mask.shape, -1, dtype=torch.long, device=attention_mask.device)
    flat[layout.valid] = torch.arange(int(layout.valid.sum()), device=attention_mask.device)
    keep = flat[positions.bool()]
    if bool((keep < 0).any()):
        raise ValueError("packed_logits_at: a requested position is padding")
    return _packed_forward(model, model, layout, input_ids, logits_to_keep=keep).logits[0]
