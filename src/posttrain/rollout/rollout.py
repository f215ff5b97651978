"""Rollouts: each problem repeated G times under a group id, generated, scored, possibly over several turns.

A trajectory is one token sequence: the prompt, then for each turn the generated tokens exactly
as generated (loss mask 1, with their generation logprobs) and, if the environment answers, its
observation's tokens from the chat template (loss mask 0; `posttrain.data.tokenize.observation_ids`:
the generated tokens are never re-rendered). Rewards of all turns are summed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from posttrain.data.batching import TokenBatch
from posttrain.data.math import Problem
from posttrain.data.tokenize import Message, observation_ids
from posttrain.environments.interface import EnvStepResult
from posttrain.logging.timer import Timer
from posttrain.models.generation import GenerationOutput, SamplingParams


class Generates(Protocol):
    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, batch_size: int
    ) -> GenerationOutput: ...


class Steps(Protocol):
    def step(self, message_logs: list[list[Message]], metadata: list[dict]) -> EnvStepResult: ...

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]: ...


@dataclass
class Trajectory:
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

    @property
    def response_length(self) -> int:
        return sum(self.loss_mask)


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
    def response_lengths(self) -> torch.Tensor:
        return torch.tensor([t.response_length for t in self.trajectories], dtype=torch.float32)

    def select(self, keep: list[int]) -> Rollouts:
        return Rollouts([self.trajectories[i] for i in keep], self.env_metrics)


@dataclass
class RLBatch(TokenBatch):
    """TokenBatch plus advantages [B] and logprobs [B, T] of the generator, π_old and the reference."""

    advantages: torch.Tensor | None = None
    generation_logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    reference_logprobs: torch.Tensor | None = None


def run_rollouts(
    problems: list[Problem],
    *,
    generations_per_prompt: int,
    generator: Generates,
    environment: Steps,
    tokenizer: Any,
    params: SamplingParams,
    batch_size: int,
    max_turns: int,
    max_seq_len: int,
    first_group_id: int = 0,
    timer: Timer | None = None,
) -> Rollouts:
    timer = timer or Timer()
    trajectories = [
        Trajectory(
            input_ids=list(p.prompt_ids),
            loss_mask=[0] * len(p.prompt_ids),
            generation_logprobs=[0.0] * len(p.prompt_ids),
            messages=list(p.messages),
            metadata={"answer": p.answer},
            group_id=first_group_id + i,
        )
        for i, p in enumerate(problems)
        for _ in range(generations_per_prompt)
    ]
    results: list[EnvStepResult] = []
    for turn in range(max_turns):
        active = [t for t in trajectories if not t.done]
        if not active:
            break
        with timer("generation"):
            out = generator.generate([t.input_ids for t in active], params, batch_size)
        turn_ids = []  # this turn's generated tokens per active trajectory, as generated
        for t, ids, lps, truncated in zip(active, out.token_ids, out.logprobs, out.truncated, strict=True):
            room = max_seq_len - len(t.input_ids)
            t.truncated = truncated or len(ids) > room
            ids, lps = ids[:room], lps[:room]
            t.input_ids += ids
            t.loss_mask += [1] * len(ids)
            t.generation_logprobs += lps
            turn_ids.append(ids)
            t.messages.append(
                {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}
            )
        with timer("rewards"):
            result = environment.step([t.messages for t in active], [t.metadata for t in active])
        results.append(result)
        last_turn = turn == max_turns - 1
        for j, t in enumerate(active):
            t.reward += result.rewards[j]
            t.metadata = result.metadata[j]
            t.info = result.info[j] if result.info else {}
            observation = result.observations[j]
            t.done = result.done[j] or t.truncated or last_turn or observation is None
            if not t.done:
                extra = observation_ids(tokenizer, turn_ids[j], observation)
                t.messages.append(observation)
                if len(t.input_ids) + len(extra) >= max_seq_len:
                    t.done, t.truncated = True, True
                    continue
                t.input_ids += extra
                t.loss_mask += [0] * len(extra)
                t.generation_logprobs += [0.0] * len(extra)
    metrics = environment.batch_metrics(EnvStepResult.concat(results)) if results else {}
    return Rollouts(trajectories, metrics)


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
        loss_mask[i, :k] = torch.tensor(t.loss_mask, dtype=torch.float32)
        gen_lp[i, :k] = torch.tensor(t.generation_logprobs, dtype=torch.float32)
    loss_mask[:, 0] = 0.0
    return RLBatch(input_ids, attention_mask, loss_mask, advantages=advantages, generation_logprobs=gen_lp)
