"""FSDP2 sharding (torch.distributed.fsdp.fully_shard). Imported lazily.

Meant for CUDA (NCCL); it also runs on CPU over gloo, which is how the test suite checks it."""

from __future__ import annotations

import torch


def shard_model(model: torch.nn.Module, *, dtype: torch.dtype) -> None:
    """Shard every decoder layer, then the root, with parameters kept in fp32 and compute in `dtype`.

    FSDP2 reduce-scatters gradients as an average over ranks; the caller multiplies its loss by
    the world size so that the summed, globally normalised loss convention still holds.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    layers = getattr(model.base_model, "layers", None)
    if layers is None:
        raise RuntimeError(
            f"cannot find decoder layers (base_model.layers) on {type(model).__name__} to shard"
        )
    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gather the sharded parameters into full CPU tensors (a collective: every rank must call it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Scatter full tensors (on every rank) into the sharded parameters."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))


def optimizer_shard_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """This rank's shard of the optimizer state (saved per rank)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer)


def load_optimizer_shard_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state)
