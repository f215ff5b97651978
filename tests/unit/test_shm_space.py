"""Shared-memory refit refuses a /dev/shm too small for the weights, naming the fix (a write past a
full tmpfs through a mapping would kill the process with SIGBUS)."""

from __future__ import annotations

import shutil

import pytest
import torch

from posttrain.errors import UserError
from posttrain.weights.refit import SharedFlatWeights, require_shm_space


def test_too_small_names_the_size_and_the_fix(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    need = free + (3 << 30)
    with pytest.raises(UserError) as error:
        require_shm_space(str(tmp_path), need)
    message = str(error.value)
    assert message.startswith(
        f"{tmp_path} has {free / (1 << 30):.2f} GiB free, but generation.refit_transport="
    )
    assert f"--shm-size={-(-need // (1 << 30)) + 1}g" in message
    assert message.endswith("or set generation.refit_transport=object_store")
    require_shm_space(str(tmp_path), 1)  # enough: no error


def test_shared_weights_fit_in_a_roomy_directory(tmp_path):
    model = torch.nn.Linear(4, 3)
    weights = SharedFlatWeights(model, directory=str(tmp_path))
    assert sorted(p.name.split("-")[-1] for p in tmp_path.iterdir()) == ["float32"]
    weights.close()
