"""Preference-pair files and config overrides shared by the DPO / RM / reward-model-environment tests."""

from __future__ import annotations

import json
import random
from pathlib import Path


def write_preference_jsonl(path: Path, n: int = 32, seed: int = 0) -> Path:
    """n prompt/chosen/rejected rows of varied length: right vs wrong sums (wrong by 1..9)."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            wrong = a + b + rng.randint(1, 9)
            words = " ".join(["please"] * rng.randint(0, 12))
            row = {
                "prompt": f"{words} What is {a} + {b}?",
                "chosen": f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}.",
                "rejected": f"{a} + {b} = {wrong}. The answer is \\boxed{{{wrong}}}.",
            }
            f.write(json.dumps(row) + "\n")
    return path


def preference_overrides(model_dir: Path, data: Path, run_dir: Path, section: str, **extra) -> list[str]:
    base = {
        "policy.model_name": str(model_dir),
        "policy.max_seq_len": 128,
        "policy.optimizer.lr": 1e-3,
        "policy.train_micro_batch_size": 4,
        "data.train.path": str(data),
        "data.validation.path": str(data),
        "data.validation.max_samples": 8,
        f"{section}.global_batch_size": 4,
        f"{section}.max_steps": 6,
        f"{section}.num_epochs": 8,
        f"{section}.val_every": 3,
        "cluster.backend": "local",
        "logging.run_dir": str(run_dir),
        "logging.tensorboard": False,
        "logging.plots": False,  # ~3 s of matplotlib per run: the tests of the plots turn them on
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]
