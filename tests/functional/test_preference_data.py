"""Preference data: every row shape, response-only masks on the real chat template, errors, generated pairs."""

import json

import pytest
from preference_helpers import write_preference_jsonl

from posttrain.config.supervised import GeneratedPairsConfig, PreferenceDatasetConfig
from posttrain.data.preference import (
    build_preference_dataset,
    collate_pairs,
    parse_hh_transcript,
    preference_rows,
    row_to_pair,
)
from posttrain.data.sources import DataError, Row


def _masked_text(tokenizer, example) -> str:
    return tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m])


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prompt_chosen_rejected_strings_mask_only_the_reply(tmp_path, tokenizer):
    path = _write(
        tmp_path / "p.jsonl", [{"prompt": "What is 2 + 2?", "chosen": "It is 4.", "rejected": "It is 5."}]
    )
    ds = build_preference_dataset(PreferenceDatasetConfig(path=str(path)), tokenizer, max_seq_len=256)
    [pair] = ds.pairs
    assert _masked_text(tokenizer, pair.chosen) == "It is 4.<|im_end|>\n"
    assert _masked_text(tokenizer, pair.rejected) == "It is 5.<|im_end|>\n"
    text = tokenizer.decode(pair.chosen.input_ids)
    assert "<|im_start|>user\nWhat is 2 + 2?<|im_end|>" in text


def test_multi_turn_conversations_mask_only_the_last_reply(tmp_path, tokenizer):
    """HH-RLHF / UltraFeedback shape: full conversations; the prompt is their common prefix."""
    shared = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name a colour."},
    ]
    row = {
        "chosen": [*shared, {"role": "assistant", "content": "Blue."}],
        "rejected": [*shared, {"role": "assistant", "content": "No."}],
    }
    path = _write(tmp_path / "c.jsonl", [row])
    [pair] = build_preference_dataset(
        PreferenceDatasetConfig(path=str(path)), tokenizer, max_seq_len=256
    ).pairs
    assert _masked_text(tokenizer, pair.chosen) == "Blue.<|im_end|>\n"  # not the earlier assistant turn
    assert "Hello! How can I help?" in tokenizer.decode(pair.chosen.input_ids)


def test_ultrafeedback_prompt_string_with_message_lists(tokenizer):
    row = Row(
        {
            "prompt": "Say hi",
            "chosen": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}],
            "rejected": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "no"}],
        },
        "uf row 1",
    )
    prompt, chosen, rejected = row_to_pair(row, PreferenceDatasetConfig(path="x.jsonl"))
    assert prompt == [{"role": "user", "content": "Say hi"}]
    assert chosen == [{"role": "assistant", "content": "hi"}] and rejected == [
        {"role": "assistant", "content": "no"}
    ]


def test_raw_hh_rlhf_transcripts():
    text = "\n\nHuman: What is 1+1?\n\nAssistant: 2\n\nHuman: And 2+2?\n\nAssistant: 4"
    assert parse_hh_transcript(text)[-1] == {"role": "assistant", "content": "4"}
    row = Row({"chosen": text, "rejected": text[:-1] + "5"}, "hh row 1")
    prompt, chosen, rejected = row_to_pair(row, PreferenceDatasetConfig(path="x.jsonl"))
    assert [m["role"] for m in prompt] == ["user", "assistant", "user"]
    assert chosen == [{"role": "assistant", "content": "4"}]
    assert rejected == [{"role": "assistant", "content": "5"}]


def test_helpsteer3_picks_the_preferred_response_and_drops_ties(tmp_path, tokenizer):
    context = [{"role": "user", "content": "Pick a number"}]
    rows = [
        {"context": context, "response1": "Seven", "response2": "No", "overall_preference": -2},
        {"context": context, "response1": "No", "response2": "Three", "overall_preference": 1},
        {"context": context, "response1": "A", "response2": "B", "overall_preference": 0},
    ]
    ds = build_preference_dataset(
        PreferenceDatasetConfig(path=str(_write(tmp_path / "h.jsonl", rows))), tokenizer, max_seq_len=256
    )
    assert (len(ds), ds.num_dropped) == (2, 1)
    assert [_masked_text(tokenizer, p.chosen) for p in ds.pairs] == ["Seven<|im_end|>\n", "Three<|im_end|>\n"]


def test_parquet_and_custom_keys(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"q": ["Hi?"], "good": ["Hello."], "bad": ["Go away."]})
    pq.write_table(table, tmp_path / "d.parquet")
    cfg = PreferenceDatasetConfig(
        path=str(tmp_path / "d.parquet"), prompt_key="q", chosen_key="good", rejected_key="bad"
    )
    [pair] = build_preference_dataset(cfg, tokenizer, max_seq_len=256).pairs
    assert _masked_text(tokenizer, pair.rejected) == "Go away.<|im_end|>\n"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "x", "chosen": "y"}, r"d.jsonl row 2: missing key 'rejected'"),
        ({"prompt": "x", "chosen": "y", "rejected": 3}, r"d.jsonl row 2: `rejected` must be a string"),
        (
            {"prompt": "x", "chosen": [{"role": "bot", "content": "y"}], "rejected": "z"},
            r"row 2: `chosen` message 0 has role 'bot'",
        ),
        (
            {"chosen": [{"role": "user", "content": "only a question"}], "rejected": "z"},
            r"row 2: `chosen` has no assistant reply",
        ),
    ],
)
def test_malformed_pair_fails_with_its_location(tmp_path, tokenizer, row, message):
    good = {"prompt": "a", "chosen": "b", "rejected": "c"}
    path = _write(tmp_path / "d.jsonl", [good, row])
    with pytest.raises(DataError, match=message):
        build_preference_dataset(PreferenceDatasetConfig(path=str(path)), tokenizer, max_seq_len=256)


def test_overlong_pairs_are_truncated_or_dropped(tmp_path, tokenizer):
    cfg = PreferenceDatasetConfig(path=str(write_preference_jsonl(tmp_path / "d.jsonl", n=16)))
    kept = build_preference_dataset(cfg, tokenizer, max_seq_len=70)  # sequences here: 65-78 tokens
    assert kept.num_truncated > 0 and kept.num_dropped == 0 and len(kept) == 16
    assert all(max(len(p.chosen), len(p.rejected)) <= 70 for p in kept.pairs)
    dropped = build_preference_dataset(cfg, tokenizer, max_seq_len=70, overlong="drop")
    assert len(dropped) == 16 - kept.num_truncated
    # replies start at tokens 40-52: a cut before the reply leaves nothing to compare, so the pair goes
    short = build_preference_dataset(cfg, tokenizer, max_seq_len=46)
    assert 0 < short.num_dropped < 16
    with pytest.raises(DataError, match="every one of the 16 preference rows was dropped"):
        build_preference_dataset(cfg, tokenizer, max_seq_len=30)


def test_collate_interleaves_chosen_and_rejected(tmp_path, tokenizer):
    ds = build_preference_dataset(
        PreferenceDatasetConfig(path=str(write_preference_jsonl(tmp_path / "d.jsonl", n=3))),
        tokenizer,
        max_seq_len=256,
    )
    batch = collate_pairs(ds.pairs, pad_id=tokenizer.pad_token_id)
    assert batch.num_pairs == 3 and batch.input_ids.shape[0] == 6
    assert batch.input_ids[1, : len(ds.pairs[0].rejected)].tolist() == ds.pairs[0].rejected.input_ids
    assert batch.reference_logps.shape == (6,)
    shard = batch.shards(3)[1]
    assert shard.input_ids[0, : len(ds.pairs[1].chosen)].tolist() == ds.pairs[1].chosen.input_ids


def test_generated_arithmetic_pairs():
    gym = GeneratedPairsConfig(
        size=50, seed=5, kwargs={"min_terms": 2, "max_terms": 2, "max_digits": 2, "operators": ["+"]}
    )
    rows = preference_rows(PreferenceDatasetConfig(reasoning_gym=gym))
    again = preference_rows(PreferenceDatasetConfig(reasoning_gym=gym))
    assert [r.data for r in rows] == [r.data for r in again]  # the same pairs on every machine
    for row in rows:
        d = row.data
        assert d["chosen"].endswith(f"\\boxed{{{d['answer']}}}.")
        assert d["rejected"] != d["chosen"] and "\\boxed{" in d["rejected"]
        assert d["chosen"].split(" = ")[0] == d["rejected"].split(" = ")[0]  # same worked expression
    held_out = preference_rows(PreferenceDatasetConfig(reasoning_gym=gym.model_copy(update={"seed": 6})))
    assert {r.data["prompt"] for r in held_out} != {r.data["prompt"] for r in rows}


def test_generated_pairs_with_the_grpo_system_prompt(tokenizer):
    gym = GeneratedPairsConfig(size=4, seed=5, system_prompt="Put the final answer in \\boxed{}.")
    ds = build_preference_dataset(PreferenceDatasetConfig(reasoning_gym=gym), tokenizer, max_seq_len=256)
    text = tokenizer.decode(ds.pairs[0].chosen.input_ids)
    assert text.startswith(
        "<|im_start|>system\nPut the final answer in \\boxed{}.<|im_end|>\n<|im_start|>user\n"
    )
    assert _masked_text(tokenizer, ds.pairs[0].chosen).endswith("}.<|im_end|>\n")
