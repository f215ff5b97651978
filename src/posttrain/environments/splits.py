"""Held-out splits by question text: the same question is in the same split whatever the seed that drew
it, so a held-out set never shares a question with training (reasoning-gym, text2sql)."""

from __future__ import annotations

import hashlib

SPLITS = ("train", "heldout")
HELDOUT_EVERY = 5
"""One question in HELDOUT_EVERY is held out: the first byte of its SHA-256 is 0 mod HELDOUT_EVERY."""


def question_split(question: str) -> str:
    """ "heldout" or "train": the split a question belongs to, by the SHA-256 of its text (whitespace
    collapsed, case ignored)."""
    key = " ".join(question.split()).lower().encode()
    return "heldout" if hashlib.sha256(key).digest()[0] % HELDOUT_EVERY == 0 else "train"


def check_split(split: str | None) -> None:
    """A clear error for a split that is neither null nor one of SPLITS."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or null, got {split!r}")
