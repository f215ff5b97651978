"""Without peft installed, a LoRA run stops at once with the install command (not deep in a trainer)."""

from __future__ import annotations

import sys

import pytest

from posttrain.errors import UserError
from posttrain.models.lora import require_peft


def test_lora_without_peft_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError
    with pytest.raises(UserError, match=r"pip install 'posttrain\[lora\]'"):
        require_peft()
