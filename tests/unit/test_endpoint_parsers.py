"""Tool-call parsers (hermes / qwen, llama3_json), the recorder's message comparison, the Responses
API's input conversion and the endpoint's request batching."""

from __future__ import annotations

import json
import threading
import time

import pytest

from posttrain.endpoint.app import cut_at_stop, responses_messages
from posttrain.endpoint.batching import GenerationQueue
from posttrain.endpoint.parsers import get_tool_call_parser
from posttrain.endpoint.recorder import canonical, template_messages
from posttrain.generation.sampling import GenerationOutput, SamplingParams


def _calls(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_hermes_parses_blocks_and_keeps_text_before_them():
    parser = get_tool_call_parser("hermes")
    text = 'Let me see.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>{"name": "g", "arguments": "{\\"y\\": [2]}"}'
    content, calls = parser.parse(text)
    assert content == "Let me see."
    assert _calls(calls) == [("f", {"x": 1}), ("g", {"y": [2]})]  # the last block left open (its stop) counts
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.parametrize(
    "text",
    [
        "no call at all",
        '<tool_call>{"name": "f", "argu',
        '<tool_call>["f"]</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
    ],
)
def test_hermes_text_without_a_readable_call_is_content(text):
    assert get_tool_call_parser("qwen").parse(text) == (text, [])


def test_hermes_forced_prefix_and_rendered_calls():
    parser = get_tool_call_parser("hermes")
    assert parser.forced_prefix("auto") == "" and parser.forced_prefix("required") == "<tool_call>\n"
    named = parser.forced_prefix({"type": "function", "function": {"name": "calc"}})
    assert named == '<tool_call>\n{"name": "calc", "arguments": {'
    call = {"id": "c", "type": "function", "function": {"name": "calc", "arguments": '{"e": "1+1"}'}}
    assert (
        parser.render_calls([call])
        == '<tool_call>\n{"name": "calc", "arguments": {"e": "1+1"}}\n</tool_call>'
    )


def test_llama3_json_whole_reply_calls_only():
    parser = get_tool_call_parser("llama3_json")
    content, calls = parser.parse(
        '<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}'
    )
    assert content is None and _calls(calls) == [("f", {"x": 1}), ("g", {})]
    text = 'The call is {"name": "f", "parameters": {}}'
    assert parser.parse(text) == (text, [])
    assert parser.parse('{"name": "f", "parameters": {}} and more') == (
        '{"name": "f", "parameters": {}} and more',
        [],
    )
    assert (
        parser.forced_prefix({"type": "function", "function": {"name": "f"}})
        == '{"name": "f", "parameters": {'
    )


def test_unknown_parser_names_the_registered_ones():
    with pytest.raises(ValueError, match="hermes, llama3_json, qwen"):
        get_tool_call_parser("mistral")


def test_canonical_ignores_ids_and_json_spacing_but_not_content():
    ours = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": '{"x": 1, "y": 2}'}}],
    }
    theirs = {
        "role": "assistant",
        "content": "",
        "refusal": None,
        "tool_calls": [
            {"id": "b", "type": "function", "function": {"name": "f", "arguments": '{"y":2,"x":1}'}}
        ],
    }
    assert canonical(ours) == canonical(theirs)
    assert canonical(
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ) == ("user", "ab", ())
    assert canonical({"role": "assistant", "content": "x"}) != canonical(
        {"role": "assistant", "content": "x "}
    )


def test_template_messages_name_tool_results_and_write_calls_for_templates_without_tools():
    messages = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    native = template_messages(messages)
    assert native[0]["tool_calls"] == [{"type": "function", "function": {"name": "calc", "arguments": {}}}]
    assert native[1] == {"role": "tool", "content": "5", "name": "calc", "tool_call_id": "c1"}
    written = template_messages(messages, get_tool_call_parser("hermes").render_calls)
    assert written[0] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "calc", "arguments": {}}\n</tool_call>',
    }


def test_stop_strings_cut_the_returned_text_at_the_first():
    assert cut_at_stop("abcXdefY", ("Y", "X")) == ("abc", True)
    assert cut_at_stop("abc", ("Z",)) == ("abc", False)


def test_responses_input_becomes_chat_messages():
    body = {
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "2+3?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me."}]},
            {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "5"},
        ],
    }
    assert responses_messages(body) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": "Let me.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]


class _CountingGenerator:
    def __init__(self):
        self.calls = []

    def generate(self, prompt_ids, params, batch_size):
        self.calls.append((len(prompt_ids), params.seed))
        return GenerationOutput(
            [[p[0] + 1] for p in prompt_ids], [[-1.0] for _ in prompt_ids], [False] * len(prompt_ids)
        )


def test_queue_batches_the_requests_of_every_running_session():
    """Four sessions running: their four requests go to the generator as one call (the wait is long,
    the batch goes as soon as all four are pending); each gets its own row back; seeds differ by batch."""
    generator = _CountingGenerator()
    queue = GenerationQueue(generator, batch_size=8, wait_s=30.0, expected=lambda: 4)
    results = {}

    def ask(i):
        results[i] = queue.generate([10 * i], SamplingParams(seed=7))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    queue.close()
    assert generator.calls == [(4, 7)]  # turn_seed(7, 0) == 7: the first batch keeps the run's seed
    assert results == {i: ([10 * i + 1], [-1.0], False) for i in range(4)}


def _staggered_requests(queue: GenerationQueue, count: int, gap_s: float) -> None:
    """`count` requests from as many threads, started `gap_s` apart; waits for every answer."""
    threads = [
        threading.Thread(target=queue.generate, args=([10 * i], SamplingParams(seed=7))) for i in range(count)
    ]
    for t in threads:
        t.start()
        threading.Event().wait(gap_s)
    for t in threads:
        t.join(timeout=30)
    queue.close()


def test_queue_waits_while_requests_keep_arriving():
    """Five sessions running, four requests arriving 0.3 s apart (over 0.9 s, longer than the 0.6 s quiet
    gap, each gap shorter): one batch of four, after the last arrival stayed alone for 0.6 s. A wait
    counted from the first arrival would have gone at 0.6 s with two or three."""
    generator = _CountingGenerator()
    queue = GenerationQueue(generator, batch_size=8, wait_s=0.6, max_wait_s=30.0, expected=lambda: 5)
    _staggered_requests(queue, 4, gap_s=0.3)
    assert generator.calls == [(4, 7)]


def test_queue_goes_at_max_wait_although_requests_keep_arriving():
    """Requests 1 s apart never leave a 5 s quiet gap, so the cap decides: the first batch goes 0.3 s
    after the first request, alone (the second one's 0.7 s later is slack for a loaded machine); the
    others follow in later batches."""
    generator = _CountingGenerator()
    queue = GenerationQueue(generator, batch_size=8, wait_s=5.0, max_wait_s=0.3, expected=lambda: 9)
    _staggered_requests(queue, 3, gap_s=1.0)
    assert generator.calls[0][0] == 1
    assert sum(rows for rows, _ in generator.calls) == 3


class _ThreadRecordingGenerator(_CountingGenerator):
    def generate(self, prompt_ids, params, batch_size):
        self.threads = [*getattr(self, "threads", []), threading.current_thread()]
        return super().generate(prompt_ids, params, batch_size)


def test_serve_generates_in_the_calling_thread_until_closed():
    """A queue made with thread=False is served by its caller: the generator runs in the caller's
    thread (agent rollouts serve from the rollout's thread, where torch's intra-op threads are
    effective), and `serve` returns when the last session closes the queue."""
    generator = _ThreadRecordingGenerator()
    queue = GenerationQueue(generator, batch_size=8, wait_s=5.0, expected=lambda: 3, thread=False)
    results = {}

    def ask(i):
        results[i] = queue.generate([10 * i], SamplingParams(seed=7))
        if len(results) == 3:
            queue.close()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    queue.serve(deadline=time.monotonic() + 30)
    for t in threads:
        t.join(timeout=10)
    assert generator.calls == [(3, 7)] and generator.threads == [threading.current_thread()]
    assert results == {i: ([10 * i + 1], [-1.0], False) for i in range(3)}


def test_serve_stops_at_its_deadline_and_fails_what_is_pending():
    generator = _CountingGenerator()
    queue = GenerationQueue(generator, batch_size=8, thread=False)
    queue.serve(deadline=time.monotonic() + 0.2)  # nobody asked: returns at the deadline
    with pytest.raises(RuntimeError, match="closed"):
        queue.generate([1], SamplingParams())
    assert generator.calls == []
