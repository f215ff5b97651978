"""Score rollouts with a trained reward model (a `posttrain rm` checkpoint or any HF sequence classifier).

    environment:
      name: reward_model
      kwargs: {model_path: runs/rm/checkpoints/step_000060}   # or its model/ folder, or an HF folder

Each conversation (system, user and the generated assistant turn) is rendered with the reward
model's own chat template, exactly as in reward-model training, and the scalar score at its last
token is the reward (times `scale`, plus `shift`). Conversations longer than `max_seq_len` keep
their LAST tokens (the score is read at the end). Under `EnvironmentGroup` the model lives in Ray
actors (`environment.num_workers`), or in this process with `cluster.backend=local`.

When the sample's metadata has an `answer` (math tasks), `info["correct"]` records whether the last
`\\boxed{}` equals it as a string, so GRPO's validation accuracy stays a ground-truth measure that
the reward model cannot game; the reward itself is the model's score only.
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.data.batching import collate
from posttrain.data.boxed import extract_last_boxed
from posttrain.data.tokenize import TokenizedExample, tokenize_conversation
from posttrain.environments.interface import (
    EnvStepResult,
    Message,
    last_assistant_content,
    register_environment,
)


@register_environment("reward_model")
class RewardModelEnvironment:
    """Rewards from a scalar reward model (`AutoModelForSequenceClassification`, num_labels=1)."""

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer_path: str | None = None,
        batch_size: int = 16,
        max_seq_len: int = 1024,
        dtype: str = "float32",
        scale: float = 1.0,
        shift: float = 0.0,
        num_threads: int | None = None,
    ) -> None:
        from posttrain.modeling.loading import DTYPES, set_torch_threads
        from posttrain.modeling.tokenizer import load_tokenizer
        from posttrain.models.reward_model import load_reward_model, resolve_model_folder

        set_torch_threads(num_threads)
        folder = resolve_model_folder(model_path)
        self.tokenizer = load_tokenizer(str(tokenizer_path or folder))
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else 0
        self.model = load_reward_model(folder, DTYPES[dtype], pad_token_id=pad).eval().requires_grad_(False)
        self.batch_size, self.max_seq_len, self.scale, self.shift = batch_size, max_seq_len, scale, shift

    def scores(self, message_logs: list[list[Message]]) -> list[float]:
        """The reward model's raw score of each conversation."""
        from posttrain.models.reward_model import batched_scores

        examples = []
        for log in message_logs:
            ids = tokenize_conversation(self.tokenizer, log).input_ids[-self.max_seq_len :]
            examples.append(TokenizedExample(ids, [0] * len(ids)))
        batch = collate(examples, pad_id=self.pad_id)
        return batched_scores(self.model, batch, self.batch_size).tolist()

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        scores = self.scores(message_logs)
        info = []
        for log, meta, score in zip(message_logs, metadata, scores, strict=True):
            entry: dict[str, Any] = {"rm_score": score}
            if meta.get("answer") is not None:
                boxed = extract_last_boxed(last_assistant_content(log))
                entry["correct"] = boxed is not None and boxed.strip() == str(meta["answer"]).strip()
            info.append(entry)
        return EnvStepResult.final([self.scale * s + self.shift for s in scores], metadata, info)

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        n = max(len(results), 1)
        scores = torch.tensor([i["rm_score"] for i in results.info]) if len(results) else torch.zeros(1)
        metrics = {
            "env/reward_mean": sum(results.rewards) / n,
            "env/rm_score_mean": float(scores.mean()),
            "env/rm_score_std": float(scores.std()) if len(scores) > 1 else 0.0,
        }
        checked = [i["correct"] for i in results.info if "correct" in i]
        if checked:
            metrics["env/accuracy"] = sum(checked) / len(checked)
        return metrics
