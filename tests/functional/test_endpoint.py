"""The OpenAI-compatible endpoint with the stock `openai` client, on loopback: plain replies, tools,
stop strings, logprobs, the Responses API, edited histories, and token-for-token equality of the
trajectory it records with the in-process rollout's."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")

from functional.endpoint_helpers import ScriptedGenerator, serving  # noqa: E402

from posttrain.data.tokenize import encode_prompt  # noqa: E402
from posttrain.environments.tools import with_tools_in_system_prompt  # noqa: E402
from posttrain.generation.sampling import SamplingParams  # noqa: E402
from posttrain.generation.text_generation import LocalGenerator  # noqa: E402

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
CALL_TEXT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'


def client(server, sid: str = "s1"):
    return openai.OpenAI(base_url=server.base_url(sid), api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def tiny_generator(tiny_model_dir, tokenizer):
    return LocalGenerator(str(tiny_model_dir), tokenizer, device="cpu")


def test_plain_reply_is_the_generators_greedy_output(tiny_generator, tokenizer):
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    prompt = encode_prompt(tokenizer, messages)
    direct = tiny_generator.generate([prompt], SamplingParams(temperature=0, max_new_tokens=16), 1)
    with serving(tiny_generator, tokenizer) as (server, app):
        reply = client(server).chat.completions.create(
            model="anything", messages=messages, max_tokens=16, temperature=0, logprobs=True
        )
        t = app.sessions["s1"].recorder.trajectory
    ids = direct.token_ids[0]
    assert reply.choices[0].message.content == tokenizer.decode(ids, skip_special_tokens=True)
    assert reply.choices[0].finish_reason == ("length" if direct.truncated[0] else "stop")
    assert reply.usage.prompt_tokens == len(prompt) and reply.usage.completion_tokens == len(ids)
    assert t.input_ids == prompt + ids
    assert t.loss_mask == [0] * len(prompt) + [1] * len(ids)
    assert [x.logprob for x in reply.choices[0].logprobs.content] == direct.logprobs[0]
    assert [x.token for x in reply.choices[0].logprobs.content] == [tokenizer.decode([i]) for i in ids]
    assert t.generation_logprobs[len(prompt) :] == direct.logprobs[0]


def test_stop_string_ends_the_reply_before_it(tiny_generator, tokenizer):
    """A stop string taken from the greedy reply's 4th token: the content is the text before it, the
    recorded ids end with the token that completed it (OpenAI's `stop` semantics)."""
    messages = [{"role": "user", "content": "Tell me a story."}]
    greedy = tiny_generator.generate(
        [encode_prompt(tokenizer, messages)], SamplingParams(temperature=0, max_new_tokens=12), 1
    )
    ids = greedy.token_ids[0]
    stop = tokenizer.decode([ids[3]]).strip() or tokenizer.decode([ids[3]])
    text = tokenizer.decode(ids, skip_special_tokens=True)
    with serving(tiny_generator, tokenizer) as (server, app):
        reply = client(server).chat.completions.create(
            model="m", messages=messages, max_tokens=12, stop=[stop]
        )
        t = app.sessions["s1"].recorder.trajectory
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == text[: text.index(stop)]
    generated = [i for i, m in zip(t.input_ids, t.loss_mask, strict=True) if m]
    assert generated == ids[: len(generated)] and stop in tokenizer.decode(generated)
    assert stop not in tokenizer.decode(generated[:-1])


def test_top_logprobs_and_several_choices_are_refused(tiny_generator, tokenizer):
    with serving(tiny_generator, tokenizer) as (server, _):
        c = client(server)
        messages = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.BadRequestError, match="only the sampled token"):
            c.chat.completions.create(model="m", messages=messages, logprobs=True, top_logprobs=2)
        with pytest.raises(openai.BadRequestError, match="n must be 1"):
            c.chat.completions.create(model="m", messages=messages, n=2)
        with pytest.raises(openai.NotFoundError):
            openai.OpenAI(
                base_url=server.base_url("nope"), api_key="x", max_retries=0
            ).chat.completions.create(model="m", messages=messages)


def _expected_tool_episode(tokenizer, generator: ScriptedGenerator) -> tuple[list[int], list[int]]:
    """The episode's ids and loss mask, built by hand from the chat template's rendering of the whole
    conversation (SmolLM2's template ignores tools=, so the tools are in the system message)."""
    start = with_tools_in_system_prompt([{"role": "user", "content": "What is 2 + 3?"}], [CALC_TOOL])
    prompt = encode_prompt(tokenizer, start)
    first = generator.reply_ids(CALL_TEXT)
    convo = [
        *start,
        {"role": "assistant", "content": CALL_TEXT},
        {"role": "tool", "name": "calculator", "content": "5"},
    ]
    before_second = encode_prompt(tokenizer, convo)
    second = generator.reply_ids("The answer is 5.")
    assert (
        before_second[: len(prompt) + len(first)] == prompt + first
    )  # the reply round-trips in this template
    observation = before_second[len(prompt) + len(first) :]
    ids = prompt + first + observation + second
    mask = [0] * len(prompt) + [1] * len(first) + [0] * len(observation) + [1] * len(second)
    return ids, mask


def test_tool_calls_round_trip_and_the_episode_is_the_templates_conversation(tokenizer):
    generator = ScriptedGenerator(tokenizer, [CALL_TEXT, "The answer is 5."])
    expected_ids, expected_mask = _expected_tool_episode(tokenizer, ScriptedGenerator(tokenizer, []))
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    with serving(generator, tokenizer) as (server, app):
        c = client(server)
        first = c.chat.completions.create(model="m", messages=messages, tools=[CALC_TOOL])
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls" and message.content is None
        (call,) = message.tool_calls
        assert call.function.name == "calculator" and json.loads(call.function.arguments) == {
            "expression": "2 + 3"
        }
        messages += [
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ]
        second = c.chat.completions.create(model="m", messages=messages, tools=[CALC_TOOL])
        t = app.sessions["s1"].recorder.trajectory
    assert (
        second.choices[0].message.content == "The answer is 5." and second.choices[0].finish_reason == "stop"
    )
    assert "</tool_call>" in generator.calls[0][1].stop_strings  # tools offered: a reply ends at its call
    assert t.input_ids == expected_ids and t.loss_mask == expected_mask
    assert t.num_turns == 2 and t.messages[-2] == {
        "role": "tool",
        "name": "calculator",
        "content": "5",
        "tool_call_id": call.id,
    }


def test_responses_api_records_the_same_episode_as_chat_completions(tokenizer):
    generator = ScriptedGenerator(tokenizer, [CALL_TEXT, "The answer is 5."])
    expected_ids, expected_mask = _expected_tool_episode(tokenizer, ScriptedGenerator(tokenizer, []))
    flat_tool = {"type": "function", **CALC_TOOL["function"]}
    with serving(generator, tokenizer) as (server, app):
        c = client(server)
        items: list = [{"role": "user", "content": "What is 2 + 3?"}]
        first = c.responses.create(model="m", input=items, tools=[flat_tool])
        (call,) = [o for o in first.output if o.type == "function_call"]
        assert call.name == "calculator" and json.loads(call.arguments) == {"expression": "2 + 3"}
        items += [o.model_dump(exclude_none=True) for o in first.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "5"})
        second = c.responses.create(model="m", input=items, tools=[flat_tool])
        t = app.sessions["s1"].recorder.trajectory
    assert second.output_text == "The answer is 5." and second.status == "completed"
    assert t.input_ids == expected_ids and t.loss_mask == expected_mask


def test_edited_history_is_refused_and_named(tokenizer):
    """A follow-up that changes an earlier message, or adds an assistant message the endpoint did not
    generate, fails with 400 history_edited; the session remembers it (its episode is unscored)."""
    generator = ScriptedGenerator(tokenizer, ["Hello.", "Again."])
    with serving(generator, tokenizer, sessions=("s1", "s2")) as (server, app):
        for sid, edit in (("s1", "changed"), ("s2", "injected")):
            c = client(server, sid)
            messages = [{"role": "user", "content": "Hi"}]
            reply = c.chat.completions.create(model="m", messages=messages)
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            if edit == "changed":
                messages[-1]["content"] = "Something I did not say."
                messages.append({"role": "user", "content": "And?"})
            else:
                messages += [
                    {"role": "user", "content": "And?"},
                    {"role": "assistant", "content": "Prefilled"},
                ]
            with pytest.raises(openai.BadRequestError) as err:
                c.chat.completions.create(model="m", messages=messages)
            assert err.value.code == "history_edited"
            assert app.sessions[sid].history_edited
            assert app.sessions[sid].recorder.trajectory.num_turns == 1


def test_a_request_past_max_turns_is_refused_and_the_episode_kept(tokenizer):
    from posttrain.data.trajectory import EpisodeLimits

    generator = ScriptedGenerator(tokenizer, ["One.", "Two."])
    with serving(generator, tokenizer, limits=EpisodeLimits(max_turns=1, max_seq_len=512)) as (server, app):
        c = client(server)
        messages = [{"role": "user", "content": "Count."}]
        reply = c.chat.completions.create(model="m", messages=messages)
        messages += [
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Next."},
        ]
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model="m", messages=messages)
        t = app.sessions["s1"].recorder.trajectory
    assert err.value.code == "episode_over" and "max_turns" in str(err.value)
    assert t.num_turns == 1 and t.stop_reason == "max_turns" and len(generator.calls) == 1
    assert app.sessions["s1"].history_edited is None
