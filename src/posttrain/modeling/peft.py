"""The peft configuration of a `policy.lora` section, shared by the training side (`posttrain.models.lora`
applies it) and the sampling side (`posttrain.generation.vllm_lora` serves adapters with it)."""

from __future__ import annotations

from typing import Any

from posttrain.config.common import LoraConfig


def peft_lora_config(
    cfg: LoraConfig,
    *,
    base_model: str | None = None,
    modules_to_save: list[str] | None = None,
    task_type: str = "CAUSAL_LM",
) -> Any:
    """The `peft.LoraConfig` of a `policy.lora` section (peft is imported only here, when called)."""
    from peft import LoraConfig as PeftLoraConfig

    target = cfg.target_modules if cfg.target_modules == "all-linear" else list(cfg.target_modules)
    return PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=target,
        use_rslora=cfg.rslora,
        init_lora_weights=True if cfg.init == "default" else "gaussian",
        modules_to_save=modules_to_save,
        base_model_name_or_path=base_model,
        task_type=task_type,
    )
