"""A posttrain checkpoint becomes a standalone Hugging Face folder: `posttrain export CKPT OUT`.

A checkpoint's `model/` folder already holds the full, consolidated weights (rank 0 writes them;
with FSDP2 every rank first joins a full-state gather, see `Policy.save_checkpoint`), possibly in
several `*.safetensors` shards with an index. Export loads them with `from_pretrained`, writes
safetensors (sharded by transformers' size limit, with an index), the tokenizer with its chat
template, and a generation config whose EOS ids include the tokenizer's, so that
`AutoModelForCausalLM.from_pretrained(OUT)` and `vllm serve OUT` work. The folder is written
beside OUT and renamed into place, so an interrupted export leaves nothing half-written.

A LoRA run's checkpoint holds a peft adapter folder in `model/` (format.json: `lora_adapter` and the
base model's path). Export then loads the base model, applies the adapter with
`peft.PeftModel.from_pretrained` and writes the merged model (`merge_and_unload`), a plain HF folder;
with `adapter=True` (`posttrain export --adapter`) it writes the adapter folder itself, which
`PeftModel.from_pretrained(base, OUT)` loads.
"""

from __future__ import annotations

import json
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from posttrain.checkpoint.checkpointer import COMPLETE, Checkpointer, atomic_directory
from posttrain.errors import ExistingFileError, MissingFileError, UserError

FORMAT_FILE = "format.json"
FULL_STATE = "hf_full_state"
LORA_ADAPTER = "lora_adapter"


@dataclass(frozen=True)
class ModelSource:
    """What `from_pretrained` needs: the weights folder (or hub id), the tokenizer's, and the checkpoint."""

    model: str
    tokenizer: str
    checkpoint: Path | None = None


def find_checkpoint(path: str | Path) -> Path | None:
    """A complete checkpoint folder -> itself; a run directory (or its checkpoints/) -> its latest."""
    p = Path(path).expanduser()
    if (p / COMPLETE).is_file() and (p / "model").is_dir():
        return p
    for root in (p / "checkpoints", p):
        if root.is_dir():
            latest = Checkpointer(root).latest()
            if latest is not None:
                return latest
    return None


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file()


def _tokenizer_from_run_config(checkpoint: Path) -> str:
    """Checkpoints written before tokenizers were saved with them: the run config names the tokenizer."""
    from posttrain.models.hub import resolve_model

    config = (
        yaml.safe_load((checkpoint / "config.yaml").read_text())
        if (checkpoint / "config.yaml").is_file()
        else {}
    )
    policy = (config or {}).get("policy", {})
    name = policy.get("tokenizer_name") or policy.get("model_name")
    if not name:
        raise MissingFileError(
            f"{checkpoint} holds no tokenizer and no config.yaml naming one; pass a tokenizer explicitly"
        )
    return resolve_model(name)


def resolve_model_source(name: str, tokenizer_name: str | None = None) -> ModelSource:
    """An alias, HF folder, hub id, or posttrain checkpoint / run directory -> a `ModelSource`."""
    from posttrain.models.hub import resolve_model

    checkpoint = find_checkpoint(name) if Path(name).expanduser().is_dir() else None
    tokenizer = resolve_model(tokenizer_name) if tokenizer_name else None
    if checkpoint is None:
        model = resolve_model(name)
        return ModelSource(model, tokenizer or model)
    model_dir = checkpoint / "model"
    check_full_state(checkpoint)
    if tokenizer is None:
        tokenizer = str(model_dir) if _has_tokenizer(model_dir) else _tokenizer_from_run_config(checkpoint)
    return ModelSource(str(model_dir), tokenizer, checkpoint)


def check_full_state(checkpoint: Path) -> None:
    """Refuse checkpoints whose `model/` is not the full weights (checkpoints without format.json are)."""
    fmt = _format(checkpoint)
    if fmt.get("model", FULL_STATE) == LORA_ADAPTER:
        raise UserError(
            f"{checkpoint} holds a LoRA adapter, not a whole model: merge it first with "
            f"`posttrain export {checkpoint} OUT` and use OUT"
        )
    if fmt.get("model", FULL_STATE) != FULL_STATE:
        raise ValueError(f"{checkpoint}: model format {fmt.get('model')!r} is not {FULL_STATE!r}")


def _format(checkpoint: Path) -> dict[str, Any]:
    """format.json of a checkpoint ({} for checkpoints written before it existed)."""
    fmt_file = checkpoint / FORMAT_FILE
    return json.loads(fmt_file.read_text()) if fmt_file.is_file() else {}


def checkpoint_compute_dtype(checkpoint: Path) -> str | None:
    """The dtype the run that wrote `checkpoint` computed in (`policy.dtype`), if format.json records it."""
    return _format(checkpoint).get("compute_dtype")


def weights_dtype(requested: str, model_path: str) -> str:
    """The dtype to load and run the weights in `model_path` in: `requested`, or for `auto` the compute
    dtype of the run whose checkpoint holds them (`model_path` is a checkpoint's model/ folder), float32
    for any other model. A checkpoint holds fp32 master weights; under bf16 compute an update smaller
    than bf16's rounding step moves them without moving the function the run trained, so the policy a
    bf16 run trained and validated is its checkpoint in bf16."""
    if requested != "auto":
        return requested
    folder = Path(model_path).expanduser()
    if folder.name == "model" and (folder.parent / FORMAT_FILE).is_file():
        return checkpoint_compute_dtype(folder.parent) or "float32"
    return "float32"


def _generation_config(model: Any, tokenizer: Any) -> Any:
    """The model's generation config with the tokenizer's EOS and pad ids added."""
    gen = model.generation_config
    eos = gen.eos_token_id if gen.eos_token_id is not None else model.config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.append(tokenizer.eos_token_id)
    gen.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    if gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id
    if gen.bos_token_id is None:
        gen.bos_token_id = getattr(model.config, "bos_token_id", None)
    return gen


@dataclass(frozen=True)
class ExportResult:
    path: Path
    checkpoint: Path
    step: int | None
    has_chat_template: bool


def export_checkpoint(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    dtype: str | None = None,
    tokenizer_name: str | None = None,
    overwrite: bool = False,
    max_shard_size: str = "5GB",
    adapter: bool = False,
) -> ExportResult:
    """Write `checkpoint` (a step folder or run directory) as a Hugging Face folder at `out_dir`.

    `dtype` ("float32" / "bfloat16") casts the weights; None: the dtype the run computed in
    (`policy.dtype`, recorded in format.json; checkpoints hold fp32 master weights), or the
    checkpoint's own dtype for checkpoints that do not record it. A LoRA checkpoint is merged into
    its base model (in fp32, then cast), or with `adapter` written as a peft adapter folder.
    """
    from posttrain.modeling.loading import DTYPES, load_causal_lm

    out = Path(out_dir).expanduser()
    if out.exists() and not overwrite:
        raise ExistingFileError(f"{out} exists; choose another folder or pass --overwrite")
    found = find_checkpoint(checkpoint) if Path(checkpoint).expanduser().is_dir() else None
    if found is not None and _format(found).get("model") == LORA_ADAPTER:
        return _export_lora(found, out, dtype, tokenizer_name, max_shard_size, adapter=adapter)
    if adapter:
        raise UserError(f"--adapter: {checkpoint} is not a LoRA checkpoint (its run did not set policy.lora)")
    source = resolve_model_source(str(checkpoint), tokenizer_name)
    if source.checkpoint is None:
        raise MissingFileError(
            f"{checkpoint} is not a posttrain checkpoint (a step_* folder with {COMPLETE} and model/) "
            "nor a run directory that holds one"
        )
    dtype = dtype or checkpoint_compute_dtype(source.checkpoint)
    model = load_causal_lm(source.model, DTYPES[dtype] if dtype else "auto")
    return _write_export(out, source.checkpoint, source.tokenizer, max_shard_size, model=model)


def _export_lora(
    checkpoint: Path,
    out: Path,
    dtype: str | None,
    tokenizer_name: str | None,
    max_shard_size: str,
    *,
    adapter: bool,
) -> ExportResult:
    """A LoRA checkpoint: the adapter folder as it is (`adapter`), or the base model with the adapter merged."""
    from posttrain.models.hub import resolve_model

    adapter_dir = checkpoint / "model"
    tokenizer = resolve_model(tokenizer_name) if tokenizer_name else None
    if tokenizer is None:
        tokenizer = (
            str(adapter_dir) if _has_tokenizer(adapter_dir) else _tokenizer_from_run_config(checkpoint)
        )
    if adapter:
        return _write_export(out, checkpoint, tokenizer, max_shard_size, adapter_dir=adapter_dir)
    from peft import PeftModel

    from posttrain.modeling.loading import DTYPES, MASTER_DTYPE, load_causal_lm
    from posttrain.models.lora import read_adapter_config

    base = _format(checkpoint).get("base_model")
    if not base or not Path(base).exists():
        raise MissingFileError(
            f"{checkpoint} is a LoRA adapter of the base model {base!r}, which is not on this machine; "
            "export it with --adapter, or make the base model available at that path"
        )
    if read_adapter_config(adapter_dir).get("task_type") == "SEQ_CLS":  # a reward model (posttrain rm)
        from posttrain.modeling.tokenizer import load_tokenizer
        from posttrain.models.reward_model import load_reward_model

        pad = load_tokenizer(tokenizer).pad_token_id
        base_model = load_reward_model(base, MASTER_DTYPE, pad_token_id=pad)
    else:
        base_model = load_causal_lm(base, MASTER_DTYPE)
    merged = PeftModel.from_pretrained(base_model, str(adapter_dir)).merge_and_unload()
    dtype = dtype or checkpoint_compute_dtype(checkpoint) or "float32"
    return _write_export(out, checkpoint, tokenizer, max_shard_size, model=merged.to(DTYPES[dtype]))


def _same_mode_as(reference: Path, folder: Path) -> None:
    """Give every file under `folder` the permission bits of `reference` (a file this process just
    created: 0666 minus the umask). safetensors writes its weights through a temporary file created
    0600, which left model.safetensors unreadable to the group and others beside 0644 siblings."""
    mode = stat.S_IMODE(reference.stat().st_mode)
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) != mode:
            path.chmod(mode)


def _write_export(
    out: Path,
    checkpoint: Path,
    tokenizer_path: str,
    max_shard_size: str,
    *,
    model: Any = None,
    adapter_dir: Path | None = None,
) -> ExportResult:
    """The export folder, atomically: the model (or a LoRA adapter folder's files), the tokenizer, and
    posttrain_export.json naming the checkpoint."""
    from posttrain.modeling.tokenizer import load_tokenizer
    from posttrain.models.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS

    tokenizer = load_tokenizer(tokenizer_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(out) as tmp:
        if getattr(model, "generation_config", None) is not None:  # a causal LM (not a reward model)
            model.generation_config = _generation_config(model, tokenizer)
        if model is not None:
            model.save_pretrained(tmp, safe_serialization=True, max_shard_size=max_shard_size)
        if adapter_dir is not None:
            for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
                shutil.copyfile(adapter_dir / name, tmp / name)
        tokenizer.save_pretrained(tmp)
        step = json.loads((checkpoint / COMPLETE).read_text() or "{}").get("step")
        (tmp / "posttrain_export.json").write_text(
            json.dumps({"checkpoint": str(checkpoint.resolve()), "step": step}, indent=2)
        )
        _same_mode_as(tmp / "posttrain_export.json", tmp)
    return ExportResult(out, checkpoint, step, bool(getattr(tokenizer, "chat_template", None)))
