"""The quickstart's data (#32): worked example turns in the prompt (the same at training, validation
and eval), a held-out set disjoint from the training problems, and the families it never trains on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.config import load_config
from posttrain.config.common import DatasetConfig
from posttrain.config.eval import EvalConfig
from posttrain.config.loader import ConfigError
from posttrain.config.ppo import PPOConfig
from posttrain.config.rl import DistillConfig, GRPOConfig
from posttrain.data.sources import DataError, Row
from posttrain.data.tasks import build_tasks, row_messages, without_held_out
from posttrain.rollout.tasks import load_tasks, rl_tasks

EXAMPLES = Path(__file__).parents[2] / "examples" / "configs"
SHOT = [{"role": "user", "content": "Calculate 4 + 3."}, {"role": "assistant", "content": "7"}]


def user_questions(tasks):
    return {t["messages"][-1]["content"] for t in tasks}


def quickstart_tasks(tokenizer, *overrides):
    cfg = load_config(GRPOConfig, None, list(overrides))
    max_prompt = cfg.policy.max_seq_len - cfg.generation.max_new_tokens
    return rl_tasks(cfg.data, cfg.environment, tokenizer=tokenizer, max_prompt_len=max_prompt)


# ------------------------------------------------------------------ worked example turns
def test_example_turns_go_after_the_system_prompt_and_before_the_question():
    row = Row({"prompt": "Calculate 1 + 2.", "answer": "3"}, "row 1")
    cfg = DatasetConfig(path="x.jsonl")
    assert row_messages(row, cfg, "{problem}", "Box it.", SHOT) == [
        {"role": "system", "content": "Box it."},
        *SHOT,
        {"role": "user", "content": "Calculate 1 + 2."},
    ]
    # a row with messages of its own: after its own system message, before its first user message
    own = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "Q"}]
    assert row_messages(Row({"messages": own}, "row 2"), cfg, "{problem}", "Box it.", SHOT) == [
        own[0],
        *SHOT,
        own[1],
    ]
    assert row_messages(Row({"messages": own[1:]}, "row 3"), cfg, "{problem}", "Box it.", SHOT) == [
        {"role": "system", "content": "Box it."},
        *SHOT,
        own[1],
    ]


@pytest.mark.parametrize(
    "turns, message",
    [
        ('[{role: assistant, content: "7"}]', "has role 'assistant' where 'user' is expected"),
        ('[{role: user, content: "Q"}, {role: user, content: "Q"}]', "where 'assistant' is expected"),
        ('[{role: user, content: "Q"}]', "ends with a user turn"),
        ('[{role: user, content: ""}, {role: assistant, content: "7"}]', "at least 1 character"),
        ('[{role: system, content: "S"}]', "'user' or 'assistant'"),
    ],
)
def test_example_turns_are_validated(turns, message):
    for model, key in ((GRPOConfig, "data.example_turns"), (EvalConfig, "data.example_turns")):
        with pytest.raises(ConfigError, match=message):
            load_config(model, None, [f"{key}={turns}"])
    assert load_config(GRPOConfig, None, ["data.example_turns=[]"]).data.example_turns == []


def test_the_worked_example_belongs_to_the_quickstart_task_only():
    """Data of one's own (a file, another task, environment tasks) gets no worked 1-digit sum unless
    it asks for one; another size or operand range of the same task keeps it."""
    default = GRPOConfig().data.example_turns
    assert [t.role for t in default] == ["user", "assistant"]
    for model in (GRPOConfig, PPOConfig, DistillConfig):
        assert load_config(model, None, ["data.train.path=my.jsonl"]).data.example_turns == []
        assert model(data={"train": {"path": "my.jsonl"}}).data.example_turns == []
    kept = load_config(
        GRPOConfig,
        None,
        [
            "data.train.path=my.jsonl",
            'data.example_turns=[{role: user, content: "Q"}, {role: assistant, content: "A"}]',
        ],
    )
    assert [t.content for t in kept.data.example_turns] == ["Q", "A"]
    assert (
        load_config(GRPOConfig, None, ["data.train.reasoning_gym.kwargs.max_digits=2"]).data.example_turns
        == default
    )
    assert load_config(EvalConfig, None, ["data.dataset.path=gsm8k.jsonl"]).data.example_turns == []
    assert load_config(EvalConfig, None, ["data.dataset.reasoning_gym.size=8"]).data.example_turns == default
    with pytest.raises(
        ConfigError, match="environment_tasks, whose episodes start from the environment's reset"
    ):
        load_config(
            GRPOConfig,
            None,
            [
                "data.train.reasoning_gym=null",
                "data.train.environment_tasks.size=8",
                "data.example_turns=[{role: user, content: Q}, {role: assistant, content: A}]",
                "environment.name=sliding_puzzle",
                "environment.max_turns=50",
            ],
        )


@pytest.mark.slow  # the SmolLM2 tokenizer
def test_eval_scores_the_prompt_the_quickstart_trains_and_validates_on(tokenizer):
    """`posttrain eval` (its defaults and the unseen-family recipes) builds the quickstart's prompt:
    system prompt, the worked example, the question."""
    grpo = GRPOConfig().data
    for cfg in (
        EvalConfig(),
        load_config(EvalConfig, EXAMPLES / "eval_quickstart_unseen.yaml"),
        load_config(EvalConfig, EXAMPLES / "eval_quickstart_unseen_products.yaml"),
    ):
        data = cfg.data
        assert (data.system_prompt, data.example_turns, data.prompt_template) == (
            grpo.system_prompt,
            grpo.example_turns,
            grpo.prompt_template,
        )
    validation = quickstart_tasks(tokenizer).validation
    cfg = EvalConfig()
    evaluated = load_tasks(
        cfg.data.dataset,
        cfg.environment,
        prompt_template=cfg.data.prompt_template,
        system_prompt=cfg.data.system_prompt,
        example_turns=cfg.data.example_turns,
        tokenizer=tokenizer,
        max_prompt_len=cfg.data.max_prompt_len,
    )
    assert [t["messages"] for t in evaluated] == [t["messages"] for t in validation]
    first = validation[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant", "user"]
    assert first[1:3] == [t.model_dump() for t in grpo.example_turns]


# ------------------------------------------------------------------ held out means held out
def test_without_held_out_drops_training_prompts_that_are_validation_prompts():
    def task(q, **extra):
        return {"messages": [{"role": "user", "content": q}], **extra}

    train = [task("a"), task("b"), task("a", answer="1"), {"answer": "env-made"}, task("c")]
    kept, dropped = without_held_out(train, [task("a"), task("z")])
    assert dropped == 2 and kept == [train[1], train[3], train[4]]
    with pytest.raises(DataError, match="every one of the 2 training tasks is also a validation task"):
        without_held_out([task("a"), task("a")], [task("a")])


@pytest.mark.slow  # the SmolLM2 tokenizer
def test_the_quickstart_held_out_problems_are_not_trained_on(tokenizer):
    """The quickstart's 5000 generated 1-digit sums repeat ~121 distinct problems, every validation
    problem among them; the run trains only on the others."""
    train, validation, dropped = quickstart_tasks(tokenizer)
    assert len(validation) == 64 and len(train) + dropped == 5000
    assert dropped > 0 and train
    assert not user_questions(train) & user_questions(validation)
    assert not {json.dumps(t["messages"]) for t in train} & {json.dumps(t["messages"]) for t in validation}
    # the knob is what makes them disjoint: off, the splits share problems
    train_all, validation_all, none = quickstart_tasks(tokenizer, "data.exclude_validation_from_train=false")
    assert none == 0 and len(train_all) == 5000
    assert user_questions(train_all) & user_questions(validation_all)


@pytest.mark.slow  # the SmolLM2 tokenizer
def test_the_worked_example_and_the_unseen_families_are_not_validation_or_training_problems(tokenizer):
    train, validation, _ = quickstart_tasks(tokenizer)
    example = GRPOConfig().data.example_turns[0].content
    assert example not in user_questions(validation)
    for recipe in ("eval_quickstart_unseen.yaml", "eval_quickstart_unseen_products.yaml"):
        cfg = load_config(EvalConfig, EXAMPLES / recipe)
        assert cfg.generation.temperature == 0.0 and cfg.data.dataset.reasoning_gym.size == 64
        unseen = build_tasks(cfg.data.dataset)
        assert len(unseen) == 64
        assert not user_questions(unseen) & (user_questions(train) | user_questions(validation)), recipe
