"""Tokenizer loading with a pad token guaranteed."""

from __future__ import annotations

from typing import Any


def load_tokenizer(name_or_path: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
