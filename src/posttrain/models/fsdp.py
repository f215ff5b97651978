"""FSDP2 sharding (torch.distributed.fsdp.fully_shard) for CUDA training. Imported lazily."""

from __future__ import annotations

import torch


def shard_model(model: torch.nn.Module, *, dtype: torch.dtype) -> None:
    """Shard every decoder layer, then the root, with parameters kept in fp32 and compute in `dtype`.

    FSDP2 reduce-scatters gradients as an average over ranks; the caller multiplies its loss by
    the world size so that the summed, globally normalised loss convention still holds.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not torch.cuda.is_available():
        raise RuntimeError("policy.fsdp=true needs CUDA; on CPU use data parallelism (policy.fsdp=false)")
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    layers = getattr(model.base_model, "layers", None)
    if layers is None:
        raise RuntimeError(
            f"cannot find decoder layers (base_model.layers) on {type(model).__name__} to shard"
        )
    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
