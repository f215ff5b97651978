"""Supervised fine-tuning.

For each step: sample `global_batch_size` sequences, split them over the data-parallel
policy workers, and minimise the token-level negative log-likelihood of assistant tokens,

    L = -(1 / N) * sum_{b,t} m[b,t] * log pi(x[b,t] | x[b,<t]),   N = sum_{b,t} m[b,t],

where m masks everything but assistant tokens and N counts the whole global batch, so the
gradient does not depend on microbatching or on the number of workers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posttrain.algorithms.losses import nll_loss
from posttrain.checkpoint import Checkpointer, Deadline, resolve_resume
from posttrain.config.schema import SFTConfig
from posttrain.data.batching import EpochSampler, TokenBatch, collate
from posttrain.data.sft import SFTDataset, build_sft_dataset
from posttrain.distributed.policy_group import PolicyGroup
from posttrain.errors import WorkerLostError
from posttrain.logging import MetricsLogger
from posttrain.logging.plots import plot_run
from posttrain.logging.progress import phase, stage, staged
from posttrain.modeling.tokenizer import training_tokenizer
from posttrain.trainers.common import (
    GracefulStop,
    epochs_notice,
    graceful_stop,
    latest_values,
    load_controller_state,
    make_checkpointer,
    prepare_run_dir,
    print_interrupted,
    run_summary,
    save_controller_state,
    seed_everything,
    truncate_step_log,
)

PLOTS = ["loss", "val/loss", "grad_norm", "lr", "tokens_per_s", "timing/step"]


def sft_loss(token_logprobs: torch.Tensor, batch: TokenBatch, normalizer: float) -> tuple[torch.Tensor, dict]:
    loss = nll_loss(token_logprobs, batch.loss_mask, normalizer=normalizer)
    return loss, {"loss": loss.item()}


@dataclass
class SFTResult:
    run_dir: Path
    step: int
    history: list[dict[str, float]] = field(default_factory=list)
    last_checkpoint: Path | None = None
    stopped_by_deadline: bool = False


def validation_loss(policy: PolicyGroup, data: SFTDataset, batch_size: int, max_batches: int | None) -> float:
    """Mean NLL over the assistant tokens of the validation set (one global token mean)."""
    total, count = 0.0, 0.0
    starts = list(range(0, len(data), batch_size))[:max_batches]
    with phase("validation", total=len(starts)) as bar:
        for start in starts:
            batch = collate(data.examples[start : start + batch_size])
            lp = policy.logprobs(batch)
            total += -(lp * batch.loss_mask).sum().item()
            count += batch.loss_mask.sum().item()
            bar.advance()
    return total / max(count, 1.0)


def run_sft(cfg: SFTConfig, *, stop_after: int | None = None) -> SFTResult:
    """Train; `stop_after` ends this invocation after that many steps (a later call resumes)."""
    from posttrain.models.hub import resolve_model

    model_path = resolve_model(cfg.policy.model_name)  # a missing model fails before the run dir exists
    run_dir = prepare_run_dir(cfg.logging.run_dir, "sft", cfg)
    seed_everything(cfg.sft.seed)
    tokenizer, _ = training_tokenizer(
        cfg.policy.tokenizer_name or model_path, cfg.policy.chat_template, run_dir, "policy.chat_template"
    )
    train_data = build_sft_dataset(
        cfg.data.train, tokenizer, max_seq_len=cfg.policy.max_seq_len, overlong=cfg.data.overlong
    )
    val_data = (
        build_sft_dataset(
            cfg.data.validation, tokenizer, max_seq_len=cfg.policy.max_seq_len, overlong=cfg.data.overlong
        )
        if cfg.data.validation
        else None
    )
    sampler = EpochSampler(len(train_data), cfg.sft.global_batch_size, seed=cfg.sft.seed)
    total_steps = sampler.batches_per_epoch * cfg.sft.num_epochs
    if cfg.sft.max_steps:
        total_steps = min(total_steps, cfg.sft.max_steps)
    workers = cfg.cluster.policy_workers()
    if cfg.sft.global_batch_size % workers:
        raise ValueError(
            f"sft.global_batch_size={cfg.sft.global_batch_size} must be a multiple of the {workers} policy workers"
        )

    checkpointer = make_checkpointer(run_dir / "checkpoints", cfg.checkpoint)
    resume_from = resolve_resume(cfg.checkpoint.resume, checkpointer)
    policy = PolicyGroup(cfg.policy, cfg.cluster, model_path=model_path, total_steps=total_steps)
    logger, result = None, None
    try:
        step = 0
        if resume_from is not None:
            policy.load_checkpoint(resume_from)
            state = load_controller_state(resume_from)
            step = state["step"]
            sampler.load_state_dict(state["sampler"])
        truncate_step_log(run_dir / "metrics.jsonl", step if resume_from else None)
        logger = MetricsLogger(cfg.logging, run_dir, total_steps=total_steps, start_step=step, config=cfg)
        logger.info(
            f"SFT: {len(train_data)} train sequences ({train_data.num_truncated} truncated, "
            f"{train_data.num_dropped} dropped at max_seq_len={cfg.policy.max_seq_len}), "
            f"{len(val_data) if val_data else 0} validation; {total_steps} steps on {workers} worker(s); "
            f"run dir {run_dir}" + (f"; resumed from {resume_from}" if resume_from else "")
        )
        notice = epochs_notice(
            "sft", cfg.sft.max_steps, cfg.sft.num_epochs, sampler.batches_per_epoch, len(train_data)
        )
        if notice:
            logger.info(notice)
        result = SFTResult(run_dir, step, last_checkpoint=resume_from)
        with graceful_stop() as stop:
            _train_loop(
                cfg,
                policy,
                sampler,
                train_data,
                val_data,
                checkpointer,
                logger,
                result,
                tokenizer,
                total_steps,
                stop_after,
                stop,
            )
            stop.raise_if_requested()  # after the last finished step was saved
        return result
    except KeyboardInterrupt:
        print_interrupted(checkpointer.latest())
        raise
    except WorkerLostError as e:
        raise e.with_checkpoint(checkpointer.latest()) from None
    finally:
        if logger:
            if result is not None:
                logger.info(run_summary(result, total_steps, cfg.checkpoint))
            logger.close()
            if cfg.logging.plots:
                plot_run(run_dir, PLOTS)
        policy.shutdown()


def _train_loop(
    cfg: SFTConfig,
    policy: PolicyGroup,
    sampler: EpochSampler,
    train_data: SFTDataset,
    val_data: SFTDataset | None,
    checkpointer: Checkpointer,
    logger: MetricsLogger,
    result: SFTResult,
    tokenizer: Any,
    total_steps: int,
    stop_after: int | None,
    stop: GracefulStop,
) -> None:
    """Steps until total_steps, `stop_after` steps, the deadline or a stop signal; then a final save
    of the last finished step (unless it is saved already; none before the first step)."""

    @staged("validate")
    def validate(step: int) -> None:
        if val_data is not None:
            loss = validation_loss(policy, val_data, cfg.sft.global_batch_size, cfg.sft.val_batches)
            logger.log(step, {"val/loss": loss})
            result.history.append({"step": step, "val/loss": loss})

    def save(step: int) -> None:
        if not cfg.checkpoint.enabled:
            return

        def write(directory: Path) -> None:
            policy.save_checkpoint(directory)
            tokenizer.save_pretrained(directory / "model")  # a self-contained HF folder
            save_controller_state(directory, step, {"sampler": sampler.state_dict()}, cfg)

        saving = time.perf_counter()
        result.last_checkpoint = checkpointer.save(step, write, metrics=latest_values(result.history, step))
        deadline.record_save(time.perf_counter() - saving)

    deadline = Deadline(cfg.checkpoint.deadline_s)
    step = result.step
    if step == 0 and cfg.sft.val_at_start:
        validate(0)
    steps_this_run = 0
    while step < total_steps and (stop_after is None or steps_this_run < stop_after):
        if stop.requested:
            break
        if deadline.should_stop():
            result.stopped_by_deadline = True
            logger.info(f"checkpoint.deadline_s={cfg.checkpoint.deadline_s} reached at step {step}")
            break
        start = time.perf_counter()
        batch = collate([train_data.examples[i] for i in sampler.next_batch()])
        with stage("train"):
            out = policy.train(batch, sft_loss, normalizer=batch.num_target_tokens)
        step += 1
        steps_this_run += 1
        elapsed = time.perf_counter() - start
        metrics: dict[str, Any] = {
            **out.loss_metrics,
            "grad_norm": out.grad_norm,
            "lr": out.lr,
            "tokens": out.num_tokens,
            "tokens_per_s": out.num_tokens / elapsed,
            "timing/step": elapsed,
            "epoch": sampler.epoch,
        }
        logger.log(step, metrics)
        result.history.append({"step": step, **metrics})
        result.step = step
        if step % cfg.sft.val_every == 0 or step == total_steps:
            validate(step)
        deadline.record_step(time.perf_counter() - start)  # with validation, if any
        if step % cfg.checkpoint.save_every == 0:
            save(step)
    unsaved = result.last_checkpoint is None or not result.last_checkpoint.name.endswith(f"{step:06d}")
    if unsaved and (step > 0 or not stop.requested):
        save(step)
