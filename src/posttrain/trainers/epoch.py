"""The base of the trainers that read a fixed dataset epoch by epoch: SFT (sft.py), DPO and RM
(preference.py). `EpochTrainer` holds what they share as the run loop's `Trainer`: the run directory,
tokenizer, datasets and the resumable data order (`EpochSampler`, saved in every checkpoint), the
checkpointer, the run's description, restore, save and shutdown. A subclass builds its policy workers
(`policy`) and `plan`, checks the batch layout and takes the steps (`train_step`, `validate`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from posttrain.config.supervised import EpochLoopConfig
from posttrain.data.batching import EpochSampler
from posttrain.distributed.policy_group import PolicyGroup
from posttrain.modeling.tokenizer import training_tokenizer
from posttrain.trainers.common import (
    epochs_notice,
    load_controller_state,
    make_checkpointer,
    prepare_run_dir,
    save_controller_state,
    seed_everything,
)
from posttrain.trainers.loop import RunPlan


class EpochTrainer:
    """One run over `cfg.data` by epochs with the `loop` section (`algorithm`: sft, dpo, rm)."""

    build_dataset: ClassVar[Callable[..., Any]]
    """Builds a split: (data config, tokenizer, max_seq_len=, overlong=) -> a dataset."""
    unit: ClassVar[str]
    """What the datasets hold, in the run's first line: "sequences" or "pairs"."""
    policy: PolicyGroup
    plan: RunPlan

    def __init__(self, cfg: Any, algorithm: str, loop: EpochLoopConfig) -> None:
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
        self.train_data = self._dataset(cfg.data.train)
        self.val_data = self._dataset(cfg.data.validation) if cfg.data.validation else None
        self.sampler = EpochSampler(len(self.train_data), loop.global_batch_size, seed=loop.seed)
        self.total_steps = self.sampler.batches_per_epoch * loop.num_epochs
        if loop.max_steps:
            self.total_steps = min(self.total_steps, loop.max_steps)
        self.workers = cfg.cluster.policy_workers()
        self.check_batch_layout()
        self.checkpointer = make_checkpointer(self.run_dir / "checkpoints", cfg.checkpoint)

    def _dataset(self, data_cfg: Any) -> Any:
        cfg = self.cfg
        return self.build_dataset(
            data_cfg, self.tokenizer, max_seq_len=cfg.policy.max_seq_len, overlong=cfg.data.overlong
        )

    def check_batch_layout(self) -> None:
        """Raise when `loop.global_batch_size` cannot be split over the policy workers."""

    # ---------------------------------------------------------------- the run loop's Trainer
    def describe(self) -> list[str]:
        t, v, loop = self.train_data, self.val_data, self.loop
        notice = epochs_notice(
            self.algorithm, loop.max_steps, loop.num_epochs, self.sampler.batches_per_epoch, len(t)
        )
        per_step = f" of {loop.global_batch_size} pairs" if self.unit == "pairs" else ""
        return [
            f"{self.algorithm.upper()}: {len(t)} train {self.unit} ({t.num_truncated} truncated, {t.num_dropped} "
            f"dropped at max_seq_len={self.cfg.policy.max_seq_len}), {len(v) if v else 0} validation; "
            f"{self.total_steps} steps{per_step} on {self.workers} worker(s); run dir {self.run_dir}",
            *([notice] if notice else []),
        ]

    def restore(self, checkpoint: Path | None) -> int:
        if checkpoint is None:
            return 0
        self.policy.load_checkpoint(checkpoint)
        state = load_controller_state(checkpoint)
        self.sampler.load_state_dict(state["sampler"])
        return state["step"]

    def running(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def save(self, step: int, metrics: dict[str, float]) -> Path:
        """Checkpoint the policy (weights and optimizer), the tokenizer beside the weights in model/ (so
        that folder loads on its own) and the controller's step, data order, RNG and config; `metrics`
        (latest values) rank it for keep_best."""
        state = {"sampler": self.sampler.state_dict()}

        def write(directory: Path) -> None:
            self.policy.save_checkpoint(directory)
            self.tokenizer.save_pretrained(directory / "model")
            save_controller_state(directory, step, state, self.cfg)

        return self.checkpointer.save(step, write, metrics=metrics)

    def shutdown(self) -> None:
        self.policy.shutdown()
