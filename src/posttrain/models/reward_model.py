"""Scalar reward models: a Hugging Face `AutoModelForSequenceClassification` with `num_labels=1`.

The score of a sequence is the head applied to the decoder's hidden state at its LAST real token
(right padding, read from the attention mask). `pad_token_id` is written into the model config, so
that the saved folder scores the same through transformers' own forward, which picks the last
token that is not padding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from posttrain.data.batching import TokenBatch
from posttrain.errors import UserError
from posttrain.modeling.attention import use_eager_for_softcapping
from posttrain.modeling.loading import MASTER_DTYPE
from posttrain.modeling.packing import packed_hidden_states
from posttrain.models.policy import Policy


def resolve_model_folder(path: str | Path) -> Path:
    """A model folder, or a posttrain checkpoint directory holding one in `model/`."""
    path = Path(path).expanduser()
    if not (path / "config.json").is_file() and (path / "model" / "config.json").is_file():
        return path / "model"
    if (path / "model" / "adapter_config.json").is_file() or (path / "adapter_config.json").is_file():
        raise UserError(
            f"{path} holds a LoRA adapter (a policy.lora run), not a whole reward model: merge it first with "
            f"`posttrain export {path} OUT` and use OUT"
        )
    return path


def load_reward_model(
    path: str | Path, dtype: torch.dtype, *, pad_token_id: int | None = None
) -> torch.nn.Module:
    """A sequence classifier with one output from a causal LM folder (new head) or a saved reward model."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kwargs: dict[str, Any] = {"num_labels": 1, "dtype": dtype}
    if pad_token_id is not None:
        kwargs["pad_token_id"] = pad_token_id
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized: score.weight" is the point of a new head
    try:
        model = AutoModelForSequenceClassification.from_pretrained(str(resolve_model_folder(path)), **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
    use_eager_for_softcapping(model)
    if model.config.pad_token_id is None:
        raise ValueError(
            f"the reward model at {path} has no pad_token_id in its config and none was given; "
            "transformers needs it to find the last token of a padded sequence"
        )
    return model


def score_head(model: torch.nn.Module) -> torch.nn.Module:
    head = getattr(model, "score", None)
    if head is None:
        raise TypeError(
            f"{type(model).__name__} has no `score` head; use an AutoModelForSequenceClassification"
        )
    return head


def sequence_scores(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, packed: bool = False
) -> torch.Tensor:
    """[B] scores (at least fp32): the head at each right-padded sequence's last real token (only B head rows computed).

    `packed`: the decoder runs on the real tokens only (`posttrain.modeling.packing`)."""
    if packed:
        hidden = packed_hidden_states(model, input_ids, attention_mask)
    else:
        hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    last = attention_mask.sum(dim=1) - 1
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    scores = score_head(model)(hidden[rows, last]).squeeze(-1)
    return scores.to(torch.promote_types(scores.dtype, torch.float32))


@torch.no_grad()
def batched_scores(
    model: torch.nn.Module, batch: TokenBatch, batch_size: int, *, packed: bool = False
) -> torch.Tensor:
    """[B] scores on CPU, `batch_size` sequences per forward, in eval mode."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    parts = []
    for start in range(0, len(batch), batch_size):
        micro = batch.select(start, min(start + batch_size, len(batch)))
        parts.append(
            sequence_scores(
                model, micro.input_ids.to(device), micro.attention_mask.to(device), packed=packed
            ).cpu()
        )
    model.train(was_training)
    return torch.cat(parts)


class RewardPolicy(Policy):
    """A `Policy` whose model is a scalar reward model; `train` hands the loss scores [B] instead of logprobs."""

    def __init__(self, cfg: Any, *, pad_token_id: int, **kwargs: Any) -> None:
        if cfg.fsdp:  # sequence_scores calls the decoder and the score head apart, which FSDP2 does not allow
            raise ValueError(
                "reward-model training does not support policy.fsdp=true yet; use data parallelism"
            )
        self.pad_token_id = pad_token_id
        super().__init__(cfg, **kwargs)

    def load_model(self, model_path: str) -> torch.nn.Module:
        return load_reward_model(model_path, MASTER_DTYPE, pad_token_id=self.pad_token_id)

    def lora_options(self) -> dict[str, Any]:
        """With LoRA the new score head is trained in full beside the adapters."""
        return {"modules_to_save": ["score"], "task_type": "SEQ_CLS"}

    def loss_inputs(self, micro: TokenBatch) -> torch.Tensor:
        return sequence_scores(
            self.model, micro.input_ids, micro.attention_mask, packed=self.cfg.packed_sequences
        )

    def scores(self, batch: TokenBatch) -> torch.Tensor:
        with self.autocast():
            return batched_scores(
                self.model, batch, self.cfg.logprob_batch_size, packed=self.cfg.packed_sequences
            )
