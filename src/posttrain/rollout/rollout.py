"""Rollouts: each task's episode started once, repeated G times under a group id, generated, stepped.

An episode starts from the environment's `reset(tasks, seeds)` (a game board) or, without one,
from the task's own messages (`task_start`). A trajectory is one token sequence: the prompt (the
chat template over the first messages and the environment's tools), then for each turn the
generated tokens exactly as generated (loss mask 1, with their generation logprobs) and, if the
environment answers, its observation's tokens from the chat template (loss mask 0;
`posttrain.data.tokenize.observation_ids`: the generated tokens are never re-rendered). An
observation longer than `max_observation_tokens` is cut in the middle; an episode that would
exceed `max_seq_len` ends truncated. The episode's reward is the sum of its turns' rewards.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from posttrain.data.batching import TokenBatch
from posttrain.data.tokenize import Message, encode_prompt, observation_ids
from posttrain.environments.interface import EnvStepResult, EpisodeStart, observation_messages, task_start
from posttrain.environments.tools import template_supports_tools, with_tools_in_system_prompt
from posttrain.generation.sampling import GenerationOutput, SamplingParams
from posttrain.logging.progress import Phase, phase, report
from posttrain.logging.timer import Timer


class Generates(Protocol):
    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, batch_size: int
    ) -> GenerationOutput: ...


class Steps(Protocol):
    def step(self, message_logs: list[list[Message]], metadata: list[dict]) -> EnvStepResult: ...

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]: ...


@dataclass
class Trajectory:
    """One episode as one token sequence, with who wrote each token and what each turn earned.

    input_ids / loss_mask / generation_logprobs: [T] each; loss_mask 1 on generated tokens.
    turn_spans: per turn, the [start, end) positions of its generated tokens in input_ids.
    turn_rewards: per turn, the environment's reward; `reward` is their sum.
    reward_components: the episode's named reward parts (`EnvStepResult.reward_components`), each
        summed over its turns; {} when the environment names none.
    turn_invalid_tool_call / turn_malformed_thinking: per turn, the environment's flags of its
        assistant message (`EnvStepResult.invalid_tool_call` / `malformed_thinking`).
    observation_tokens: tokens the environment's observations (and their template) added.
    scored: False when the environment could not score the episode: left out of the loss.
    stop_reason: "done" (the environment ended it), "max_turns", or "truncated" (max_new_tokens
        or max_seq_len reached).
    policy_version: the version of the policy weights that generated it (the number of policy updates
        before them); None when unknown (then it is never treated as exactly on-policy). With partial
        rollouts, the oldest version that sampled any of its tokens.
    token_versions: partial rollouts: the version of the weights that sampled each generated token
        (in order of the loss_mask-1 positions); empty otherwise.
    """

    input_ids: list[int]
    loss_mask: list[int]
    generation_logprobs: list[float]
    messages: list[Message]
    metadata: dict[str, Any]
    group_id: int
    reward: float = 0.0
    truncated: bool = False
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    reward_components: dict[str, float] = field(default_factory=dict)
    turn_invalid_tool_call: list[bool] = field(default_factory=list)
    turn_malformed_thinking: list[bool] = field(default_factory=list)
    observation_tokens: int = 0
    scored: bool = True
    stop_reason: str = ""
    stop_strings: tuple[str, ...] = ()
    response_prefix: str = ""
    prefix_ids: list[int] = field(default_factory=list)
    num_prompt_messages: int = 0
    policy_version: int | None = None
    token_versions: list[int] = field(default_factory=list)

    @property
    def response_length(self) -> int:
        return sum(self.loss_mask)

    @property
    def num_turns(self) -> int:
        return len(self.turn_spans)


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


def start_episodes(environment: Any, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
    """The environment's `reset` when it has one, else each task's own messages (`task_start`)."""
    reset = getattr(environment, "reset", None)
    if reset is None:
        return [task_start(task) for task in tasks]
    starts = reset(tasks, seeds)
    if len(starts) != len(tasks):
        raise ValueError(f"environment reset returned {len(starts)} episode starts for {len(tasks)} tasks")
    return starts


def tools_for_template(tokenizer: Any, start: EpisodeStart) -> EpisodeStart:
    """The start as the chat template can show it: tools offered to a template that ignores `tools=`
    (SmolLM2's) are written into the system message instead (`with_tools_in_system_prompt`)."""
    if not start.tools or template_supports_tools(tokenizer):
        return start
    messages = with_tools_in_system_prompt(start.messages, start.tools)
    return dataclasses.replace(start, messages=messages, tools=None)


def prompt_ids_of(tokenizer: Any, start: EpisodeStart) -> list[int]:
    """The prompt's token ids: the first messages (and tools) under the chat template."""
    return encode_prompt(tokenizer, start.messages, tools=start.tools)


def _content_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _cut_marker(tokenizer: Any, cut: int, max_tokens: int) -> str:
    """The most telling marker of a cut that fits in `max_tokens` tokens: "[... n tokens cut ...]",
    "[...]", "…", or none."""
    for marker in (f"\n[... {cut} tokens cut ...]\n", "\n[...]\n", "…"):
        if len(_content_ids(tokenizer, marker)) <= max_tokens:
            return marker
    return ""


def cut_middle(tokenizer: Any, message: Message, max_tokens: int | None) -> Message:
    """`message` with its content cut to at most `max_tokens` tokens, the cut's marker included:
    the start and the end are kept around a marker ("[... n tokens cut ...]", shorter where that
    does not fit). Holds: the returned content encodes (no special tokens) to <= max_tokens ids."""
    if max_tokens is None:
        return message
    ids = _content_ids(tokenizer, message.get("content") or "")
    if len(ids) <= max_tokens:
        return message
    marker = _cut_marker(tokenizer, len(ids) - max_tokens, max_tokens)
    keep = max_tokens - len(_content_ids(tokenizer, marker))
    while True:  # decode + re-encode may merge tokens differently at the seams: shrink until it fits
        head, tail = ids[: keep // 2], ids[len(ids) - (keep - keep // 2) :] if keep else []
        marker = _cut_marker(tokenizer, len(ids) - keep, max_tokens) if marker else ""
        content = tokenizer.decode(head) + marker + tokenizer.decode(tail)
        if keep <= 0 or len(_content_ids(tokenizer, content)) <= max_tokens:
            return {**message, "content": content}
        keep -= 1


def cut_observation(tokenizer: Any, messages: list[Message], max_tokens: int | None) -> list[Message]:
    """An observation's messages with their contents cut (`cut_middle`) so that together they have
    at most `max_tokens` content tokens, markers included (the chat template's own tokens are not
    counted). Messages that fit in an even share of what the shorter ones leave are kept whole; the
    longer ones share the rest equally."""
    if max_tokens is None:
        return messages
    sizes = [len(_content_ids(tokenizer, m.get("content") or "")) for m in messages]
    if sum(sizes) <= max_tokens:
        return messages
    shares, left, open_ = dict.fromkeys(range(len(messages)), 0), max_tokens, len(messages)
    for i in sorted(range(len(messages)), key=lambda i: sizes[i]):
        shares[i] = min(sizes[i], left // open_)
        left, open_ = left - shares[i], open_ - 1
    return [
        m if sizes[i] <= shares[i] else cut_middle(tokenizer, m, shares[i]) for i, m in enumerate(messages)
    ]


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


def append_generated(
    t: Trajectory,
    ids: list[int],
    lps: list[float],
    truncated: bool,
    max_seq_len: int,
    versions: list[int] | None = None,
    max_episode_tokens: int | None = None,
) -> list[int]:
    """Add one turn's generated tokens (cut at max_seq_len and at the episode token budget
    `max_episode_tokens`; `versions`: of the weights that sampled each, partial rollouts) and the
    assistant message; returns the ids kept."""
    room = min(max_seq_len - len(t.input_ids), episode_room(t, max_episode_tokens))
    t.truncated = truncated or len(ids) > room
    ids, lps = ids[:room], lps[:room]
    if versions:
        t.token_versions += versions[:room]
    t.turn_spans.append((len(t.input_ids), len(t.input_ids) + len(ids)))
    t.input_ids += ids
    t.loss_mask += [1] * len(ids)
    t.generation_logprobs += lps
    return ids


def append_observation(t: Trajectory, extra: list[int], observation: list[Message], max_seq_len: int) -> bool:
    """Add an observation's messages and tokens (loss mask 0); False (and the episode ends
    truncated) when they would leave no room for the next turn."""
    t.messages.extend(observation)
    if len(t.input_ids) + len(extra) >= max_seq_len:
        t.done, t.truncated, t.stop_reason = True, True, "truncated"
        return False
    t.input_ids += extra
    t.loss_mask += [0] * len(extra)
    t.generation_logprobs += [0.0] * len(extra)
    t.observation_tokens += len(extra)
    return True


def episode_room(t: Trajectory, max_episode_tokens: int | None) -> int:
    """How many more tokens t may generate under the episode token budget (unbounded: None)."""
    if max_episode_tokens is None:
        return sys.maxsize
    return max(max_episode_tokens - t.response_length, 0)


@dataclass(frozen=True)
class EpisodeLimits:
    """What bounds an episode: turns, the whole sequence's tokens, one observation's tokens, and the
    tokens generated over all its turns (the episode token budget; None: no bound beyond the turns)."""

    max_turns: int
    max_seq_len: int
    max_observation_tokens: int | None = None
    max_episode_tokens: int | None = None


def turn_seed(seed: int, turn: int) -> int:
    """The seed turn `turn` (from 0) of a rollout seeded with `seed` samples with: every turn has one of
    its own, the first turn's is the rollout's."""
    return seed + turn * 1_000_003


def record_turn(
    t: Trajectory,
    ids: list[int],
    lps: list[float],
    truncated: bool,
    tokenizer: Any,
    max_seq_len: int,
    versions: list[int] | None = None,
    max_episode_tokens: int | None = None,
) -> list[int]:
    """Append a generated turn (tokens as generated, cut at max_seq_len and the episode token budget)
    and its assistant message; returns the token ids kept."""
    ids = append_generated(t, ids, lps, truncated, max_seq_len, versions, max_episode_tokens)
    text = t.response_prefix + tokenizer.decode(ids, skip_special_tokens=True)
    t.messages.append({"role": "assistant", "content": text})
    return ids


def apply_step(
    t: Trajectory, result: EnvStepResult, j: int, turn_ids: list[int], tokenizer: Any, limits: EpisodeLimits
) -> None:
    """Take sample j of an environment step into trajectory t: reward, state, and either the end of
    the episode (done, truncated, or out of turns) or the observation's tokens for the next turn."""
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
    extra = observation_ids(tokenizer, turn_ids, messages) + t.prefix_ids
    if append_observation(t, extra, messages, limits.max_seq_len):
        t.truncated = False  # the turn cut at max_new_tokens is over; the episode goes on


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
            from posttrain.rollout.continuous import run_continuous

            with timer("generation"):
                trajectories, results = run_continuous(
                    generator, trajectories, environment, tokenizer, params, batch_size, limits
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


def build_rl_batch(trajectories: list[Trajectory], advantages: torch.Tensor, pad_id: int) -> RLBatch:
    """Right-padded tensors; `loss_mask` marks generated tokens, position 0 never counts."""
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
