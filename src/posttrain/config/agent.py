"""`environment.agent`: agent rollouts, where a user's agent drives each episode through the
OpenAI-compatible endpoint (`posttrain.rollout.agent`, docs/agents.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from posttrain.config.lookups import installed_lookups


class AgentConfig(BaseModel):
    """Which agent runs the episodes, where its reward comes from, and how the endpoint serves it."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    function: str | None = Field(
        None,
        description="The agent as a Python function `module:function` or `path/to/file.py:function`, called "
        "as function(base_url, session_id, task) in a thread per episode; it may return the reward (a number).",
    )
    command: list[str] | None = Field(
        None,
        description="The agent as a program: the command, run once per episode with `--base-url URL "
        "--session-id ID --task JSON` appended and OPENAI_BASE_URL / OPENAI_API_KEY set (a stock OpenAI "
        "client needs no arguments); it may POST its reward to /sessions/{id}/reward. Exit status not 0: "
        "the episode is unscored.",
    )
    reward: Literal["environment", "agent"] = Field(
        "environment",
        description="environment: the environment (`environment.name`) scores the final transcript "
        "(its step on the episode's messages); agent: the number the agent function returns or POSTs to "
        "/sessions/{id}/reward (an episode without one is unscored, never 0).",
    )
    concurrency: int | None = Field(
        None, gt=0, description="Agents running at once; null: every episode of a rollout at once."
    )
    timeout_s: float = Field(600.0, gt=0, description="An agent still running after this is unscored.")
    tool_parser: str = Field(
        "hermes",
        description="How tool calls are read from generated text: hermes (also qwen; SmolLM2, Qwen2.5/3) or "
        "llama3_json (`posttrain.endpoint.parsers`).",
    )
    stop_at_tool_call: bool = Field(
        True,
        description="End a reply at the parser's call close (hermes: `</tool_call>`) when tools are offered.",
    )
    request_sampling: bool = Field(
        False,
        description="Let a request's temperature / top_p apply; false: every request samples from the run's "
        "generation settings, the distribution the policy loss assumes.",
    )
    batch_wait_s: float = Field(
        0.02,
        ge=0,
        description="How long the endpoint waits for more requests before generating a batch (it goes at once "
        "when every running agent has a request pending).",
    )
    host: str = Field("127.0.0.1", description="Where the endpoint listens.")
    port: int = Field(0, ge=0, description="Its port; 0: a free one per rollout.")

    @model_validator(mode="after")
    def _one_agent(self) -> AgentConfig:
        """Exactly one of function and command; a registered tool-call parser (`Lookups.tool_parsers`)."""
        if (self.function is None) == (self.command is None):
            raise ValueError(
                "environment.agent needs exactly one of function (module:function) and command (a program)"
            )
        lookups = installed_lookups()
        parsers = sorted(lookups.tool_parsers()) if lookups is not None else [self.tool_parser]
        if self.tool_parser not in parsers:
            raise ValueError(f"environment.agent.tool_parser {self.tool_parser!r} is not one of {parsers}")
        return self
