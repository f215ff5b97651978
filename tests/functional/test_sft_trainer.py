"""SFT end to end on a tiny model: learning, checkpoints, exact resume, Ray, errors."""

import json

import pytest
import torch
from conftest import make_tiny_model_dir, sft_overrides, write_sft_jsonl
from safetensors.torch import load_file

from posttrain.config import ConfigError, load_config
from posttrain.config.supervised import SFTConfig
from posttrain.distributed.workers import WorkerError
from posttrain.modeling.loading import CheckpointMismatchError
from posttrain.trainers.sft import run_sft


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_sft_jsonl(tmp_path_factory.mktemp("sft") / "train.jsonl", n=48)


def _cfg(tiny_model_dir, data, run_dir, **extra) -> SFTConfig:
    return load_config(SFTConfig, None, sft_overrides(tiny_model_dir, data, run_dir, **extra))


def _weights(checkpoint):
    return load_file(checkpoint / "model" / "model.safetensors")


def test_sft_local_learns_checkpoints_and_resumes(tiny_model_dir, data, tmp_path):
    result = run_sft(_cfg(tiny_model_dir, data, tmp_path / "run", **{"sft.max_steps": 8, "sft.val_every": 4}))
    losses = [h["loss"] for h in result.history if "loss" in h]
    vals = [h["val/loss"] for h in result.history if "val/loss" in h]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5
    assert len(vals) == 3 and vals[-1] < vals[0]
    assert result.last_checkpoint.name == "step_000008"
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == list(range(1, 9))
    assert (tmp_path / "run" / "config.yaml").is_file()
    # a second invocation with more steps continues from step 8
    more = run_sft(_cfg(tiny_model_dir, data, tmp_path / "run", **{"sft.max_steps": 10, "sft.val_every": 4}))
    assert [h["step"] for h in more.history if "loss" in h] == [9, 10]


def test_resume_is_bit_exact_with_the_same_data_order(tiny_model_dir, data, tmp_path):
    straight = run_sft(_cfg(tiny_model_dir, data, tmp_path / "a", **{"checkpoint.save_every": 3}))
    first = run_sft(_cfg(tiny_model_dir, data, tmp_path / "b"), stop_after=3)
    assert first.step == 3 and first.last_checkpoint.name == "step_000003"
    second = run_sft(_cfg(tiny_model_dir, data, tmp_path / "b"))
    assert second.step == 6
    losses_straight = [h["loss"] for h in straight.history if "loss" in h]
    losses_resumed = [h["loss"] for h in first.history + second.history if "loss" in h]
    assert losses_resumed == losses_straight  # same batches, same parameters, bit for bit
    a, b = _weights(straight.last_checkpoint), _weights(second.last_checkpoint)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    state_a = json.loads((straight.last_checkpoint / "trainer_state.json").read_text())
    state_b = json.loads((second.last_checkpoint / "trainer_state.json").read_text())
    assert state_a == state_b


def test_resume_from_a_checkpoint_of_another_model_fails_clearly(tiny_model_dir, data, tmp_path, tokenizer):
    run_sft(_cfg(tiny_model_dir, data, tmp_path / "run", **{"sft.max_steps": 1}))
    other = tmp_path / "other_model"
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).save_pretrained(other)
    tokenizer.save_pretrained(other)
    # the saved config names the other model: refused before anything is loaded or written (#30 item 2)
    with pytest.raises(
        ConfigError, match=r"cannot resume from .*step_000001 with changed settings: policy.model_name"
    ):
        run_sft(_cfg(other, data, tmp_path / "run", **{"sft.max_steps": 2}))
    # a checkpoint without its config (older runs): the weights themselves do not fit
    (tmp_path / "run" / "checkpoints" / "step_000001" / "config.yaml").unlink()
    with pytest.raises(CheckpointMismatchError, match="does not match the configured policy model"):
        run_sft(_cfg(other, data, tmp_path / "run", **{"sft.max_steps": 2}))


@pytest.mark.ray
def test_worker_exception_reaches_the_user_with_the_worker_name(ray_cluster, tmp_path, tokenizer, data):
    broken = make_tiny_model_dir(tmp_path / "broken", tokenizer)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    cfg = _cfg(broken, data, tmp_path / "run", **{"cluster.backend": "ray"})
    with pytest.raises(
        WorkerError,
        match=r"worker policy-0 failed:(.|\n)*File \".*policy.py\", line \d+, in __init__(.|\n)*SafetensorError",
    ):
        run_sft(cfg)
