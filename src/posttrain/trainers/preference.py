"""The run DPO and reward-model training share: pairs in, one optimizer step per batch of pairs.

`PreferenceTrainer` is the `Trainer` the run loop (`trainers/loop.py`) drives for both: the tokenizer,
the pair datasets, the resumable data order, checkpoints and the run's description. What differs is an
objective beside it (`PreferenceObjective`: DPO in dpo.py, the Bradley–Terry reward model in rm.py),
which owns the policy workers, takes one optimizer step on a `PreferenceBatch` and computes the
held-out metrics. Checkpoints are ranked for keep_best by `checkpoint.metric` (default `val/loss`,
which both log).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from posttrain.config.loader import ConfigError
from posttrain.config.supervised import PreferenceTrainerConfig
from posttrain.data.batching import EpochSampler
from posttrain.data.preference import (
    PreferenceBatch,
    PreferenceDataset,
    build_preference_dataset,
    collate_pairs,
)
from posttrain.distributed.policy_group import PolicyGroup
from posttrain.logging.progress import stage
from posttrain.modeling.tokenizer import training_tokenizer
from posttrain.trainers.common import (
    epochs_notice,
    load_controller_state,
    make_checkpointer,
    prepare_run_dir,
    seed_everything,
    write_policy_checkpoint,
)
from posttrain.trainers.loop import RunPlan

ValidationBatches = Iterator[tuple[int, PreferenceBatch]]
"""(index of the batch, batch) over the held-out pairs, `global_batch_size` pairs at a time."""


class PreferenceObjective(Protocol):
    """DPO or RM beside a `PreferenceTrainer`: the policy workers it trains (`policy`), one optimizer
    step on a batch of pairs (its metrics) and the held-out metrics ("val/..." keys)."""

    policy: PolicyGroup
    plots: tuple[str, ...]

    def train_step(self, batch: PreferenceBatch) -> dict[str, float]: ...

    def validate(self, batches: ValidationBatches) -> dict[str, float]: ...


class PreferenceTrainer:
    """One DPO or RM run; `objective(self)` builds the objective once data and step count are known."""

    def __init__(
        self,
        cfg: Any,
        algorithm: str,
        loop: PreferenceTrainerConfig,
        objective: Callable[[PreferenceTrainer], PreferenceObjective],
    ) -> None:
        from posttrain.models.hub import resolve_model

        self.cfg, self.algorithm, self.loop = cfg, algorithm, loop
        self.model_path = resolve_model(cfg.policy.model_name)  # a missing model fails before the run dir
        self.run_dir = prepare_run_dir(cfg.logging.run_dir, algorithm, cfg)
        seed_everything(loop.seed)
        self.tokenizer, self.tokenizer_path = training_tokenizer(
            cfg.policy.tokenizer_name or self.model_path,
            cfg.policy.chat_template,
            self.run_dir,
            "policy.chat_template",
        )
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.train_data = self._dataset(cfg.data.train)
        self.val_data = self._dataset(cfg.data.validation) if cfg.data.validation else None
        self.sampler = EpochSampler(len(self.train_data), loop.global_batch_size, seed=loop.seed)
        self.total_steps = self.sampler.batches_per_epoch * loop.num_epochs
        if loop.max_steps:
            self.total_steps = min(self.total_steps, loop.max_steps)
        self._check_batch_layout()
        self.checkpointer = make_checkpointer(self.run_dir / "checkpoints", cfg.checkpoint)
        self.objective = objective(self)
        self.plan = RunPlan(self.total_steps, loop.val_every, loop.val_at_start, self.objective.plots)

    def _dataset(self, data_cfg: Any) -> PreferenceDataset:
        return build_preference_dataset(
            data_cfg, self.tokenizer, max_seq_len=self.cfg.policy.max_seq_len, overlong=self.cfg.data.overlong
        )

    def _check_batch_layout(self) -> None:
        workers, section = self.cfg.cluster.policy_workers(), self.algorithm
        if self.loop.global_batch_size % workers:
            raise ConfigError(
                f"{section}.global_batch_size={self.loop.global_batch_size} (pairs) must be a multiple of the "
                f"{workers} policy workers, so that every worker gets whole pairs"
            )
        if self.cfg.policy.train_micro_batch_size % 2:
            raise ConfigError(
                f"policy.train_micro_batch_size={self.cfg.policy.train_micro_batch_size} counts sequences and "
                f"must be even for {section.upper()} (a chosen and a rejected sequence per pair)"
            )

    def batch_of(self, indices: list[int], data: PreferenceDataset) -> PreferenceBatch:
        return collate_pairs([data.pairs[i] for i in indices], pad_id=self.pad_id)

    def validation_batches(self) -> ValidationBatches:
        assert self.val_data is not None
        size = self.loop.global_batch_size
        starts = list(range(0, len(self.val_data), size))[: self.loop.val_batches]
        for k, start in enumerate(starts):
            yield k, self.batch_of(list(range(start, min(start + size, len(self.val_data)))), self.val_data)

    # ---------------------------------------------------------------- the run loop's Trainer
    def describe(self) -> list[str]:
        t, v, loop = self.train_data, self.val_data, self.loop
        notice = epochs_notice(
            self.algorithm, loop.max_steps, loop.num_epochs, self.sampler.batches_per_epoch, len(t)
        )
        return [
            f"{self.algorithm.upper()}: {len(t)} train pairs ({t.num_truncated} truncated, {t.num_dropped} dropped "
            f"at max_seq_len={self.cfg.policy.max_seq_len}), {len(v) if v else 0} validation; "
            f"{self.total_steps} steps of {loop.global_batch_size} pairs on "
            f"{self.cfg.cluster.policy_workers()} worker(s); run dir {self.run_dir}",
            *([notice] if notice else []),
        ]

    def restore(self, checkpoint: Path | None) -> int:
        if checkpoint is None:
            return 0
        self.objective.policy.load_checkpoint(checkpoint)
        state = load_controller_state(checkpoint)
        self.sampler.load_state_dict(state["sampler"])
        return state["step"]

    def running(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

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
        return {} if self.val_data is None else self.objective.validate(self.validation_batches())

    def save(self, step: int, metrics: dict[str, float]) -> Path:
        """Checkpoint the policy, tokenizer and controller; `metrics` (latest values) rank it for keep_best."""
        state = {"sampler": self.sampler.state_dict()}
        write = functools.partial(
            write_policy_checkpoint,
            step=step,
            policy=self.objective.policy,
            tokenizer=self.tokenizer,
            state=state,
            config=self.cfg,
        )
        return self.checkpointer.save(step, write, metrics=metrics)

    def shutdown(self) -> None:
        self.objective.policy.shutdown()
