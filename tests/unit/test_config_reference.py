"""docs/configuration.md is generated from the typed config and cannot drift from it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", ROOT / "docs/gen_config_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_page_equals_the_generator_output() -> None:
    page = (ROOT / "docs/configuration.md").read_text()
    assert page == _generator().render(), "run: python docs/gen_config_reference.py"


def test_rows_carry_key_type_default_and_description() -> None:
    text = _generator().render()
    grpo = text.split("## posttrain grpo")[1].split("\n## ")[0]
    assert "| `cluster.gpus_per_node` | int | `0` | 0 trains on CPU. |" in grpo
    assert '| `cluster.backend` | "ray" or "local" | `"ray"` |' in grpo
    # GRPO's own default for a shared section (PolicyConfig's is 512, SFT's 256)
    assert "| `policy.max_seq_len` | int | `128` |" in grpo
    assert "| `policy.tokenizer_name` | str or null | `null` | Defaults to model_name. |" in grpo
    # every field of a nested section appears, dotted
    from posttrain.config.schema import GRPOConfig, VLLMConfig

    for name in VLLMConfig.model_fields:
        assert f"| `generation.vllm.{name}` |" in grpo
    assert grpo.count("\n| `") + grpo.count("\n| **`") == _count_keys(GRPOConfig())


def _count_keys(model) -> int:
    """Every field, nested sections included (a section is a row too)."""
    from pydantic import BaseModel

    n = 0
    for name in type(model).model_fields:
        value = getattr(model, name)
        n += 1 + (_count_keys(value) if isinstance(value, BaseModel) else 0)
    return n
