"""Group-level environments under the continuous (no turn barrier) episode loop (issue #29, item 5).

The pairwise judge compares the samples of a group with each other, so it must get whole groups.
Episodes of a group end their turns on different decode steps; the loop steps a group only when all
its running episodes have ended their turn. Real loop, tiny random model sampled at temperature 1,
real pairwise judge (a rule-based backend) behind a local EnvironmentGroup.
"""

from __future__ import annotations

from collections import Counter

import pytest

from posttrain.environments.group import EnvironmentGroup
from posttrain.environments.interface import EnvStepResult
from posttrain.environments.judge import FunctionJudge, JudgeEnvironment
from posttrain.generation.sampling import SamplingParams
from posttrain.rollout.rollout import run_rollouts

G = 4
TASKS = [{"messages": [{"role": "user", "content": f"Say something about {w}."}]} for w in ("cats", "rain")]


@pytest.fixture(scope="module")
def generator(tiny_model_dir, tokenizer):
    from posttrain.generation.text_generation import LocalGenerator

    return LocalGenerator(str(tiny_model_dir), tokenizer, backend="hf", device="cpu")


def _rollouts(generator, tokenizer, environment, *, max_turns: int = 2, seed: int = 3):
    return run_rollouts(
        TASKS,
        generations_per_prompt=G,
        generator=generator,
        environment=environment,
        tokenizer=tokenizer,
        # stop strings a random model's text soon contains: turns end after a few tokens, at random
        params=SamplingParams(temperature=1.0, max_new_tokens=10, stop_strings=("x", "z", "q"), seed=seed),
        batch_size=3,  # fewer rows than episodes: later episodes join as others leave
        max_turns=max_turns,
        max_seq_len=400,
        turn_barrier=False,
    )


def test_pairwise_judge_scores_whole_groups_when_episodes_end_on_different_steps(generator, tokenizer):
    judge = EnvironmentGroup(
        JudgeEnvironment,
        {"mode": "pairwise", "backend": FunctionJudge(lambda _: "Winner: A")},
        backend="local",
    )
    assert judge.needs_whole_groups
    rollouts = _rollouts(generator, tokenizer, judge)
    lengths = [[t.response_length for t in rollouts.trajectories if t.group_id == g] for g in (0, 1)]
    assert any(len(set(ls)) > 1 for ls in lengths), lengths  # the group's episodes ended apart
    # every sample was compared with the G - 1 others, in both orders: 2 (G - 1) = 6 comparisons
    # (before, the samples that ended on one decode step were judged alone or in part of the group)
    assert rollouts.scored.tolist() == [True] * (G * len(TASKS))
    assert [t.info["judge_comparisons"] for t in rollouts.trajectories] == [2 * (G - 1)] * (G * len(TASKS))


class GroupProbe:
    """A group-level environment that records which samples each step call got, and goes on for one
    observation before ending the episode."""

    needs_whole_groups = True

    def __init__(self) -> None:
        self.calls: list[Counter] = []

    @staticmethod
    def group_key(log, meta):
        return log[0]["content"]

    def step(self, message_logs, metadata) -> EnvStepResult:
        self.calls.append(Counter(log[0]["content"] for log in message_logs))
        turns = [sum(m["role"] == "assistant" for m in log) for log in message_logs]
        observations = [None if n >= 2 else {"role": "user", "content": "More."} for n in turns]
        return EnvStepResult(
            [0.5] * len(turns),
            observations,
            [o is None for o in observations],
            list(metadata),
            [{}] * len(turns),
        )

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        return {}


def test_every_turn_of_a_group_level_environment_gets_whole_groups(generator, tokenizer):
    probe = GroupProbe()
    rollouts = _rollouts(generator, tokenizer, probe, max_turns=3)
    assert [t.num_turns for t in rollouts.trajectories] == [2] * (G * len(TASKS))
    assert probe.calls and all(set(call.values()) == {G} for call in probe.calls), probe.calls
    assert sum(sum(call.values()) for call in probe.calls) == 2 * G * len(TASKS)  # each turn stepped once


def test_an_environment_of_samples_is_stepped_as_turns_end(generator, tokenizer):
    # without needs_whole_groups the loop steps the rows that ended on each decode step at once
    probe = GroupProbe()
    probe.needs_whole_groups = False
    _rollouts(generator, tokenizer, probe, max_turns=3)
    assert any(set(call.values()) != {G} for call in probe.calls)


class StepEngine:
    """The engine interface `engine_episode_loop` drives (vLLM's in production): request i finishes
    after `1 + i % 3` engine steps with the reply "ok" and EOS, so a group's turns end apart."""

    def __init__(self, tokenizer) -> None:
        self.reply = list(tokenizer("ok", add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
        self.left: dict[str, int] = {}

    def submit(self, ids, params, seed) -> str:
        request = f"r{len(self.left)}"
        self.left[request] = 1 + len(self.left) % 3
        return request

    def has_unfinished(self) -> bool:
        return any(n > 0 for n in self.left.values())

    def step(self):
        for request in self.left:
            self.left[request] -= 1
        return [(request, None) for request, n in self.left.items() if n == 0]

    def completion(self, out, stops):
        return list(self.reply), [-0.5] * len(self.reply), False

    def abort(self, requests) -> None:
        pass


def test_the_engine_loop_steps_whole_groups_too(tokenizer):
    from posttrain.data.trajectory import EpisodeLimits
    from posttrain.environments.tools import prompt_ids_of
    from posttrain.rollout.continuous import engine_episode_loop
    from posttrain.rollout.episode import new_trajectories, start_episodes

    starts = start_episodes(GroupProbe(), TASKS, [0, 1])
    trajectories = new_trajectories(
        starts, [prompt_ids_of(tokenizer, s) for s in starts], generations_per_prompt=G, first_group_id=0
    )
    probe = GroupProbe()
    params = SamplingParams(max_new_tokens=5)
    engine_episode_loop(StepEngine(tokenizer), tokenizer, trajectories, probe, params, EpisodeLimits(3, 400))
    assert [t.num_turns for t in trajectories] == [2] * (G * len(TASKS))
    assert all(set(call.values()) == {G} for call in probe.calls), probe.calls
    probe = GroupProbe()
    probe.needs_whole_groups = False
    trajectories = new_trajectories(
        starts, [prompt_ids_of(tokenizer, s) for s in starts], generations_per_prompt=G, first_group_id=0
    )
    engine_episode_loop(StepEngine(tokenizer), tokenizer, trajectories, probe, params, EpisodeLimits(3, 400))
    assert any(set(call.values()) != {G} for call in probe.calls)  # without it: stepped as turns end
