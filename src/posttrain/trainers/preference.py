"""The run DPO and reward-model training share: pairs in, one optimizer step per batch of pairs.

`PreferenceTrainer` is the `Trainer` the run loop (`trainers/loop.py`) drives for both: an `EpochTrainer`
(epoch.py) over pair datasets, which batches pairs and averages held-out sums per pair. What differs is
an objective beside it (`PreferenceObjective`: DPO in dpo.py, the Bradley–Terry reward model in rm.py),
which owns the policy workers, takes one optimizer step on a `PreferenceBatch` and sums the held-out
metrics of a batch. Checkpoints are ranked for keep_best by `checkpoint.metric` (default `val/loss`,
which both log).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from posttrain.config.loader import ConfigError
from posttrain.config.supervised import PreferenceTrainerConfig
from posttrain.data.preference import (
    PreferenceBatch,
    PreferenceDataset,
    build_preference_dataset,
    collate_pairs,
)
from posttrain.distributed.policy_group import PolicyGroup
from posttrain.logging.progress import stage
from posttrain.trainers.epoch import EpochTrainer
from posttrain.trainers.loop import RunPlan


class PreferenceObjective(Protocol):
    """DPO or RM beside a `PreferenceTrainer`: the policy workers it trains (`policy`), one optimizer
    step on a batch of pairs (its metrics) and the held-out sums of a validation batch (`k`: its
    index) over its pairs."""

    policy: PolicyGroup
    plots: tuple[str, ...]

    def train_step(self, batch: PreferenceBatch) -> dict[str, float]: ...

    def validation_sums(self, k: int, batch: PreferenceBatch) -> dict[str, float]: ...


class PreferenceTrainer(EpochTrainer):
    """One DPO or RM run; `objective(self)` builds the objective once data and step count are known."""

    build_dataset = staticmethod(build_preference_dataset)
    unit = "pairs"

    def __init__(
        self,
        cfg: Any,
        algorithm: str,
        loop: PreferenceTrainerConfig,
        objective: Callable[[PreferenceTrainer], PreferenceObjective],
    ) -> None:
        super().__init__(cfg, algorithm, loop)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.objective = objective(self)
        self.policy = self.objective.policy
        self.plan = RunPlan(self.total_steps, loop.val_every, loop.val_at_start, self.objective.plots)

    def check_batch_layout(self) -> None:
        section, size = self.algorithm, self.loop.global_batch_size
        if size % self.workers:
            raise ConfigError(
                f"{section}.global_batch_size={size} (pairs) must be a multiple of the "
                f"{self.workers} policy workers, so that every worker gets whole pairs"
            )
        if self.cfg.policy.train_micro_batch_size % 2:
            raise ConfigError(
                f"policy.train_micro_batch_size={self.cfg.policy.train_micro_batch_size} counts sequences and "
                f"must be even for {section.upper()} (a chosen and a rejected sequence per pair)"
            )

    def batch_of(self, indices: list[int] | range, data: PreferenceDataset) -> PreferenceBatch:
        return collate_pairs([data.pairs[i] for i in indices], pad_id=self.pad_id)

    def train_step(self, step: int, info: Callable[[str], None]) -> dict[str, float]:
        """The objective's optimizer step on the next `global_batch_size` pairs, timed."""
        start = time.perf_counter()
        batch = self.batch_of(self.sampler.next_batch(), self.train_data)
        with stage("train"):
            metrics = self.objective.train_step(batch)
        elapsed = time.perf_counter() - start
        metrics.update({"timing/step": elapsed, "pairs_per_s": batch.num_pairs / elapsed})
        metrics["epoch"] = self.sampler.epoch
        return metrics

    def validate(self) -> dict[str, float]:
        """The objective's held-out sums over the validation pairs (`global_batch_size` pairs a batch,
        at most `val_batches` batches), as means per pair ("val/..." keys)."""
        if self.val_data is None:
            return {}
        size, n = self.loop.global_batch_size, len(self.val_data)
        totals: dict[str, float] = {}
        pairs = 0
        for k, start in enumerate(list(range(0, n, size))[: self.loop.val_batches]):
            batch = self.batch_of(range(start, min(start + size, n)), self.val_data)
            for name, value in self.objective.validation_sums(k, batch).items():
                totals[name] = totals.get(name, 0.0) + value
            pairs += batch.num_pairs
        return {f"val/{name}": value / max(pairs, 1) for name, value in totals.items()}
