"""DPO and reward-model training end to end on a tiny model: learning, checkpoints, exact resume, Ray, CLI."""

import json

import pytest
import torch
from preference_helpers import preference_overrides, write_preference_jsonl
from safetensors.torch import load_file

from posttrain.cli import main
from posttrain.config import load_config
from posttrain.config.supervised import DPOConfig, RMConfig
from posttrain.trainers.dpo import run_dpo
from posttrain.trainers.rm import run_rm

RUNS = {"dpo": (DPOConfig, run_dpo), "rm": (RMConfig, run_rm)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_preference_jsonl(tmp_path_factory.mktemp("pref") / "train.jsonl", n=16)


def _cfg(algorithm, tiny_model_dir, data, run_dir, **extra):
    return load_config(
        RUNS[algorithm][0], None, preference_overrides(tiny_model_dir, data, run_dir, algorithm, **extra)
    )


def _train(h):
    return [x for x in h if "loss" in x]


def test_dpo_learns_the_training_preferences(tiny_model_dir, data, tmp_path):
    cfg = _cfg(
        "dpo",
        tiny_model_dir,
        data,
        tmp_path / "run",
        **{"dpo.max_steps": 12, "dpo.val_every": 6, "dpo.beta": 0.5, "logging.plots": True},
    )
    result = run_dpo(cfg)
    train, val = _train(result.history), [h for h in result.history if "val/loss" in h]
    assert [h["step"] for h in train] == list(range(1, 13))
    assert train[0]["loss"] == pytest.approx(0.6931, abs=1e-3)  # π = π_ref at step 1: -log σ(0)
    assert train[-1]["loss"] < 0.5 and train[-1]["rewards/margin"] > 0
    assert [h["step"] for h in val] == [0, 6, 12]
    assert val[0]["val/reward_accuracy"] == 0.0  # h = 0 exactly: ties count as wrong
    assert val[-1]["val/reward_accuracy"] > 0.7 and val[-1]["val/loss"] < val[0]["val/loss"]
    assert val[-1]["val/preference_accuracy"] >= val[0]["val/preference_accuracy"]
    assert result.last_checkpoint.name == "step_000012"
    assert (result.last_checkpoint / "model" / "tokenizer_config.json").is_file()
    assert (result.run_dir / "plots" / "val_preference_accuracy.png").is_file()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "rewards/accuracy" in r] == list(range(1, 13))


def test_rm_learns_and_the_result_loads_with_transformers(tiny_model_dir, data, tmp_path, tokenizer):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    cfg = _cfg("rm", tiny_model_dir, data, tmp_path / "run", **{"rm.max_steps": 32, "rm.val_every": 16})
    result = run_rm(cfg)
    train, val = _train(result.history), [h for h in result.history if "val/loss" in h]
    assert [h["step"] for h in train] == list(range(1, 33))
    assert [h["step"] for h in val] == [0, 16, 32]
    assert val[-1]["val/loss"] < val[0]["val/loss"]
    assert val[-1]["val/accuracy"] > val[0]["val/accuracy"] and val[-1]["val/accuracy"] >= 0.75
    assert val[-1]["val/margin"] > 0
    folder = result.last_checkpoint / "model"
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    assert model.config.num_labels == 1 and model.config.pad_token_id == tok.pad_token_id
    # transformers' own forward on a padded batch gives the scores the trainer trained
    from posttrain.config.supervised import PreferenceDatasetConfig
    from posttrain.data.preference import build_preference_dataset, collate_pairs
    from posttrain.models.reward_model import batched_scores

    pairs = build_preference_dataset(PreferenceDatasetConfig(path=str(data)), tok, max_seq_len=128).pairs[:4]
    batch = collate_pairs(pairs, pad_id=tok.pad_token_id)
    with torch.no_grad():
        hf = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.squeeze(-1)
    assert torch.allclose(hf, batched_scores(model, batch, 8), atol=1e-5)


@pytest.mark.parametrize("algorithm", ["dpo", "rm"])
def test_resume_is_bit_exact_with_the_same_data_order(algorithm, tiny_model_dir, data, tmp_path):
    run = RUNS[algorithm][1]
    straight = run(_cfg(algorithm, tiny_model_dir, data, tmp_path / "a", **{"checkpoint.save_every": 3}))
    first = run(_cfg(algorithm, tiny_model_dir, data, tmp_path / "b"), stop_after=3)
    assert first.step == 3 and first.last_checkpoint.name == "step_000003"
    second = run(_cfg(algorithm, tiny_model_dir, data, tmp_path / "b"))
    assert second.step == 6
    assert [h["loss"] for h in _train(first.history + second.history)] == [
        h["loss"] for h in _train(straight.history)
    ]
    a = load_file(straight.last_checkpoint / "model" / "model.safetensors")
    b = load_file(second.last_checkpoint / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    state_a = json.loads((straight.last_checkpoint / "trainer_state.json").read_text())
    assert state_a == json.loads((second.last_checkpoint / "trainer_state.json").read_text())
    assert state_a["sampler"]["epoch"] == 1  # 16 pairs / 4 per step: step 5 started a reshuffled epoch


@pytest.mark.ray
def test_on_ray_with_two_workers(ray_cluster, tiny_model_dir, data, tmp_path):
    """The DPO trainer on two Ray workers (the reward model's two Ray workers, and DPO's at the group
    level: test_preference_split_invariance.py)."""
    algorithm = "dpo"
    cfg = _cfg(
        algorithm,
        tiny_model_dir,
        data,
        tmp_path / algorithm,
        **{"cluster.backend": "ray", "cluster.num_workers": 2},
    )
    result = RUNS[algorithm][1](cfg, stop_after=4)
    losses = [h["loss"] for h in _train(result.history)]
    # two data-parallel workers take the steps one local worker takes (same batches, same losses)
    local = RUNS[algorithm][1](_cfg(algorithm, tiny_model_dir, data, tmp_path / "local"), stop_after=4)
    assert losses == pytest.approx([h["loss"] for h in _train(local.history)], rel=1e-4)
    assert (result.last_checkpoint / "rng_rank1.pt").is_file()
    resumed = RUNS[algorithm][1](cfg)
    assert [h["step"] for h in _train(resumed.history)] == [5, 6]


def test_batch_layout_errors_are_clear(tiny_model_dir, data, tmp_path):
    with pytest.raises(ValueError, match="train_micro_batch_size=3 counts sequences and must be even"):
        run_dpo(_cfg("dpo", tiny_model_dir, data, tmp_path / "x", **{"policy.train_micro_batch_size": 3}))


def test_cli_runs_dpo_and_rm(tiny_model_dir, data, tmp_path, capsys):
    for algorithm in ("dpo", "rm"):
        args = preference_overrides(
            tiny_model_dir, data, tmp_path / algorithm, algorithm, **{f"{algorithm}.max_steps": 1}
        )
        assert main([algorithm, *args]) == 0
        assert (tmp_path / algorithm / "checkpoints" / "step_000001" / "COMPLETE").is_file()
    assert main(["dpo", "--print-config", "dpo.loss_type=ipo", "dpo.label_smoothing=0.1"]) == 2
    assert "label_smoothing applies to loss_type=sigmoid" in capsys.readouterr().err
