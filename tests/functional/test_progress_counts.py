"""The phase bars of rollouts advance while the phase runs (issue #30, console), not only at its end:
with one turn as the sampler's replies end (EOS or a stop string, decode step by decode step), with
several turns and no turn barrier as episodes end, and from Ray workers through the counter actor.

Real loops: a tiny random model sampled by posttrain's HF sampler (stop strings a random model's
text soon contains, so rows end on different decode steps), drawn on a forced-terminal console."""

from __future__ import annotations

import functools
import io
import time

import pytest
from rich.console import Console

from posttrain.environments.interface import EnvStepResult
from posttrain.generation.sampling import SamplingParams
from posttrain.logging import progress
from posttrain.rollout import rollout
from posttrain.rollout.rollout import run_rollouts

TASKS = [{"messages": [{"role": "user", "content": f"Say something about {w}."}], "turns": n} for w, n in
         (("cats", 1), ("rain", 3), ("maps", 2))]  # fmt: skip
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12, stop_strings=("x", "z", "q"), seed=5)


@pytest.fixture(scope="module")
def generator(tiny_model_dir, tokenizer):
    from posttrain.generation.text_generation import LocalGenerator

    return LocalGenerator(str(tiny_model_dir), tokenizer, backend="hf", device="cpu")


@pytest.fixture
def terminal(monkeypatch):
    """run_rollouts draws its bar on a forced terminal (pytest's stdout is not one)."""
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    monkeypatch.setattr(rollout, "phase", functools.partial(progress.phase, console=console))
    return console


def bar_count() -> float:
    """The shown bar's count now (from any thread)."""
    [task] = progress._active[-1][1].bar.tasks
    return task.completed


class EndsAfter:
    """Episodes end after the task's "turns" turns (reward 1); records the bar's count at every call."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def step(self, message_logs, metadata) -> EnvStepResult:
        self.seen.append(bar_count())
        turns = [sum(m["role"] == "assistant" for m in log) for log in message_logs]
        done = [n >= meta["turns"] for n, meta in zip(turns, metadata, strict=True)]
        observations = [None if d else {"role": "user", "content": "More."} for d in done]
        n = len(message_logs)
        return EnvStepResult([1.0] * n, observations, done, list(metadata), [{}] * n)

    def reset(self, tasks, seeds):
        from posttrain.environments.interface import EpisodeStart

        return [EpisodeStart(messages=t["messages"], metadata={"turns": t["turns"]}) for t in tasks]

    def batch_metrics(self, results) -> dict[str, float]:
        return {}


def test_one_turn_bar_advances_as_replies_end_during_generation(generator, tokenizer, terminal):
    seen: list[float] = []
    hook = generator.model.register_forward_hook(lambda *_: seen.append(bar_count()))
    try:
        out = run_rollouts(
            TASKS, generations_per_prompt=4, generator=generator, environment=EndsAfter(),
            tokenizer=tokenizer, params=PARAMS, batch_size=12, max_turns=1, max_seq_len=200,
            progress="generation",
        )  # fmt: skip
    finally:
        hook.remove()
    lengths = sorted(t.response_length for t in out.trajectories)
    assert lengths[0] < lengths[-1], lengths  # rows ended on different decode steps
    # forward k (k >= 1) runs after decode step k - 1: the replies that had ended by then are counted
    ended_before = [sum(n <= k for n in lengths) for k in range(len(seen))]
    assert seen == ended_before[: len(seen)]
    assert 0 < max(seen) < len(lengths)  # the count moved while the batch was still decoding


def test_continuous_bar_advances_as_episodes_end(generator, tokenizer, terminal):
    env = EndsAfter()
    out = run_rollouts(
        TASKS, generations_per_prompt=2, generator=generator, environment=env, tokenizer=tokenizer,
        params=PARAMS, batch_size=6, max_turns=3, max_seq_len=300, turn_barrier=False,
        progress="generation",
    )  # fmt: skip
    assert [t.num_turns for t in out.trajectories] == [1, 1, 3, 3, 2, 2]
    # each call saw the episodes that had ended before it: counts rise during the phase, never fall
    assert env.seen == sorted(env.seen) and env.seen[0] == 0
    assert 0 < env.seen[-1] < len(out.trajectories)


def test_reports_advance_the_innermost_bar_of_their_kind():
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with progress.phase("generation", total=8, console=console, counts="reply") as outer:
        with progress.phase("episodes", total=4, console=console, counts="episode") as inner:
            progress.report("episode", 3)
            progress.report("reply", 5)  # not this bar's kind
        progress.report("reply", 2)
        assert (inner.bar.tasks[0].completed, outer.bar.tasks[0].completed) == (3, 2)
    progress.report("reply", 1)  # no bar: nothing to advance, no error


@pytest.mark.ray
def test_ray_worker_reports_reach_the_controllers_bar(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    def episodes_end(n: int) -> None:
        from posttrain.logging.progress import report

        for _ in range(n):
            report("episode")

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    for n in (5, 3):  # a later phase too: the counter outlives the phase that made it
        with progress.phase("generation", total=n, console=console, counts="episode") as bar:
            ray.get(episodes_end.remote(n))
            deadline = time.monotonic() + 30
            while bar.bar.tasks[0].completed < n and time.monotonic() < deadline:
                time.sleep(0.05)
            assert bar.bar.tasks[0].completed == n
