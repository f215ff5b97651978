"""The logits side of top-k distillation, chunked over positions so that no full-vocabulary tensor
exists for more than `chunk_size` positions at once.

Teacher (`teacher_topk_chunk`): the log-softmax of a chunk of logits, its top-k log-probabilities and
ids, and the exact log-mass outside them; everything else is dropped.

Student (`student_topk`): at the positions of its generated tokens, its logits gathered at the
teacher's ids (with gradient), the log-sum-exp over the full vocabulary and over the vocabulary
outside the top-k (with gradient), the log-probability of the sampled token and its own top-1 id.
With gradients on, each chunk's lm_head projection runs under activation checkpointing: its [c, V]
logits are recomputed in backward instead of kept, so the memory of the head is one chunk's.

Positions: a batch's `target_mask[b, t] = 1` marks token t as scored; it is predicted from the
hidden state at t - 1. Scored positions are taken in row-major order (`target_mask.bool()`), the
order in which the teacher's results come back and the student reads them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.utils.checkpoint

from posttrain.modeling.packing import packed_hidden_states, packed_logits_at
from posttrain.models.logprobs import at_least_fp32, is_fsdp_module, lean_logits_transform

Head = Callable[[torch.Tensor], torch.Tensor]
"""Rows of the head's input (hidden states, or logits already computed) -> [c, V] logits."""


class PositionInputs(NamedTuple):
    """What the vocabulary projection needs at the N scored positions: `rows` [N, H] hidden states
    (lean path) or [N, V] logits (the model's own forward), and `head`, rows -> logits (transform and
    temperature applied); `lean` says which."""

    rows: torch.Tensor
    head: Head
    lean: bool


def scored_position_inputs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    target_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    packed: bool = False,
) -> PositionInputs:
    """The decoder's hidden states at the positions predicting the tokens where `target_mask` is set,
    and the head that turns them into softmax(logits / temperature)'s logits.

    Lean path: decoder (`base_model`, or on the real tokens only when `packed`), then lm_head, then the
    model's declared logits transform (`lean_logits_transform`). A model sharded with FSDP2, or whose
    logits the lean path does not reproduce, is called whole and its logits at those positions
    ([N, V], all at once) are the rows."""
    selected = target_mask[:, 1:].bool()
    transform = None if is_fsdp_module(model) else lean_logits_transform(model)

    def tempered(logits: torch.Tensor) -> torch.Tensor:
        logits = at_least_fp32(logits)
        return logits / temperature if temperature != 1.0 else logits

    if transform is None:
        predictors = torch.nn.functional.pad(selected, (0, 1))
        if packed:
            logits = packed_logits_at(model, input_ids, attention_mask, predictors)
        else:
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[predictors]
        return PositionInputs(logits, tempered, lean=False)
    if packed:
        hidden = packed_hidden_states(model, input_ids, attention_mask)
    else:
        hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    lm_head = model.get_output_embeddings()
    return PositionInputs(
        hidden[:, :-1][selected], lambda h: tempered(transform.apply(lm_head(h))), lean=True
    )


def _outside_logsumexp(logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """log Σ_{v ∉ indices} exp(logits_v) per row, [c, V] and [c, k] -> [c]; -inf (no gradient) for a
    row whose ids cover every finite logit (k = V)."""
    rest = logits.scatter(1, indices, -math.inf)
    empty = (rest == -math.inf).all(dim=1, keepdim=True)
    out = torch.logsumexp(torch.where(empty, torch.zeros_like(rest), rest), dim=1)
    return torch.where(empty.squeeze(1), torch.full_like(out, -math.inf), out)


# ----------------------------------------------------------------------------- teacher
class TeacherTopK(NamedTuple):
    """The teacher's distribution at N positions: `logprobs` [N, k] (fp32, descending) and `indices`
    [N, k] (int32) of its top-k tokens, `tail_logprob` [N] = log(1 - Σ top-k), computed over the rest
    of the vocabulary, and `sampled_logprob` [N], its log-probability of the token actually there."""

    logprobs: torch.Tensor
    indices: torch.Tensor
    tail_logprob: torch.Tensor
    sampled_logprob: torch.Tensor

    @staticmethod
    def cat(parts: list[TeacherTopK]) -> TeacherTopK:
        return TeacherTopK(*(torch.cat(fields) for fields in zip(*parts, strict=True)))

    @staticmethod
    def empty(k: int) -> TeacherTopK:
        zero = torch.zeros(0)
        return TeacherTopK(torch.zeros(0, k), torch.zeros(0, k, dtype=torch.int32), zero, zero)


@torch.no_grad()
def teacher_topk_chunk(logits: torch.Tensor, k: int, targets: torch.Tensor) -> TeacherTopK:
    """[c, V] logits (temperature applied) and the [c] tokens there -> the top-k of log_softmax(logits)
    (k capped at V), the log-mass outside them and the tokens' log-probabilities."""
    logprobs = torch.log_softmax(at_least_fp32(logits), dim=-1)
    top, indices = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
    tail = _outside_logsumexp(logprobs, indices)
    sampled = logprobs.gather(1, targets.long().unsqueeze(1)).squeeze(1)
    return TeacherTopK(top.float(), indices.to(torch.int32), tail.float(), sampled.float())


@torch.no_grad()
def teacher_topk(inputs: PositionInputs, targets: torch.Tensor, k: int, chunk_size: int) -> TeacherTopK:
    """`teacher_topk_chunk` over the N scored positions (tokens `targets` [N]), `chunk_size` at a time;
    CPU tensors."""
    parts = []
    for i in range(0, inputs.rows.shape[0], chunk_size):
        logits = inputs.head(inputs.rows[i : i + chunk_size])
        parts.append(
            TeacherTopK(*(t.cpu() for t in teacher_topk_chunk(logits, k, targets[i : i + chunk_size])))
        )
    return TeacherTopK.cat(parts) if parts else TeacherTopK.empty(k)


# ----------------------------------------------------------------------------- student
class StudentTopK(NamedTuple):
    """The student's side of the top-k loss at N positions (gradient through the first four).

    topk_logits [N, k]: its logits at the teacher's ids; logsumexp [N]: over the full vocabulary;
    tail_logsumexp [N]: over the vocabulary outside the teacher's ids (-inf when they cover it);
    sampled_logprobs [N]: log q(a_t) of the generated tokens; top1 [N]: its argmax id (no gradient).
    """

    topk_logits: torch.Tensor
    logsumexp: torch.Tensor
    tail_logsumexp: torch.Tensor
    sampled_logprobs: torch.Tensor
    top1: torch.Tensor


def _student_chunk(
    rows: torch.Tensor, indices: torch.Tensor, targets: torch.Tensor, head: Head
) -> tuple[torch.Tensor, ...]:
    logits = head(rows)
    lse = torch.logsumexp(logits, dim=-1)
    sampled = logits.gather(1, targets.unsqueeze(1)).squeeze(1) - lse
    top1 = logits.detach().argmax(dim=-1)
    return logits.gather(1, indices), lse, _outside_logsumexp(logits, indices), sampled, top1


def student_topk_from_rows(
    inputs: PositionInputs, indices: torch.Tensor, targets: torch.Tensor, chunk_size: int
) -> StudentTopK:
    """`StudentTopK` at the N positions of `inputs` for the teacher's `indices` [N, k] and the sampled
    `targets` [N], `chunk_size` positions at a time. With gradients on, a lean chunk's logits are
    recomputed in backward (activation checkpointing) rather than kept."""
    indices, targets = indices.long(), targets.long()
    recompute = inputs.lean and torch.is_grad_enabled()
    parts = []
    for i in range(0, inputs.rows.shape[0], chunk_size):
        args = (inputs.rows[i : i + chunk_size], indices[i : i + chunk_size], targets[i : i + chunk_size])
        if recompute:
            parts.append(
                torch.utils.checkpoint.checkpoint(_student_chunk, *args, inputs.head, use_reentrant=False)
            )
        else:
            parts.append(_student_chunk(*args, inputs.head))
    if not parts:
        zero = inputs.rows.new_zeros(0, dtype=torch.float32)
        empty = StudentTopK(zero.new_zeros(0, indices.shape[1]), zero, zero, zero, targets.new_zeros(0))
        return empty
    return StudentTopK(*(torch.cat(f) for f in zip(*parts, strict=True)))


def student_topk(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    target_mask: torch.Tensor,
    teacher_indices: torch.Tensor,
    *,
    chunk_size: int,
    temperature: float = 1.0,
    packed: bool = False,
) -> StudentTopK:
    """`StudentTopK` at the positions where `target_mask` [B, T] is set, in row-major order.

    `teacher_indices` [B, T, k]: the teacher's top-k ids for token t at [b, t] (read where the mask is
    set). The student's distribution is softmax(logits / temperature)."""
    inputs = scored_position_inputs(
        model, input_ids, attention_mask, target_mask, temperature=temperature, packed=packed
    )
    selected = target_mask.bool().clone()
    selected[:, 0] = False  # token 0 has no predictor
    return student_topk_from_rows(inputs, teacher_indices[selected], input_ids[selected], chunk_size)
