"""The calculator workload of the endpoint's equality tests and its overhead benchmark, in one place.

`CALCULATOR_KWARGS` is the calculator environment they share (a worked example, at most 2 tool
calls), and `replay_calculator_agent` an agent function (`environment.agent.function`) that plays
that environment's own episode through the endpoint with the `openai` client: the environment's
first messages and tool schemas, its tool registry for the calls (read as the in-process rollout
reads them, `parse_tool_calls`: a malformed call the endpoint leaves in the content is a failed call,
answered with its error), until a reply without a call or past the tool budget, at most `MAX_TURNS`
requests. So an
agent rollout of it and the in-process rollout of the environment play the same episode
(tests/functional/test_agent_rollouts.py; benchmarks/endpoint_overhead.py times the two).

Needs the `openai` package (the `agents` extra); imported only when the agent runs.
"""

from __future__ import annotations

from typing import Any

CALCULATOR_KWARGS: dict[str, Any] = {
    "max_tool_calls": 2,
    "examples": [
        {
            "role": "user",
            "content": "What is 12 * 34?\nYou can use the calculator tool. Give your final answer as a number in \\boxed{}.",
        },
        {
            "role": "assistant",
            "content": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>',
        },
        {"role": "tool", "name": "calculator", "content": "408"},
        {"role": "assistant", "content": "The answer is \\boxed{408}."},
    ],
}
"""The calculator environment of the equality tests and the benchmark: a worked example, 2 tool calls."""

MAX_TURNS = 3
"""Requests of one replayed episode at most (the tests' and the benchmark's `max_turns`)."""

MAX_TOKENS = 48
"""`max_tokens` of each request (the tests' and the benchmark's `max_new_tokens`)."""


def replay_calculator_agent(base_url: str, session_id: str, task: dict[str, Any]) -> None:
    """Play the calculator environment's episode of `task` through the endpoint at `base_url`. A
    request the endpoint refuses (the episode is over its limits) ends the episode."""
    import openai

    from posttrain.environments.calculator import CalculatorEnvironment
    from posttrain.environments.tools import parse_tool_calls

    env = CalculatorEnvironment(**CALCULATOR_KWARGS)
    [start] = env.reset([task], [0])
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    messages = [dict(m) for m in start.messages]
    used = 0
    for _ in range(MAX_TURNS):
        try:
            reply = client.chat.completions.create(
                model="m", messages=messages, tools=start.tools, max_tokens=MAX_TOKENS
            )
        except openai.BadRequestError:
            return
        message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        # read as the environment reads a reply: the endpoint's tool_calls, else a <tool_call> block the
        # endpoint could not parse (left in the content), which the environment answers with an error
        calls = parse_tool_calls(message)
        used += len(calls)
        if not calls or used > env.max_tool_calls:
            return
        messages.extend(env.tools.call(call).message() for call in calls)
