"""`policy.chat_template` sets or replaces the tokenizer's template; a base model without one is a
one-line config error naming the key; the run, its workers and its checkpoints use the same template."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import make_tiny_model_dir, sft_overrides, write_sft_jsonl

from posttrain.cli import main
from posttrain.modeling.tokenizer import ChatTemplateError, load_tokenizer, read_chat_template

TEMPLATE = (  # HF renders with trim_blocks: newlines are written as Jinja strings
    "{% for m in messages %}{{ '### ' + m['role'] + '\\n' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '### assistant\\n' }}{% endif %}"
)
CONVERSATION = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny random model whose tokenizer has no chat template (as a base model's)."""
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("base"), plain)
    assert load_tokenizer(str(folder)).chat_template is None
    return folder


def test_read_chat_template_string_file_plain_and_errors(tmp_path):
    assert read_chat_template(TEMPLATE) == TEMPLATE
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    assert read_chat_template(str(tmp_path / "t.jinja")) == TEMPLATE
    assert read_chat_template("plain") is None
    with pytest.raises(ChatTemplateError, match="policy.chat_template='nope.jinja' is neither"):
        read_chat_template("nope.jinja")
    (tmp_path / "empty.jinja").write_text("no jinja here")
    with pytest.raises(ChatTemplateError, match="holds no Jinja template"):
        read_chat_template(str(tmp_path / "empty.jinja"))


def test_override_replaces_the_tokenizers_template(smollm_dir):
    tok = load_tokenizer(str(smollm_dir), TEMPLATE)
    assert (
        tok.apply_chat_template(CONVERSATION, tokenize=False)
        == "### user\n2+2?\n### assistant\n4<|im_end|>\n"
    )


def test_base_model_without_template_is_one_error_line_naming_the_key(base_model_dir, tmp_path, capsys):
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=8)
    code = main(["sft", *sft_overrides(base_model_dir, data, tmp_path / "run", **{"sft.max_steps": 1})])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: the tokenizer of ")
    assert "has no chat template" in err and "set policy.chat_template" in err


def test_sft_trains_with_the_given_template_and_checkpoints_keep_it(base_model_dir, tmp_path, capsys):
    from posttrain.data.tokenize import tokenize_conversation

    data = write_sft_jsonl(tmp_path / "train.jsonl", n=8)
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    run = tmp_path / "run"
    extra = {"sft.max_steps": 1, "sft.val_at_start": False, "policy.chat_template": str(tmp_path / "t.jinja")}
    assert main(["sft", *sft_overrides(base_model_dir, data, run, **extra)]) == 0, capsys.readouterr().err
    for folder in (run / "tokenizer", run / "checkpoints" / "step_000001" / "model"):
        saved = load_tokenizer(str(folder))
        assert saved.chat_template == TEMPLATE, folder
    example = tokenize_conversation(saved, CONVERSATION)
    assert saved.decode(example.input_ids) == "### user\n2+2?\n### assistant\n4<|im_end|>\n"


def test_plain_trains_without_role_markers(base_model_dir, tmp_path, capsys):
    data = write_sft_jsonl(tmp_path / "train.jsonl", n=8)
    extra = {"sft.max_steps": 1, "sft.val_at_start": False, "policy.chat_template": "plain"}
    assert main(["sft", *sft_overrides(base_model_dir, data, tmp_path / "run", **extra)]) == 0
    assert load_tokenizer(str(tmp_path / "run" / "tokenizer")).chat_template is None


def test_grpo_workers_render_prompts_with_the_given_template(base_model_dir, tmp_path):
    from conftest import grpo_test_config

    from posttrain.trainers.grpo import GRPOTrainer

    cfg = grpo_test_config(base_model_dir, tmp_path / "run", **{"policy.chat_template": json.dumps(TEMPLATE)})
    trainer = GRPOTrainer(cfg)
    try:
        prompt = trainer.tokenizer.decode(trainer.runtime.probe_prompts[0])
        assert prompt.startswith("### system\n") and prompt.endswith("### assistant\n"), prompt
        # every worker loads the tokenizer saved with the template
        assert load_tokenizer(str(tmp_path / "run" / "tokenizer")).chat_template == TEMPLATE
    finally:
        trainer.runtime.shutdown()


def test_eval_takes_the_key_too(base_model_dir, tmp_path, capsys):
    from posttrain.config.common import DatasetConfig
    from posttrain.data.sft import build_sft_dataset

    data = write_sft_jsonl(tmp_path / "val.jsonl", n=4)
    args = ["eval", f"model={base_model_dir}", f"data.dataset.path={data}", "metric=loss"]
    assert main([*args, f"output_dir={tmp_path / 'a'}"]) == 2
    assert "set chat_template" in capsys.readouterr().err
    assert main([*args, f"output_dir={tmp_path / 'b'}", f"chat_template={json.dumps(TEMPLATE)}"]) == 0
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    templated = load_tokenizer(str(base_model_dir), TEMPLATE)
    expected = build_sft_dataset(DatasetConfig(path=str(data)), templated, max_seq_len=2048)
    assert summary["num_target_tokens"] == sum(sum(e.loss_mask) for e in expected.examples)
    plain = build_sft_dataset(
        DatasetConfig(path=str(data)), load_tokenizer(str(base_model_dir), "plain"), max_seq_len=2048
    )
    assert summary["num_target_tokens"] != sum(sum(e.loss_mask) for e in plain.examples)
