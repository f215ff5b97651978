"""Per-token log-probabilities computed only where they are needed.

The decoder runs once; the vocabulary projection runs only on the hidden states of positions
whose next token is a target, a chunk of `chunk_size` positions at a time, so full-vocabulary
fp32 logits never exist for the whole batch at once.
"""

from __future__ import annotations

import torch


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] for logits [N, V] and targets [N], computed in fp32."""
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def chunked_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, lm_head: torch.nn.Module, chunk_size: int
) -> torch.Tensor:
    """[N, H] hidden states and [N] targets -> [N] log-probabilities, `chunk_size` rows at a time."""
    if hidden.shape[0] <= chunk_size:
        return gather_logprobs(lm_head(hidden), targets)
    parts = [
        gather_logprobs(lm_head(hidden[i : i + chunk_size]), targets[i : i + chunk_size])
        for i in range(0, hidden.shape[0], chunk_size)
    ]
    return torch.cat(parts)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    target_mask: torch.Tensor,
    *,
    chunk_size: int = 2048,
) -> torch.Tensor:
    """[B, T] tensor whose [b, t] is log p(input_ids[b, t] | input_ids[b, <t]) where target_mask is set, else 0.

    `model` is a Hugging Face causal LM; its decoder (`base_model`) and `lm_head` are called
    separately so that the projection skips positions that are not targets.
    """
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    selected = target_mask[:, 1:].bool()
    lp = chunked_logprobs(
        hidden[:, :-1][selected], input_ids[:, 1:][selected], model.get_output_embeddings(), chunk_size
    )
    rows, cols = selected.nonzero(as_tuple=True)
    out = torch.zeros(input_ids.shape, dtype=lp.dtype, device=lp.device)
    return out.index_put((rows, cols + 1), lp)
