"""Multi-turn token sequences: generated tokens as generated, observation tokens from a dummy history.

The generator here is scripted (fixed replies, prompts recorded) because the claims are about how
`run_rollouts` assembles sequences around chosen replies (trailing whitespace, <think> blocks, a
missing end-of-turn token), which a random model does not produce on demand; the tokenizer and
its chat templates are SmolLM2's real ones, or small edits of it.
"""

from __future__ import annotations

import pytest

from posttrain.data.tokenize import encode_prompt, observation_ids, turn_suffix
from posttrain.environments.interface import EnvStepResult
from posttrain.generation.sampling import GenerationOutput, SamplingParams
from posttrain.modeling.tokenizer import load_tokenizer
from posttrain.rollout.rollout import run_rollouts

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
OBSERVATION = {"role": "user", "content": "Are you sure?"}

# SmolLM2's template with the assistant's content trimmed (as many templates do)
TRIMMING = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "(message['content'] | trim if message['role'] == 'assistant' else message['content']) + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# ... and with the <think> block of assistant replies dropped (DeepSeek-R1 style reasoning templates)
DROPS_THINKING = (
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# ... and with the last reply after the last user turn rendered with an empty <think> block (Qwen3):
# [user, assistant] is then no prefix of [user, assistant, user], the dummy history still works
MARKS_LAST_REPLY = (
    "{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}{% for message in messages %}"
    "{% if message['role'] == 'assistant' and loop.index0 > ns.last_user %}"
    "{{'<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message['content'] + '<|im_end|>\\n'}}"
    "{% else %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ScriptedGenerator:
    """Returns `replies[turn]` for every prompt of a turn and records the prompts it was given."""

    def __init__(self, replies: list[list[int]]) -> None:
        self.replies, self.prompts = replies, []

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, batch_size: int
    ) -> GenerationOutput:
        reply = self.replies[len(self.prompts)]
        self.prompts.append([list(p) for p in prompt_ids])
        n = len(prompt_ids)
        return GenerationOutput([list(reply)] * n, [[0.0] * len(reply)] * n, [False] * n)


class AskTwice:
    """Answers the first turn with OBSERVATION, ends the episode after the second."""

    def step(self, message_logs: list, metadata: list[dict]) -> EnvStepResult:
        n = len(message_logs)
        first = len(message_logs[0]) == len(QUESTION) + 1
        observations = [dict(OBSERVATION) if first else None for _ in range(n)]
        return EnvStepResult([1.0] * n, observations, [not first] * n, [dict(m) for m in metadata])

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        return {}


def _tokenizer(smollm_dir, template: str | None = None):
    tok = load_tokenizer(str(smollm_dir))  # a fresh copy: the session's tokenizer stays untouched
    if template is not None:
        tok.chat_template = template
    return tok


def _ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _two_turns(tok, first_reply: list[int], second_reply: list[int]):
    """One trajectory of two turns; returns it and the scripted generator (its recorded prompts)."""
    prompt = encode_prompt(tok, QUESTION)
    generator = ScriptedGenerator([first_reply, second_reply])
    rollouts = run_rollouts(
        [{"messages": list(QUESTION), "answer": "4"}],
        generations_per_prompt=1,
        generator=generator,
        environment=AskTwice(),
        tokenizer=tok,
        params=SamplingParams(),
        batch_size=8,
        max_turns=2,
        max_seq_len=512,
    )
    return prompt, rollouts.trajectories[0], generator


def test_smollm2_observation_tokens_equal_the_templated_conversation(tokenizer):
    """With a reply that round-trips, prompt + reply tokens + observation tokens are the tokens of the
    whole conversation templated at once, whether the model emitted <|im_end|> (its EOS) or stopped
    before it (a stop string): then the end-of-turn marker comes from the template."""
    reply = "2 + 2 = 4. The answer is \\boxed{4}."
    prompt = encode_prompt(tokenizer, QUESTION)
    conversation = [*QUESTION, {"role": "assistant", "content": reply}, OBSERVATION]
    whole = _ids(
        tokenizer, tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    )
    ended = [*_ids(tokenizer, reply), tokenizer.eos_token_id]
    stopped = _ids(tokenizer, reply)
    assert prompt + ended + observation_ids(tokenizer, ended, OBSERVATION) == whole
    assert prompt + stopped + observation_ids(tokenizer, stopped, OBSERVATION) == whole
    assert tokenizer.decode(observation_ids(tokenizer, ended, OBSERVATION)) == (
        "\n<|im_start|>user\nAre you sure?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert turn_suffix(tokenizer, OBSERVATION).startswith("<|im_end|>\n<|im_start|>user\nAre you sure?")


@pytest.mark.parametrize(
    ("template", "reply"),
    [
        (None, "The answer is \\boxed{4}."),
        (TRIMMING, "  The answer is \\boxed{4}.\n\n"),
        (DROPS_THINKING, "<think>\n2 and 2 make 4.\n</think>\n\nThe answer is \\boxed{4}."),
        (MARKS_LAST_REPLY, "<think>\n2 and 2 make 4.\n</think>\n\nThe answer is \\boxed{4}."),
    ],
    ids=["smollm2", "trimming", "drops_thinking", "marks_last_reply"],
)
@pytest.mark.parametrize("ends_turn", [True, False], ids=["eos", "stop_string"])
def test_turn_two_sees_prompt_generated_tokens_and_observation(smollm_dir, template, reply, ends_turn):
    """A reply the template would not reproduce verbatim no longer stops the run (the old code
    re-rendered it and raised), and turn 2's prompt is exactly prompt + turn-1 tokens as generated +
    observation tokens; the loss mask covers the generated tokens of both turns and nothing else."""
    tok = _tokenizer(smollm_dir, template)
    first = _ids(tok, reply) + ([tok.eos_token_id] if ends_turn else [])
    second = [*_ids(tok, "Yes."), tok.eos_token_id]
    prompt, trajectory, generator = _two_turns(tok, first, second)
    observation = observation_ids(tok, first, OBSERVATION)
    assert generator.prompts == [[prompt], [prompt + first + observation]]
    assert trajectory.input_ids == prompt + first + observation + second
    assert trajectory.loss_mask == [0] * len(prompt) + [1] * len(first) + [0] * len(observation) + [1] * len(
        second
    )
    assert trajectory.reward == 2.0 and trajectory.done and not trajectory.truncated
    # exactly one end-of-turn marker between the reply and the observation's turn
    between = tok.decode(trajectory.input_ids[len(prompt) + len(first) - 1 : len(prompt) + len(first) + 2])
    assert between.count("<|im_end|>") == 1
    assert tok.decode(observation).endswith(
        "<|im_start|>user\nAre you sure?<|im_end|>\n<|im_start|>assistant\n"
    )
