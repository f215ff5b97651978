"""Environment calls never block the decoder (issue #34, item 1).

The continuous episode loops submit environment steps to threads and go on decoding the other
episodes. Every claim here is checked by the order of events, never by a clock: an environment
whose call for one episode returns only after the other episodes have finished cannot finish at
all if that call blocks the decoder (the gate's patience then runs out and the test fails).
Real loop, tiny random model (HF), or an engine double with the vLLM engine's interface.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from posttrain.environments.interface import EnvStepResult, EpisodeStart
from posttrain.generation.sampling import SamplingParams
from posttrain.rollout.rollout import run_rollouts

N = 4
PATIENCE_S = 20.0  # liveness only: a gate that is never opened gives up after this and the test fails


def _turns(log: list[dict]) -> int:
    return sum(m["role"] == "assistant" for m in log)


class TwoTurns:
    """Episodes of two turns (metadata "id"), reward 0.25 + 0.01 * reply length per turn; every call
    is recorded as the list of (id, turn) it stepped, and `returned` lists (id, turn) as they return."""

    def __init__(self, limit: int) -> None:
        self.max_concurrent_steps = limit
        self.lock = threading.Lock()
        self.calls: list[list[tuple[int, int]]] = []
        self.returned: list[tuple[int, int]] = []
        self.gave_up = False

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        return [
            EpisodeStart([{"role": "user", "content": f"Task {t['id']}: say something."}], {"id": t["id"]})
            for t in tasks
        ]

    def wait(self, stepped: list[tuple[int, int]]) -> None:
        """Hook: hold the call (nothing by default)."""

    def step(self, message_logs, metadata) -> EnvStepResult:
        stepped = [(m["id"], _turns(log)) for log, m in zip(message_logs, metadata, strict=True)]
        with self.lock:
            self.calls.append(stepped)
        self.wait(stepped)
        with self.lock:
            self.returned += stepped
        rewards = [0.25 + 0.01 * len(log[-1]["content"]) for log in message_logs]
        done = [turn >= 2 for _, turn in stepped]
        observations = [None if d else {"role": "user", "content": "Go on."} for d in done]
        return EnvStepResult(rewards, observations, done, [dict(m) for m in metadata])

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        return {}


class Gated(TwoTurns):
    """The call that steps episode `slow`'s first turn returns only once every other episode has
    returned its last turn."""

    def __init__(self, limit: int, slow: int | None) -> None:
        super().__init__(limit)
        self.slow, self.others_done = slow, threading.Event()

    def wait(self, stepped: list[tuple[int, int]]) -> None:
        if (self.slow, 1) in stepped:
            self.gave_up = not self.others_done.wait(PATIENCE_S)

    def step(self, message_logs, metadata) -> EnvStepResult:
        result = super().step(message_logs, metadata)
        with self.lock:
            ended = {i for i, turn in self.returned if turn == 2}
            if ended >= set(range(N)) - {self.slow}:
                self.others_done.set()
        return result


def _rollouts(generator, tokenizer, env, *, temperature: float = 0.0, n: int = N, batch_size: int = 1):
    return run_rollouts(
        [{"id": i} for i in range(n)],
        generations_per_prompt=1,
        generator=generator,
        environment=env,
        tokenizer=tokenizer,
        params=SamplingParams(temperature=temperature, max_new_tokens=4, seed=11),
        batch_size=batch_size,  # one row: each call steps one episode, the others queue for the row
        max_turns=2,
        max_seq_len=256,
        turn_barrier=False,
    )


@pytest.fixture(scope="module")
def generator(tiny_model_dir, tokenizer):
    from posttrain.generation.text_generation import LocalGenerator

    return LocalGenerator(str(tiny_model_dir), tokenizer, backend="hf", device="cpu")


def test_the_decoder_keeps_decoding_while_an_environment_call_waits(generator, tokenizer):
    env = Gated(limit=2, slow=0)
    rollouts = _rollouts(generator, tokenizer, env)
    assert not env.gave_up, "episode 0's call blocked the decoder: the others could not finish"
    slow_returned = env.returned.index((0, 1))
    for i in range(1, N):
        assert env.returned.index((i, 2)) < slow_returned  # every other episode ended first
    assert env.returned[-1] == (0, 2)
    assert [t.num_turns for t in rollouts.trajectories] == [2] * N
    assert [t.stop_reason for t in rollouts.trajectories] == ["done"] * N


class Crowd(TwoTurns):
    """Counts the calls in flight; each call waits until `fill` calls are in flight or the loop has
    nothing left to decode (it then waits for a call: `EnvironmentCalls.finished(block=True)`)."""

    def __init__(self, limit: int, fill: int, idle: threading.Event) -> None:
        super().__init__(limit)
        self.fill, self.idle = fill, idle
        self.in_flight = self.peak = 0

    def wait(self, stepped: list[tuple[int, int]]) -> None:
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        deadline = time.monotonic() + PATIENCE_S
        while not self.gave_up and self.in_flight < self.fill and not self.idle.is_set():
            if time.monotonic() > deadline:
                self.gave_up = True
            time.sleep(0.002)
        with self.lock:
            self.in_flight -= 1


@pytest.fixture
def idle(monkeypatch) -> threading.Event:
    """Set while the loop waits for a call (nothing to decode)."""
    from posttrain.rollout.env_calls import EnvironmentCalls

    event, real = threading.Event(), EnvironmentCalls.finished

    def finished(self, *, block: bool):
        if block and self.busy:
            event.set()
        try:
            return real(self, block=block)
        finally:
            event.clear()

    monkeypatch.setattr(EnvironmentCalls, "finished", finished)
    return event


class Held(TwoTurns):
    """The call that steps episode `slow`'s first turn (with whichever episodes ended on its decode
    step) returns only when the loop has nothing left to decode."""

    def __init__(self, limit: int, slow: int | None, idle: threading.Event) -> None:
        super().__init__(limit)
        self.slow, self.idle = slow, idle

    def wait(self, stepped: list[tuple[int, int]]) -> None:
        if (self.slow, 1) in stepped:
            self.gave_up = not self.idle.wait(PATIENCE_S)


def test_the_order_calls_return_in_does_not_change_the_tokens(generator, tokenizer, idle):
    """Temperature 1, two rows: each episode turn samples from its own random stream, so holding
    episode 0's (or 2's) first step back until nothing else can decode, which changes who shares the
    decode batch with whom and when, leaves every token, logprob (to fp32 rounding) and reward as in
    a run where no call waits."""
    runs, orders = {}, {}
    for slow in (None, 0, 2):
        env = Held(limit=2, slow=slow, idle=idle)
        runs[slow] = _rollouts(generator, tokenizer, env, temperature=1.0, batch_size=2).trajectories
        orders[slow] = env.returned
        assert not env.gave_up
    assert orders[0] != orders[None] and orders[2] != orders[None]  # the calls did return in other orders
    for slow in (0, 2):
        for a, b in zip(runs[None], runs[slow], strict=True):
            assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask
            assert a.turn_rewards == b.turn_rewards and a.messages == b.messages
            torch.testing.assert_close(
                torch.tensor(a.generation_logprobs), torch.tensor(b.generation_logprobs), rtol=0, atol=1e-5
            )


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_calls_in_flight_reach_the_bound_and_never_pass_it(generator, tokenizer, idle, limit):
    env = Crowd(limit, fill=limit, idle=idle)
    rollouts = _rollouts(generator, tokenizer, env, n=6)
    assert not env.gave_up
    assert env.peak == limit
    assert sorted(env.returned) == [(i, turn) for i in range(6) for turn in (1, 2)]  # each turn once
    assert [t.num_turns for t in rollouts.trajectories] == [2] * 6


def test_turns_that_end_at_the_bound_wait_and_go_in_one_call(generator, tokenizer, idle):
    # bound 1, every call held until the loop has nothing left to decode: while episode 0's first
    # call is held, the 5 others decode their first turns and wait; then they go in one call
    env = Crowd(1, fill=2, idle=idle)
    _rollouts(generator, tokenizer, env, n=6)
    assert not env.gave_up and env.peak == 1
    assert env.calls[0] == [(0, 1)]
    assert env.calls[1] == [(i, 1) for i in range(1, 6)]


class Engine:
    """The engine interface `engine_episode_loop` drives (vLLM's in production): the first request
    finishes after 1 engine step, every later one after 2, with the reply "ok" and EOS."""

    def __init__(self, tokenizer) -> None:
        self.reply = list(tokenizer("ok", add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
        self.left: dict[str, int] = {}
        self.steps = 0

    def submit(self, ids, params, seed) -> str:
        request = f"r{len(self.left)}"
        self.left[request] = 1 if not self.left else 2
        return request

    def has_unfinished(self) -> bool:
        return any(n > 0 for n in self.left.values())

    def step(self):
        self.steps += 1
        finished = [r for r, n in self.left.items() if n == 1]
        self.left = {r: n - 1 for r, n in self.left.items()}
        return [(r, None) for r in finished]

    def completion(self, out, stops):
        return list(self.reply), [-0.5] * len(self.reply), False

    def abort(self, requests) -> None:
        pass


def test_the_engine_loop_keeps_stepping_while_an_environment_call_waits(tokenizer):
    from posttrain.data.trajectory import EpisodeLimits
    from posttrain.environments.tools import prompt_ids_of
    from posttrain.rollout.continuous import engine_episode_loop
    from posttrain.rollout.episode import new_trajectories

    env = Gated(limit=2, slow=0)
    starts = env.reset([{"id": i} for i in range(N)], list(range(N)))
    trajectories = new_trajectories(
        starts, [prompt_ids_of(tokenizer, s) for s in starts], generations_per_prompt=1, first_group_id=0
    )
    engine_episode_loop(
        Engine(tokenizer), tokenizer, trajectories, env, SamplingParams(), EpisodeLimits(2, 256)
    )
    assert not env.gave_up
    assert all(env.returned.index((i, 2)) < env.returned.index((0, 1)) for i in range(1, N))
    assert [t.num_turns for t in trajectories] == [2] * N
