"""FSDP2 sharding (torch.distributed.fsdp.fully_shard). torch.distributed.fsdp is imported lazily.

Meant for CUDA (NCCL); it also runs on CPU over gloo, which is how the test suite checks it.

Under FSDP2 every forward (and backward) of the sharded model is a collective: each layer
all-gathers its parameters from every rank. Every rank must therefore run the same number of
forwards, including ranks that have no work (no prompts, an empty chunk): `collective_group` says
whether a model is such a module, `all_ranks_max` lets the ranks agree on a count.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def collective_group(model: torch.nn.Module) -> dist.ProcessGroup | None:
    """The process group whose ranks must all join every forward of `model`: FSDP2-sharded over more
    than one rank. None for any other model (plain, or sharded over one rank)."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        return None
    for p in model.parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None:
            group = mesh.get_group()
            return group if dist.get_world_size(group) > 1 else None
    return None


def all_ranks_max(value: int, group: dist.ProcessGroup, device: torch.device) -> int:
    """The largest `value` over the ranks of `group` (a collective; NCCL needs a CUDA `device`)."""
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def shard_model(model: torch.nn.Module, *, dtype: torch.dtype) -> None:
    """Shard every decoder layer, then the root, with parameters kept in fp32 and compute in `dtype`.

    The model must come in fp32 (`Policy` loads it so): FSDP2 keeps the parameters, the gradients it
    reduce-scatters and hence the optimizer state in the dtype it is given, and casts the gathered
    parameters to `dtype` (`MixedPrecisionPolicy.param_dtype`) for every forward and backward;
    gradients are reduced in fp32.

    FSDP2 reduce-scatters gradients as an average over ranks; the caller multiplies its loss by
    the world size so that the summed, globally normalised loss convention still holds.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    wrong = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
    if wrong:
        raise ValueError(f"shard_model needs fp32 (master) parameters, got {', '.join(wrong)}")

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
