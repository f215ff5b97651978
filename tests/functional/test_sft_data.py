"""SFT data on the real SmolLM2 chat template: loss masks and error messages."""

import json

import pytest

from posttrain.config.common import DatasetConfig
from posttrain.data.sft import build_sft_dataset
from posttrain.data.sources import DataError
from posttrain.data.tokenize import tokenize_conversation


def test_loss_mask_covers_exactly_the_assistant_turns(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "And 4 + 4?"},
        {"role": "assistant", "content": "8"},
    ]
    ex = tokenize_conversation(tokenizer, messages)
    targets = tokenizer.decode([t for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m])
    # both replies with their end-of-turn markers, nothing of the system/user turns or role headers
    assert targets == "5<|im_end|>\n8<|im_end|>\n"
    assert tokenizer.decode(ex.input_ids).startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_tool_call_transcripts_train_on_the_assistant_turns_only(tmp_path, tokenizer):
    """A calculator transcript (examples/calculator_transcripts.py): the call and the final answer are
    targets, the tool's result is context; the tool message keeps its name."""
    from posttrain.environments.calculator import CalculatorEnvironment, oracle_transcript

    env = CalculatorEnvironment(tools_in_system_prompt=True, answer_format="boxed")
    messages = oracle_transcript(env, {"a": 347, "b": 58})
    path = tmp_path / "tools.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    [ex] = build_sft_dataset(DatasetConfig(path=str(path)), tokenizer, max_seq_len=1024).examples
    targets = tokenizer.decode([t for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m])
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 58"}}\n</tool_call>'
    assert targets == f"{call}<|im_end|>\nThe answer is \\boxed{{20126}}.<|im_end|>\n"
    assert "<|im_start|>tool\n20126<|im_end|>" in tokenizer.decode(ex.input_ids)


def test_prompt_response_rows_with_context(tmp_path, tokenizer):
    path = tmp_path / "squad.jsonl"
    path.write_text(
        json.dumps({"context": "Paris is in France.", "question": "Where is Paris?", "answer": "France"})
    )
    cfg = DatasetConfig(path=str(path), prompt_key="question", response_key="answer", context_key="context")
    ds = build_sft_dataset(cfg, tokenizer, max_seq_len=256)
    ex = ds.examples[0]
    text = tokenizer.decode(ex.input_ids)
    assert "Paris is in France.\n\nWhere is Paris?" in text
    assert (
        tokenizer.decode([t for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m])
        == "France<|im_end|>\n"
    )


def test_overlong_truncate_or_drop_is_counted(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": "hi", "response": "ok"}, {"prompt": "word " * 100, "response": "long " * 100}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    truncated = build_sft_dataset(
        DatasetConfig(path=str(path)), tokenizer, max_seq_len=64, overlong="truncate"
    )
    assert (len(truncated), truncated.num_truncated, truncated.num_dropped) == (
        1,
        0,
        1,
    )  # prompt fills 64: no target
    path.write_text("\n".join(json.dumps(r) for r in [rows[0], {"prompt": "x", "response": "long " * 100}]))
    truncated = build_sft_dataset(
        DatasetConfig(path=str(path)), tokenizer, max_seq_len=64, overlong="truncate"
    )
    assert (len(truncated), truncated.num_truncated) == (2, 1)
    assert max(len(e) for e in truncated.examples) == 64
    dropped = build_sft_dataset(DatasetConfig(path=str(path)), tokenizer, max_seq_len=64, overlong="drop")
    assert (len(dropped), dropped.num_dropped) == (1, 1)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "hi"}, r"row 2: missing key 'response' \(the row has keys: prompt\)"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "row 2: no assistant message"),
        ({"messages": [{"role": "bot", "content": "hi"}]}, "row 2: message 0 has role 'bot'"),
    ],
)
def test_malformed_row_names_file_and_row(tmp_path, tokenizer, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "a", "response": "b"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=f"bad.jsonl {message}"):
        build_sft_dataset(DatasetConfig(path=str(path)), tokenizer, max_seq_len=64)


def test_invalid_json_line_is_located(tmp_path, tokenizer):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "a", "response": "b"}\n{"prompt": \n')
    with pytest.raises(DataError, match="broken.jsonl row 2: invalid JSON"):
        build_sft_dataset(DatasetConfig(path=str(path)), tokenizer, max_seq_len=64)


def test_parquet_and_hf_datasets_paths(tmp_path, tokenizer):
    import datasets

    rows = [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(4)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    assert (
        len(build_sft_dataset(DatasetConfig(path=str(tmp_path / "d.parquet")), tokenizer, max_seq_len=64))
        == 4
    )
    # a `datasets.load_dataset` name: the generic "json" builder reading local files
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = DatasetConfig(path="json", subset=None, split="train", max_samples=3)
    cfg_files = cfg.model_copy(update={"path": str(tmp_path)})  # a folder: load_dataset infers the builder
    assert len(build_sft_dataset(cfg_files, tokenizer, max_seq_len=64)) == 3


def test_reasoning_gym_data_teaches_the_boxed_format(tokenizer):
    from posttrain.config.supervised import SFTConfig

    cfg = SFTConfig().data.train.model_copy(
        update={"reasoning_gym": SFTConfig().data.train.reasoning_gym.model_copy(update={"size": 4})}
    )
    ds = build_sft_dataset(cfg, tokenizer, max_seq_len=256)
    target = tokenizer.decode(
        [t for t, m in zip(ds.examples[0].input_ids, ds.examples[0].loss_mask, strict=True) if m]
    )
    assert "\\boxed{" in target and target.endswith("<|im_end|>\n")
