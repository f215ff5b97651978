"""Export round trip: a trained checkpoint becomes an HF folder whose logits equal the policy's."""

import json

import pytest
import torch
from conftest import sft_overrides, write_sft_jsonl

from posttrain.checkpoint import Checkpointer
from posttrain.checkpoint.export import export_checkpoint, resolve_model_source
from posttrain.cli import main
from posttrain.config import load_config
from posttrain.config.common import OptimizerConfig, PolicyConfig, SchedulerConfig
from posttrain.config.supervised import SFTConfig
from posttrain.data.batching import collate
from posttrain.data.tokenize import tokenize_conversation
from posttrain.models.policy import Policy
from posttrain.trainers.sft import run_sft, sft_loss


def _batch(tokenizer):
    conversations = [
        [{"role": "user", "content": f"What is {a} + {a}?"}, {"role": "assistant", "content": f"{2 * a}"}]
        for a in range(4)
    ]
    return collate([tokenize_conversation(tokenizer, c) for c in conversations])


def test_exported_folder_logits_equal_the_trained_policy(tiny_model_dir, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    cfg = PolicyConfig(optimizer=OptimizerConfig(lr=1e-2), scheduler=SchedulerConfig(name="constant"))
    policy = Policy(cfg, model_path=str(tiny_model_dir), total_steps=2)
    batch = _batch(tokenizer)
    for _ in range(2):
        policy.train(batch, sft_loss, normalizer=batch.num_target_tokens)

    def write(directory):
        policy.save_checkpoint(directory)
        tokenizer.save_pretrained(directory / "model")

    checkpoint = Checkpointer(tmp_path / "run" / "checkpoints").save(2, write)
    assert json.loads((checkpoint / "format.json").read_text())["model"] == "hf_full_state"
    result = export_checkpoint(tmp_path / "run", tmp_path / "hf")  # a run dir: its latest checkpoint
    assert result.checkpoint == checkpoint and result.step == 2 and result.has_chat_template

    out = tmp_path / "hf"
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    policy.model.eval()
    with torch.no_grad():
        expected = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        got = exported(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    assert torch.equal(got, expected)
    # the weights did change in training, so the equality is about the trained policy
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        before = original(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    assert not torch.allclose(before, expected, atol=1e-3)

    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == tokenizer.chat_template
    gen = GenerationConfig.from_pretrained(out)
    eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    assert tokenizer.eos_token_id in eos and gen.pad_token_id == tokenizer.pad_token_id


def test_export_cli_bfloat16_and_refusals(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    data = write_sft_jsonl(tmp_path / "train.jsonl", n=16)
    cfg = load_config(
        SFTConfig, None, sft_overrides(tiny_model_dir, data, tmp_path / "run", **{"sft.max_steps": 2})
    )
    result = run_sft(cfg)
    assert main(["export", str(result.last_checkpoint), str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    assert "with chat template" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert model.dtype == torch.bfloat16
    # the checkpoint itself is usable as a model source (eval) and holds its tokenizer
    source = resolve_model_source(str(tmp_path / "run"))
    assert source.checkpoint == result.last_checkpoint and source.tokenizer == source.model
    with pytest.raises(FileExistsError):
        export_checkpoint(result.last_checkpoint, tmp_path / "bf16")
    with pytest.raises(FileNotFoundError, match="not a posttrain checkpoint"):
        export_checkpoint(tiny_model_dir, tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere").exists()


def test_exported_files_share_one_permission_mode(tiny_model_dir, tokenizer, tmp_path):
    """model.safetensors gets the mode of every other exported file: 0666 minus the process umask
    (safetensors writes it through a temporary file created 0600)."""
    import os
    import stat

    policy = Policy(PolicyConfig(), model_path=str(tiny_model_dir), total_steps=1)

    def write(directory):
        policy.save_checkpoint(directory)
        tokenizer.save_pretrained(directory / "model")

    Checkpointer(tmp_path / "run" / "checkpoints").save(1, write)
    previous = os.umask(0o022)
    try:
        export_checkpoint(tmp_path / "run", tmp_path / "hf")
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "hf").iterdir()}
    assert modes["model.safetensors"] == 0o644, modes
    assert set(modes.values()) == {0o644}, modes
    assert stat.S_IMODE((tmp_path / "hf").stat().st_mode) == 0o755
