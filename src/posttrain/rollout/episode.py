"""An episode's start and its environment steps, the pieces every rollout loop shares (turn by turn in
`posttrain.rollout.rollout`, without a turn barrier in `posttrain.rollout.continuous`): the episode
starts (`start_episodes`: the environment's `reset`, or the task's own messages), G trajectories per
start under one group id (`new_trajectories`), and one step's result taken into a trajectory
(`apply_step`: reward, state, and the end of the episode or the observation's tokens)."""

from __future__ import annotations

import copy
from typing import Any

from posttrain.data.tokenize import encode_prompt, observation_ids
from posttrain.data.trajectory import (
    EpisodeLimits,
    Trajectory,
    append_observation,
    cut_observation,
    episode_room,
    restart_context,
)
from posttrain.environments.interface import EnvStepResult, EpisodeStart, observation_messages, task_start
from posttrain.logging.progress import report


def start_episodes(environment: Any, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
    """The environment's `reset` when it has one, else each task's own messages (`task_start`)."""
    reset = getattr(environment, "reset", None)
    if reset is None:
        return [task_start(task) for task in tasks]
    starts = reset(tasks, seeds)
    if len(starts) != len(tasks):
        raise ValueError(f"environment reset returned {len(starts)} episode starts for {len(tasks)} tasks")
    return starts


def new_trajectories(
    starts: list[EpisodeStart],
    prompts: list[list[int]],
    *,
    generations_per_prompt: int,
    first_group_id: int,
    tokenizer: Any = None,
) -> list[Trajectory]:
    """G trajectories per episode start, each with its own copy of the start's state; the prompt
    ends with the start's response prefix (if any), so generation continues after it."""
    out = []
    for i, (start, prompt) in enumerate(zip(starts, prompts, strict=True)):
        prefix = (
            list(tokenizer(start.response_prefix, add_special_tokens=False)["input_ids"])
            if start.response_prefix
            else []
        )
        ids = list(prompt) + prefix
        for _ in range(generations_per_prompt):
            out.append(
                Trajectory(
                    input_ids=list(ids),
                    loss_mask=[0] * len(ids),
                    generation_logprobs=[0.0] * len(ids),
                    messages=copy.deepcopy(start.messages),
                    metadata=copy.deepcopy(start.metadata),
                    group_id=first_group_id + i,
                    stop_strings=tuple(start.stop_strings),
                    response_prefix=start.response_prefix,
                    prefix_ids=prefix,
                    num_prompt_messages=len(start.messages),
                )
            )
    return out


def apply_step(
    t: Trajectory, result: EnvStepResult, j: int, turn_ids: list[int], tokenizer: Any, limits: EpisodeLimits
) -> None:
    """Take sample j of an environment step into trajectory t: reward, state, and either the end of
    the episode (done, truncated, or out of turns) or the observation's tokens for the next turn (or, where
    the environment restarts the conversation, `restart_context`: the observation alone as its prompt)."""
    t.reward += result.rewards[j]
    t.turn_rewards.append(result.rewards[j])
    for name, value in result.reward_components[j].items():
        t.reward_components[name] = t.reward_components.get(name, 0.0) + float(value)
    t.turn_invalid_tool_call.append(bool(result.invalid_tool_call[j]))
    t.turn_malformed_thinking.append(bool(result.malformed_thinking[j]))
    t.metadata = result.metadata[j]
    t.info = result.info[j] if result.info else {}
    t.scored = t.scored and result.scored[j]
    t.stop_strings = result.stop_strings[j] if result.stop_strings[j] is not None else t.stop_strings
    if result.response_prefixes[j] is not None:
        t.response_prefix = result.response_prefixes[j]
        t.prefix_ids = (
            list(tokenizer(t.response_prefix, add_special_tokens=False)["input_ids"])
            if t.response_prefix
            else []
        )
    observation = result.observations[j]
    env_done = result.done[j] or observation is None
    full = len(t.input_ids) >= limits.max_seq_len or episode_room(t, limits.max_episode_tokens) == 0
    t.done = env_done or full or t.num_turns >= limits.max_turns
    if t.done:
        t.stop_reason = "done" if env_done else "truncated" if full else "max_turns"
        report("episode")  # wherever the episode ran (a worker too), the console's bar advances
        return
    messages = cut_observation(tokenizer, observation_messages(observation), limits.max_observation_tokens)
    if result.new_context[j]:  # the observation alone is the next turn's prompt
        restart_context(t, encode_prompt(tokenizer, messages) + t.prefix_ids, messages, limits.max_seq_len)
        return
    extra = observation_ids(tokenizer, turn_ids, messages) + t.prefix_ids
    if append_observation(t, extra, messages, limits.max_seq_len):
        t.truncated = False  # the turn cut at max_new_tokens is over; the episode goes on
