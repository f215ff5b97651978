"""LoRA adapters on the trained model, built on `peft` (the optional extra `posttrain[lora]`).

`apply_lora` injects peft's LoRA layers into the Hugging Face model in place (`inject_adapter_in_model`):
the model keeps its class and its module tree (`model.base_model.layers` still holds the decoder
layers, so packing, FSDP2 sharding and compilation see what they see without LoRA). An adapted
Linear `q_proj` becomes a peft `Linear` whose frozen weight is `q_proj.base_layer.weight` and whose
trained low-rank factors are `q_proj.lora_A.default.weight` [r, in] and `q_proj.lora_B.default.weight`
[out, r]; its output is `W x + s · B A x` with `s = alpha / r` (`alpha / sqrt(r)` with rsLoRA).
B starts at zero, so the adapted model computes exactly what the base model computes until the
first update.

- The reference model (KL terms, DPO) is the same module with the adapters switched off
  (`adapters_disabled`, what peft's `PeftModel.disable_adapter()` does): no second copy of the weights.
- Generators run the base model's architecture: `merged_weights` yields, under the base model's
  names, `W + s · B A` for every adapted Linear (new tensors; the trained ones are not touched) and
  every other parameter as it is.
- Checkpoints hold the adapter only, as a peft adapter folder (`save_adapter`; file names as
  `PeftModel.save_pretrained` writes them), which `peft.PeftModel.from_pretrained` loads.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from posttrain.config.common import LoraConfig
from posttrain.errors import UserError
from posttrain.modeling.peft import peft_lora_config

ADAPTER = "default"
"""The adapter's name inside peft's layers (one adapter per model)."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
FILE_PREFIX = "base_model.model."
"""What `PeftModel.save_pretrained` puts before the model's own module names in an adapter file."""


def require_peft() -> None:
    try:
        import peft  # noqa: F401
    except ImportError as e:
        raise UserError(
            f"policy.lora needs the `peft` package ({e}); install it with `pip install 'posttrain[lora]'`"
        ) from e


def apply_lora(
    model: torch.nn.Module,
    cfg: LoraConfig,
    *,
    base_model: str | None = None,
    modules_to_save: list[str] | None = None,
    task_type: str = "CAUSAL_LM",
) -> torch.nn.Module:
    """Inject LoRA layers into `model` in place (peft), freeze everything else; returns `model`.

    `modules_to_save`: modules trained in full beside the adapters (a reward model's new `score`
    head); peft keeps a trained copy and the frozen original. Only Linear layers can be adapted."""
    require_peft()
    from peft import inject_adapter_in_model

    config = peft_lora_config(
        cfg, base_model=base_model, modules_to_save=modules_to_save, task_type=task_type
    )
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    layers = adapted_layers(model)
    if not layers:
        raise ValueError(
            f"policy.lora.target_modules={cfg.target_modules!r} matches no Linear layer of "
            f"{type(model).__name__}; name some of its Linear modules (e.g. q_proj, v_proj) or use all-linear"
        )
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.tuners_utils import BaseTunerLayer

    other = sorted(
        name
        for name, m in model.named_modules()
        if isinstance(m, BaseTunerLayer) and not isinstance(m, LoraLinear) and hasattr(m, "lora_A")
    )
    if other:
        raise ValueError(
            f"policy.lora adapts only Linear layers; these are not: {other[:3]}. Remove them from target_modules"
        )
    check_no_tied_targets(model)
    return model


def tied_adapted_layers(model: torch.nn.Module) -> dict[str, list[str]]:
    """Adapted layer name -> the other parameter names that share its frozen weight (tied weights:
    an `lm_head` tied to `embed_tokens` with `tie_word_embeddings=True`); only layers that share one."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    tied = {}
    for layer_name, layer in adapted_layers(model).items():
        own = f"{layer_name}.base_layer.weight"
        others = [n for n in names.get(id(layer.base_layer.weight), []) if n != own]
        if others:
            tied[layer_name] = others
    return tied


def check_no_tied_targets(model: torch.nn.Module) -> None:
    """Raise ValueError when an adapted layer's weight is tied to another parameter.

    A tied weight is one matrix for both modules (the output projection and the input embedding):
    the merged refit could fold W + s·B A into it only by changing the input embedding too, and
    `named_parameters()` lists it once, under the other module's name, so the adapter would be
    dropped from the generator's weights without a word."""
    tied = tied_adapted_layers(model)
    if not tied:
        return
    layer, others = next(iter(tied.items()))
    raise ValueError(
        f"policy.lora.target_modules adapts {layer}, whose weight is tied to {others[0]} (the model "
        "ties them: tie_word_embeddings=true). The generator runs one shared matrix for both, so the "
        "adapter cannot be merged into its weights without also changing the input embedding. Remove "
        f"{layer.rsplit('.', 1)[-1]} from policy.lora.target_modules (all-linear leaves the output "
        "layer out), or train a model whose embeddings are not tied"
    )


def has_lora(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "peft_config", None))


def adapted_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module name -> peft LoRA Linear, for every adapted layer."""
    from peft.tuners.lora import Linear as LoraLinear

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLinear)}


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """The base model: every LoRA layer computes only its frozen weight inside the block (peft's
    `enable_adapters(False)`, which `PeftModel.disable_adapter()` calls on each layer); re-enabled
    after, trainability included."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


# ------------------------------------------------------------------ merged weights (refit)
def base_name(name: str) -> str | None:
    """The base model's name of a parameter of the adapted model (`...q_proj.base_layer.weight` ->
    `...q_proj.weight`, a module to save's trained copy -> the module's own name); None for the LoRA
    factors and a module to save's frozen original."""
    parts = name.split(".")
    if any(p in ("lora_A", "lora_B", "original_module") for p in parts):
        return None
    return name.replace(".base_layer.", ".").replace(f".modules_to_save.{ADAPTER}.", ".")


def merged_weights(
    model: torch.nn.Module, full: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
) -> Iterator[tuple[str, torch.Tensor]]:
    """(base model name, tensor) for every parameter of the base model, adapters folded in.

    An adapted Linear gives `W + s · (B @ A)` (transposed for fan_in_fan_out layers), computed in the
    weight's dtype into a new tensor; any other parameter is yielded as it is. `full` turns a
    parameter into its full tensor (FSDP2: `DTensor.full_tensor`, a collective, called in the same
    order on every rank). Tied parameters appear once, like in `named_parameters`.

    Every adapted layer is folded in or the iteration raises RuntimeError at its end (an adapter
    whose weight `named_parameters` lists under another name, a tied one, would otherwise be
    dropped; `apply_lora` refuses those). The policy's refit checksum is computed over these
    tensors, so it fails the same way instead of agreeing with a generator that lacks the adapter."""
    layers = adapted_layers(model)
    folded: set[str] = set()
    with torch.no_grad():
        for name, param in model.named_parameters():
            target = base_name(name)
            if target is None:
                continue
            module = name.rsplit(".", 2)[0] if name.endswith(".base_layer.weight") else None
            layer = layers.get(module) if module is not None else None
            if layer is None:
                yield target, full(param)
                continue
            weight = full(param)
            a = full(layer.lora_A[ADAPTER].weight).to(weight.dtype)
            b = full(layer.lora_B[ADAPTER].weight).to(weight.dtype)
            delta = (b @ a) * layer.scaling[ADAPTER]
            folded.add(module)
            yield target, weight + (delta.T if layer.fan_in_fan_out else delta)
    if missing := sorted(set(layers) - folded):
        raise RuntimeError(
            f"the merged weights lack the LoRA adapters of {missing[:3]}: their frozen weights are not "
            "listed under their own names (tied weights?), so the generator would run them untrained"
        )


def merged_specs(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(base name, full shape, dtype) of what `merged_weights` yields, in its order (no computation)."""
    return [
        (target, tuple(p.shape), p.dtype)
        for name, p in model.named_parameters()
        if (target := base_name(name)) is not None
    ]


# ------------------------------------------------------------------ adapter refits (vLLM's LoRA support)
def adapter_weights(
    model: torch.nn.Module, full: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
) -> Iterator[tuple[str, torch.Tensor]]:
    """(peft file name, tensor) of every LoRA factor A and B: what a generator that serves the adapter
    (`generation.vllm.lora_adapter`) needs at a refit. `full` as in `merged_weights`."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                yield file_name(name), full(param)


def adapter_specs(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(file name, full shape, dtype) of what `adapter_weights` yields, in its order."""
    return [
        (file_name(name), tuple(p.shape), p.dtype)
        for name, p in model.named_parameters()
        if ".lora_A." in name or ".lora_B." in name
    ]


def adapter_fingerprint(
    model: torch.nn.Module,
    dtype: torch.dtype | None = None,
    full: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> tuple[float, float]:
    """(Σ, Σ of squares) in float64 over every A and every s·B (B scaled by alpha / r), each first cast
    to `dtype` and scaled in it: what vLLM holds for a served adapter (it folds the scale into B in the
    adapter's dtype), so the two agree exactly (`posttrain.generation.vllm_lora.served_fingerprint`)."""
    total, squares = 0.0, 0.0
    with torch.no_grad():
        for layer in adapted_layers(model).values():
            a = full(layer.lora_A[ADAPTER].weight)
            b = full(layer.lora_B[ADAPTER].weight)
            a, b = (a, b) if dtype is None else (a.to(dtype), b.to(dtype))
            for t in (a, b * layer.scaling[ADAPTER]):
                t = t.double()
                total += float(t.sum())
                squares += float((t * t).sum())
    return total, squares


# ------------------------------------------------------------------ adapter folders (checkpoints, export)
def file_name(name: str) -> str:
    """The name `PeftModel.save_pretrained` gives a trained parameter of the adapted model:
    `model.layers.0.self_attn.q_proj.lora_A.default.weight` -> `base_model.model.model.layers.0.
    self_attn.q_proj.lora_A.weight`; a module to save's trained copy takes the module's name."""
    name = name.replace(f".lora_A.{ADAPTER}.", ".lora_A.").replace(f".lora_B.{ADAPTER}.", ".lora_B.")
    return FILE_PREFIX + name.replace(f".modules_to_save.{ADAPTER}.", ".")


def trainable_names(model: torch.nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if p.requires_grad]


def adapter_state(
    model: torch.nn.Module, full: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
) -> dict[str, torch.Tensor]:
    """The trained tensors (adapters and modules to save) as CPU copies, by their names in the model
    (FSDP2: `full` gathers each, a collective)."""
    return {name: full(p).detach().cpu().clone() for name, p in model.named_parameters() if p.requires_grad}


def save_adapter(model: torch.nn.Module, state: dict[str, torch.Tensor], directory: str | Path) -> None:
    """Write `state` (from `adapter_state`) and the model's LoRA config as a peft adapter folder."""
    from safetensors.torch import save_file

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    save_file({file_name(n): t.contiguous() for n, t in state.items()}, str(path / ADAPTER_WEIGHTS))
    model.peft_config[ADAPTER].save_pretrained(str(path))


def load_adapter(model: torch.nn.Module, directory: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of an adapter folder, by their names in `model` (whose trained parameters must be
    exactly the folder's)."""
    from safetensors.torch import load_file

    from posttrain.modeling.loading import CheckpointMismatchError

    path = Path(directory)
    if not (path / ADAPTER_WEIGHTS).is_file():
        raise CheckpointMismatchError(f"no LoRA adapter ({ADAPTER_WEIGHTS}) in {path}")
    saved = load_file(str(path / ADAPTER_WEIGHTS))
    own = {file_name(n): n for n in trainable_names(model)}
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    if missing or unexpected:
        raise CheckpointMismatchError(
            f"the LoRA adapter at {path} does not match the configured policy.lora ({len(missing)} missing, "
            f"{len(unexpected)} unexpected tensors; e.g. {(missing + unexpected)[:2]}). Resume with the LoRA "
            "settings it was saved with, or start fresh with checkpoint.resume=none"
        )
    return {own[f]: t for f, t in saved.items()}


def read_adapter_config(directory: str | Path) -> dict[str, Any]:
    return json.loads((Path(directory) / ADAPTER_CONFIG).read_text())
