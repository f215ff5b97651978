"""`posttrain eval metric=loss`: held-out loss and perplexity of SFT rows, equal to a float64
token-by-token reference whatever the batch split."""

from __future__ import annotations

import json
import math

import torch
from conftest import write_sft_jsonl

from posttrain.cli import main
from posttrain.config.common import DatasetConfig
from posttrain.data.sft import build_sft_dataset


def _reference_loss(model_dir, tokenizer, data) -> tuple[float, int]:
    """sum over assistant tokens of -log p(x_t | x_<t), one sequence at a time, in float64; token count."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).double().eval()
    total, count = 0.0, 0
    for example in build_sft_dataset(DatasetConfig(path=str(data)), tokenizer, max_seq_len=2048).examples:
        ids = torch.tensor([example.input_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0], dim=-1)
        for t, target in enumerate(example.loss_mask):
            if target:
                total -= logprobs[t - 1, example.input_ids[t]].item()
                count += 1
    return total / count, count


def test_heldout_loss_and_perplexity_equal_the_float64_reference(tiny_model_dir, tokenizer, tmp_path, capsys):
    data = write_sft_jsonl(tmp_path / "val.jsonl", n=5, seed=3)  # rows of different lengths: padding
    expected, count = _reference_loss(tiny_model_dir, tokenizer, data)
    for batch_size in (1, 2, 5):
        out = tmp_path / f"eval{batch_size}"
        args = [f"model={tiny_model_dir}", f"data.dataset.path={data}", "metric=loss", f"output_dir={out}"]
        assert main(["eval", *args, f"generation.batch_size={batch_size}", "device=cpu"]) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["num_target_tokens"] == count and summary["num_sequences"] == 5
        # fp32 log-softmax over a 49k vocabulary: relative error well under 1e-5 per token
        assert math.isclose(summary["loss"], expected, rel_tol=1e-5), (summary["loss"], expected)
        assert summary["perplexity"] == math.exp(summary["loss"])
        rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        assert sum(r["target_tokens"] for r in rows) == count
        assert math.isclose(sum(r["nll_sum"] for r in rows) / count, summary["loss"], rel_tol=1e-12)
    printed = capsys.readouterr().out
    assert f"loss={summary['loss']:.4f}" in printed and "perplexity=" in printed
    # a random tiny model is far from the data: loss near log(vocabulary) (49152 tokens: 10.8)
    assert 5 < summary["loss"] < 15
