"""The wire format shared by posttrain's OpenEnv server (`posttrain.serve`) and its `openenv` client
(`posttrain.environments.openenv_env`); it imports nothing of either, nor OpenEnv.

OpenEnv's WebSocket route (`/ws`) carries, per session, `{"type": "reset", "data": {...}}` and
`{"type": "step", "data": <action>}` and answers `{"type": "observation", "data": {"observation":
{...}, "reward": float | None, "done": bool}}` or `{"type": "error", "data": {"message", "code"}}`.
OpenEnv's serializer drops `Observation.metadata`, so posttrain's extensions travel as ordinary
observation fields, which any OpenEnv client receives and may ignore (backwards compatible):

- `messages`: the environment's next chat messages (the episode's first messages after reset);
- `scored`: False when the environment could not score the episode (left out of the loss);
- `info`: the environment's per-turn diagnostics;
- `tools`, `stop_strings`, `response_prefix`: the episode's tool schemas and generation controls;
- `reward_components`: the named parts of the turn's reward ({} for none; the reward is their sum), for
  `advantage.estimator=gdpo`;
- `invalid_tool_call`, `malformed_thinking`: the turn's flags (`EnvStepResult`), for
  `advantage.invalid_tool_call_advantage` / `malformed_thinking_advantage`;
- `new_context`: the messages replace the conversation (`EnvStepResult.new_context`): the next turn's
  prompt is them alone, e.g. the sliding puzzle with `history: false`.

A client that does not know a field ignores it; posttrain's client reads a field a server does not send
as its default ({}, False), so either side may be older (backwards compatible).

An action is `{"content": str, "tool_calls": [...] | None}`: the assistant message of the turn.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

SCORED_FIELD = "scored"
MESSAGES_FIELD = "messages"
VERIFY_ROUTE = "/posttrain/verify"
"""posttrain's extra HTTP route: score a finished transcript without a session (see `openenv_server`)."""

DIGEST_EXCLUDED = frozenset({"info"})
"""Observation fields left out of an observation's digest: diagnostics, not what the policy sees."""


def observation_digest(payload: dict[str, Any]) -> str:
    """sha256 of a step/reset payload's observation (without `DIGEST_EXCLUDED` fields), reward and done,
    as canonical JSON. Equal payloads give equal digests; the client compares digests to check that a
    replayed episode reached the same state."""
    observation = {k: v for k, v in (payload.get("observation") or {}).items() if k not in DIGEST_EXCLUDED}
    canonical = json.dumps(
        {"observation": observation, "reward": payload.get("reward"), "done": bool(payload.get("done"))},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
