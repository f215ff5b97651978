"""AdamW and its learning-rate schedule."""

from __future__ import annotations

import math

import torch

from posttrain.config.common import OptimizerConfig, SchedulerConfig


def lr_multiplier(step: int, *, name: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Factor on the peak lr for the update made at `step` (0-based).

    Warmup: (step + 1) / warmup_steps for step < warmup_steps. Afterwards `constant` is 1 and
    `cosine` is r + (1 - r) * (1 + cos(pi * p)) / 2 with p = (step - warmup) / (total - warmup)
    clamped to [0, 1] and r = min_lr_ratio.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if name == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(
    params: list[torch.nn.Parameter], cfg: OptimizerConfig, sched: SchedulerConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    # One fused kernel per parameter: no temporaries the size of the model (foreach makes several).
    # Plain tensors on CPU or CUDA only; sharded (DTensor) parameters keep the foreach kernels.
    fused = bool(params) and all(
        type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") for p in params
    )
    optimizer = torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=fused or None,
        foreach=None if fused else True,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_multiplier(
            step,
            name=sched.name,
            warmup_steps=sched.warmup_steps,
            total_steps=total_steps,
            min_lr_ratio=sched.min_lr_ratio,
        ),
    )
    return optimizer, scheduler
