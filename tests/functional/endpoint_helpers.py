"""Helpers of the endpoint tests: a scripted generator, and an endpoint served on a free loopback port."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from posttrain.data.trajectory import EpisodeLimits
from posttrain.endpoint.app import AgentEndpoint, Session
from posttrain.endpoint.batching import GenerationQueue
from posttrain.endpoint.parsers import get_tool_call_parser
from posttrain.endpoint.recorder import EpisodeRecorder
from posttrain.endpoint.server import EndpointServer
from posttrain.environments.tools import template_supports_tools
from posttrain.generation.sampling import GenerationOutput, SamplingParams


class ScriptedGenerator:
    """Replies with the given texts in order (each tokenised, + EOS when `eos`), logprob -0.5 - 0.01 * i
    for the i-th token; records every call's prompts and params."""

    def __init__(self, tokenizer: Any, replies: list[str], eos: bool = True) -> None:
        self.tokenizer, self.replies, self.eos = tokenizer, list(replies), eos
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []

    def reply_ids(self, text: str) -> list[int]:
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return ids + [self.tokenizer.eos_token_id] if self.eos else ids

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, batch_size: int
    ) -> GenerationOutput:
        self.calls.append(([list(p) for p in prompt_ids], params))
        out = GenerationOutput()
        for _ in prompt_ids:
            ids = self.reply_ids(self.replies.pop(0))[: params.max_new_tokens]
            out.token_ids.append(ids)
            out.logprobs.append([-0.5 - 0.01 * i for i in range(len(ids))])
            out.truncated.append(False)
        return out


@contextlib.contextmanager
def serving(
    generator: Any,
    tokenizer: Any,
    *,
    sessions: tuple[str, ...] = ("s1",),
    params: SamplingParams | None = None,
    limits: EpisodeLimits | None = None,
    parser: str = "hermes",
    request_sampling: bool = True,
) -> Iterator[tuple[EndpointServer, AgentEndpoint]]:
    """An endpoint over `generator` with the given sessions open, on 127.0.0.1 and a free port; shut down after."""
    queue = GenerationQueue(generator, batch_size=8, wait_s=0.0)
    app = AgentEndpoint(
        tokenizer,
        queue,
        params or SamplingParams(temperature=0, max_new_tokens=64),
        request_sampling=request_sampling,
    )
    tool_parser = get_tool_call_parser(parser)
    render = None if template_supports_tools(tokenizer) else tool_parser.render_calls
    for sid in sessions:
        recorder = EpisodeRecorder(tokenizer, limits or EpisodeLimits(4, 512), render_calls=render)
        app.open_session(sid, Session(recorder, tool_parser))
    try:
        with EndpointServer(app) as server:
            yield server, app
    finally:
        queue.close()


def reward_agent(base_url: str, session_id: str, task: dict[str, Any]) -> float | None:
    """One request, then by task["mode"]: "return" 0.25, "post" 0.75 to /reward, "raise", "silent"
    (no reward), "edit" (a follow-up with the first message changed, then return 1.0), "none" (no
    request at all), "sleep" (8 s, then 1.0)."""
    import json
    import urllib.request

    import openai

    mode = task["mode"]
    if mode == "none":
        return None
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": f"Say {mode}."}]
    reply = client.chat.completions.create(model="m", messages=messages)
    if mode == "post":
        body = json.dumps({"reward": 0.75, "info": {"judge": "me"}}).encode()
        request = urllib.request.Request(f"{base_url}/reward", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(request).read()
        return None
    if mode == "raise":
        raise RuntimeError("the agent broke")
    if mode == "sleep":
        import time

        time.sleep(8)
        return 1.0
    if mode == "edit":
        messages = [
            {"role": "user", "content": "Say something else."},
            reply.choices[0].message.model_dump(exclude_none=True),
        ]
        with contextlib.suppress(openai.BadRequestError):
            client.chat.completions.create(
                model="m", messages=[*messages, {"role": "user", "content": "More."}]
            )
        return 1.0
    return 0.25 if mode == "return" else None
