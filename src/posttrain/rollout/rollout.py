"""Rollouts: each task's episode started once, repeated G times under a group id, generated, stepped.

An episode starts from the environment's `reset(tasks, seeds)` (a game board) or, without one,
from the task's own messages (`task_start`). A trajectory is one token sequence: the prompt (the
chat template over the first messages and the environment's tools), then for each turn the
generated tokens exactly as generated (loss mask 1, with their generation logprobs) and, if the
environment answers, its observation's tokens from the chat template (loss mask 0;
`posttrain.data.tokenize.observation_ids`: the generated tokens are never re-rendered). An
observation longer than `max_observation_tokens` is cut in the middle; an episode that would
exceed `max_seq_len` ends truncated. The episode's reward is the sum of its turns' rewards.

The trajectory and the functions that grow it live in `posttrain.data.trajectory`, the episode's start
and step in `posttrain.rollout.episode`; this module runs the turns and collates the results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from posttrain.data.batching import TokenBatch
from posttrain.data.tokenize import Message
from posttrain.data.trajectory import EpisodeLimits, Trajectory, record_turn, split_contexts
from posttrain.environments.interface import EnvStepResult
from posttrain.environments.tools import prompt_ids_of, tools_for_template
from posttrain.errors import UserError
from posttrain.generation.interface import Generates
from posttrain.generation.sampling import SamplingParams, turn_seed
from posttrain.logging.progress import Phase, phase
from posttrain.logging.timer import Timer
from posttrain.rollout.continuous import run_continuous
from posttrain.rollout.episode import apply_step, new_trajectories, start_episodes


class Steps(Protocol):
    def step(self, message_logs: list[list[Message]], metadata: list[dict]) -> EnvStepResult: ...

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]: ...


@dataclass
class Rollouts:
    trajectories: list[Trajectory]
    env_metrics: dict[str, float]

    @property
    def rewards(self) -> torch.Tensor:
        return torch.tensor([t.reward for t in self.trajectories], dtype=torch.float32)

    @property
    def group_ids(self) -> torch.Tensor:
        return torch.tensor([t.group_id for t in self.trajectories], dtype=torch.long)

    @property
    def truncated(self) -> torch.Tensor:
        return torch.tensor([t.truncated for t in self.trajectories], dtype=torch.bool)

    @property
    def scored(self) -> torch.Tensor:
        return torch.tensor([t.scored for t in self.trajectories], dtype=torch.bool)

    @property
    def response_lengths(self) -> torch.Tensor:
        return torch.tensor([t.response_length for t in self.trajectories], dtype=torch.float32)

    def select(self, keep: list[int]) -> Rollouts:
        return Rollouts([self.trajectories[i] for i in keep], self.env_metrics)

    def reward_components(self) -> tuple[list[str], torch.Tensor]:
        """(names, [N, K] float64): the named reward parts of every episode (GDPO), the names sorted
        over all episodes; a part an episode lacks counts 0 (an episode cut before the turn that
        names them). Holds for every scored episode: its reward is the sum of its parts, else
        ValueError (a turn paid a reward that no component names)."""
        names = sorted({name for t in self.trajectories for name in t.reward_components})
        for i, t in enumerate(self.trajectories):
            total = sum(t.reward_components.values())
            if t.scored and names and not math.isclose(t.reward, total, rel_tol=1e-5, abs_tol=1e-6):
                raise ValueError(
                    f"episode {i} has reward {t.reward} but its reward components "
                    f"{t.reward_components} sum to {total}: a turn paid a reward no component names"
                )
        rows = [[t.reward_components.get(name, 0.0) for name in names] for t in self.trajectories]
        return names, torch.tensor(rows, dtype=torch.float64).reshape(len(self.trajectories), len(names))


@dataclass
class RLBatch(TokenBatch):
    """TokenBatch plus advantages [B] and logprobs [B, T] of the generator, π_old and the reference;
    policy_versions [B] long: the policy version that generated each row (-1: unknown); rewards [B]:
    the environment's reward of each row, before scaling and shaping (VAPO's positive examples)."""

    advantages: torch.Tensor | None = None
    generation_logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    reference_logprobs: torch.Tensor | None = None
    policy_versions: torch.Tensor | None = None
    rewards: torch.Tensor | None = None


def generate_turn(
    generator: Generates, active: list[Trajectory], params: SamplingParams, batch_size: int
) -> list[tuple[list[int], list[float], bool, list[int]]]:
    """One turn's (token ids, logprobs, truncated, versions per token: partial rollouts, else [])
    per active trajectory, in order. Trajectories with their own stop strings are generated apart
    from the others (one call per set)."""
    by_stops: dict[tuple[str, ...], list[int]] = {}
    for i, t in enumerate(active):
        by_stops.setdefault(t.stop_strings, []).append(i)
    results: list[Any] = [None] * len(active)
    for stops, indices in by_stops.items():
        p = (
            params
            if not stops
            else SamplingParams(**{**params.__dict__, "stop_strings": params.stop_strings + stops})
        )
        out = generator.generate([active[i].input_ids for i in indices], p, batch_size)
        versions = out.versions or [[] for _ in indices]
        rows = zip(indices, out.token_ids, out.logprobs, out.truncated, versions, strict=True)
        for i, ids, lps, truncated, row_versions in rows:
            results[i] = (ids, lps, truncated, row_versions)
    return results


def run_rollouts(
    tasks: list[dict[str, Any]],
    *,
    generations_per_prompt: int,
    generator: Generates,
    environment: Steps,
    tokenizer: Any,
    params: SamplingParams,
    batch_size: int,
    max_turns: int,
    max_seq_len: int,
    max_observation_tokens: int | None = None,
    first_group_id: int = 0,
    timer: Timer | None = None,
    turn_barrier: bool = True,
    progress: str | None = None,
    max_episode_tokens: int | None = None,
) -> Rollouts:
    """Episodes for `tasks` (G each); `progress`: the description of a bar of finished episodes
    shown on a terminal (`posttrain.logging.progress`), None for none. It advances as episodes end
    (`apply_step` reports each, in this process or a worker), or with one turn as replies end (the
    sampler reports them); vLLM's batch call advances it when the call returns.

    With `turn_barrier` (and always for one turn) they go turn by turn: every active episode
    generates, then every one is stepped by the environment. Without it each episode's next turn
    starts as soon as its observation is ready, in a continuously batched decode on each worker
    (`posttrain.rollout.continuous`: posttrain's HF sampler, or a vLLM engine request by request;
    not an FSDP2-sharded HF policy: the caller keeps the barrier for that). Environment time then
    counts in `timing/generation`. `max_episode_tokens`: the episode token budget, generated tokens
    over all turns (an episode that reaches it ends truncated); None: max_turns × max_new_tokens.
    """
    timer = timer or Timer()
    limits = EpisodeLimits(max_turns, max_seq_len, max_observation_tokens, max_episode_tokens)
    seeds = [first_group_id + i for i in range(len(tasks))]
    with timer("rewards"):
        starts = [tools_for_template(tokenizer, s) for s in start_episodes(environment, tasks, seeds)]
    prompts = [prompt_ids_of(tokenizer, s) for s in starts]
    too_long = [len(p) for p in prompts if len(p) >= max_seq_len]
    if too_long:
        raise ValueError(
            f"an episode's prompt has {max(too_long)} tokens, at least policy.max_seq_len ({max_seq_len}); "
            "raise policy.max_seq_len or shorten the prompt"
        )
    trajectories = new_trajectories(
        starts,
        prompts,
        generations_per_prompt=generations_per_prompt,
        first_group_id=first_group_id,
        tokenizer=tokenizer,
    )
    counts = "reply" if max_turns == 1 else "episode"  # one turn: an episode ends with its reply
    shown = phase(progress, total=len(trajectories), counts=counts) if progress else None
    with shown or contextlib.nullcontext(Phase()) as bar:
        if not turn_barrier and max_turns > 1:
            with timer("generation"):
                trajectories, results = run_continuous(
                    generator, trajectories, environment, params, batch_size, limits
                )
        else:
            results = turn_by_turn(
                trajectories, generator, environment, tokenizer, params, batch_size, limits, timer, bar
            )
        bar.update(completed=len(trajectories))
    metrics = environment.batch_metrics(EnvStepResult.concat(results)) if results else {}
    return Rollouts(trajectories, {**metrics, **episode_metrics(trajectories)})


def turn_by_turn(
    trajectories: list[Trajectory],
    generator: Generates,
    environment: Steps,
    tokenizer: Any,
    params: SamplingParams,
    batch_size: int,
    limits: EpisodeLimits,
    timer: Timer,
    progress: Phase | None = None,
) -> list[EnvStepResult]:
    """The turn-synchronous loop: all active episodes generate a turn, then all are stepped;
    `progress` counts the finished episodes after each turn."""
    results: list[EnvStepResult] = []
    for turn in range(limits.max_turns):
        active = [t for t in trajectories if not t.done]
        if not active:
            break
        turn_params = (
            params if params.seed is None else dataclasses.replace(params, seed=turn_seed(params.seed, turn))
        )
        with timer("generation"):
            generated = generate_turn(generator, active, turn_params, batch_size)
        turn_ids = [
            record_turn(
                t, ids, lps, truncated, tokenizer, limits.max_seq_len, versions, limits.max_episode_tokens
            )
            for t, (ids, lps, truncated, versions) in zip(active, generated, strict=True)
        ]
        with timer("rewards"):
            result = environment.step([t.messages for t in active], [t.metadata for t in active])
        results.append(result)
        for j, t in enumerate(active):
            apply_step(t, result, j, turn_ids[j], tokenizer, limits)
        if progress is not None:
            progress.update(completed=sum(t.done for t in trajectories))
    return results


def episode_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """How episodes went: turns, how they ended, who wrote their tokens, reward per turn (of the
    scored episodes only: an unscored episode's reward 0 is no reward)."""
    n = max(len(trajectories), 1)
    turns = [t.num_turns for t in trajectories]
    turn_rewards = [r for t in trajectories if t.scored for r in t.turn_rewards]
    return {
        "episode/turns_mean": sum(turns) / n,
        "episode/turns_max": float(max(turns, default=0)),
        "episode/done_rate": sum(t.stop_reason == "done" for t in trajectories) / n,
        "episode/max_turns_rate": sum(t.stop_reason == "max_turns" for t in trajectories) / n,
        "episode/truncated_rate": sum(t.stop_reason == "truncated" for t in trajectories) / n,
        "episode/generated_tokens_mean": sum(t.response_length for t in trajectories) / n,
        "episode/environment_tokens_mean": sum(t.observation_tokens for t in trajectories) / n,
        "episode/reward_per_turn": sum(turn_rewards) / max(len(turn_rewards), 1),
        "episode/unscored_rate": sum(not t.scored for t in trajectories) / n,
    }


def context_rows(trajectories: list[Trajectory]) -> tuple[list[Trajectory], torch.Tensor]:
    """(rows, episode_of [R] long): one row per token sequence of each episode (`split_contexts`:
    several for an episode whose environment restarted the conversation, else the episode itself) and
    the index of each row's episode; rows = trajectories and episode_of = 0..N-1 when none restarted."""
    rows: list[Trajectory] = []
    episode_of: list[int] = []
    for i, t in enumerate(trajectories):
        these = split_contexts(t)
        rows += these
        episode_of += [i] * len(these)
    return rows, torch.tensor(episode_of, dtype=torch.long)


def build_rl_batch(trajectories: list[Trajectory], advantages: torch.Tensor, pad_id: int) -> RLBatch:
    """Right-padded tensors; `loss_mask` marks generated tokens, position 0 never counts. Each
    trajectory must be one token sequence (an episode of several: `context_rows` first)."""
    if any(t.contexts for t in trajectories):
        raise UserError(
            "an episode here is several token sequences (its environment restarted the conversation, "
            "new_context): only GRPO trains on such episodes"
        )
    length = max(len(t.input_ids) for t in trajectories)
    n = len(trajectories)
    input_ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, length), dtype=torch.long)
    loss_mask = torch.zeros((n, length), dtype=torch.float32)
    gen_lp = torch.zeros((n, length), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        k = len(t.input_ids)
        input_ids[i, :k] = torch.tensor(t.input_ids)
        attention_mask[i, :k] = 1
        if t.scored:  # an episode the environment could not score is left out of the loss
            loss_mask[i, :k] = torch.tensor(t.loss_mask, dtype=torch.float32)
        gen_lp[i, :k] = torch.tensor(t.generation_logprobs, dtype=torch.float32)
    loss_mask[:, 0] = 0.0
    versions = torch.tensor([-1 if t.policy_version is None else t.policy_version for t in trajectories])
    return RLBatch(
        input_ids,
        attention_mask,
        loss_mask,
        advantages=advantages,
        generation_logprobs=gen_lp,
        policy_versions=versions,
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
    )


def flagged_turn_tokens(
    trajectories: list[Trajectory], shape: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, T] bool, [B, T] bool): the positions of the generated tokens of every turn whose assistant
    message the environment flagged as an invalid tool call, resp. malformed thinking (row b is
    trajectory b, positions as in `build_rl_batch`); a turn the environment has not stepped is unflagged."""
    invalid = torch.zeros(shape, dtype=torch.bool)
    malformed = torch.zeros(shape, dtype=torch.bool)
    for b, t in enumerate(trajectories):
        flags = zip(t.turn_spans, t.turn_invalid_tool_call, t.turn_malformed_thinking, strict=False)
        for (start, end), bad_call, bad_thinking in flags:
            invalid[b, start:end] = bad_call
            malformed[b, start:end] = bad_thinking
    return invalid, malformed


def transcript(t: Trajectory) -> dict[str, Any]:
    """One episode for reading (samples.jsonl, eval transcripts): the prompt (the last message before
    the episode's first reply, worked examples in the prompt skipped), the last reply, and for several
    turns the conversation from the first reply on, with each turn's reward."""
    first_reply = t.num_prompt_messages or next(
        (i for i, m in enumerate(t.messages) if m.get("role") == "assistant"), len(t.messages)
    )
    prompt = t.messages[first_reply - 1]["content"] if first_reply else ""
    row: dict[str, Any] = {
        "prompt": prompt,
        "completion": t.messages[-1]["content"] if first_reply < len(t.messages) else "",
        "answer": t.metadata.get("answer"),
        "reward": t.reward,
        "truncated": t.truncated,
    }
    if t.num_turns > 1:
        row.update(turns=t.num_turns, turn_rewards=t.turn_rewards, messages=t.messages[first_reply:])
    if not t.scored:
        row["scored"] = False
    return row
