"""Agent rollouts: a user's agent (a Python function or a program) plays each episode through the
OpenAI-compatible endpoint over the run's generator; the trajectory is what the endpoint recorded.

    endpoint = the run's generator behind /sessions/{id}/v1/chat/completions (loopback, a free port)
    for each task, G sessions (one per sample, same group id)
    every agent runs at once (up to `concurrency`): agent(base_url, session_id, task)
    each session's trajectory: the tokens the endpoint recorded (`EpisodeRecorder`)
    reward: the environment's step on the final transcript (one batched call), or the agent's own

A task is the dataset row as is (for the calculator, {"a": 347, "b": 58}); the environment's `reset`
(when it has one) gives the metadata its verdict needs (the answer), which the agent never sees.
An episode whose agent failed (raised, exited with a status other than 0, timed out), whose client
edited the conversation (`HistoryEdited`), that made no request, or whose agent gave no reward when
`reward: agent`, is unscored (`scored=False`: out of the loss, the group baseline and the reward
metrics), never rewarded 0. GRPO groups, dynamic sampling, validation and asynchronous GRPO call it as
they call `run_rollouts`: it takes the same arguments and returns `Rollouts`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.config.rollout import AgentConfig
from posttrain.data.trajectory import EpisodeLimits, Trajectory
from posttrain.endpoint.app import AgentEndpoint, Session
from posttrain.endpoint.batching import GenerationQueue
from posttrain.endpoint.parsers import get_tool_call_parser
from posttrain.endpoint.recorder import EpisodeRecorder
from posttrain.endpoint.server import EndpointServer
from posttrain.environments.interface import EnvStepResult
from posttrain.environments.tools import template_supports_tools
from posttrain.generation.interface import Generates
from posttrain.generation.sampling import SamplingParams
from posttrain.logging.timer import Timer
from posttrain.rollout.rollout import Rollouts, Steps, episode_metrics

AgentFunction = Callable[[str, str, dict[str, Any]], Any]


@dataclass
class AgentOutcome:
    """How one agent run ended: the reward it returned (None: none) or its error (None: it finished)."""

    reward: float | None = None
    error: str | None = None


def load_agent_function(spec: str) -> AgentFunction:
    """The function `module:function` or `path/to/file.py:function` names; ValueError when it does not resolve."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ValueError(
            f"an agent function is `module:function` or `path/to/file.py:function`, got {spec!r}"
        )
    if target.endswith(".py"):
        path = Path(target)
        module_spec = importlib.util.spec_from_file_location(f"posttrain_agent_{path.stem}", path)
        if module_spec is None or not path.is_file():
            raise ValueError(f"agent file {target} does not exist")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    else:
        module = importlib.import_module(target)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{spec}: {name} is not a function of {target}")
    return fn


def run_agent_program(
    command: list[str], base_url: str, session_id: str, task: dict[str, Any], timeout_s: float
) -> AgentOutcome:
    """Run the agent program once: `command --base-url URL --session-id ID --task JSON`, with
    OPENAI_BASE_URL / OPENAI_API_KEY set; an exit status other than 0 (or the timeout) is an error."""
    env = {
        **os.environ,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "posttrain",
        "POSTTRAIN_SESSION_ID": session_id,
    }
    args = [*command, "--base-url", base_url, "--session-id", session_id, "--task", json.dumps(task)]
    try:
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return AgentOutcome(error=f"the agent program ran past {timeout_s} s")
    if done.returncode != 0:
        return AgentOutcome(error=f"the agent program exited with {done.returncode}: {done.stderr[-500:]}")
    return AgentOutcome()


def run_agent_function(
    fn: AgentFunction, base_url: str, session_id: str, task: dict[str, Any]
) -> AgentOutcome:
    """Call the agent function; its exception is the episode's error, a number it returns its reward."""
    try:
        value = fn(base_url, session_id, task)
    except Exception as e:  # one agent's failure leaves its episode unscored; the others go on
        return AgentOutcome(error=f"{type(e).__name__}: {e}"[:500])
    if value is None:
        return AgentOutcome()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return AgentOutcome(error=f"the agent returned {type(value).__name__}, not a number or None")
    return AgentOutcome(reward=float(value))


def task_metadata(environment: Any, tasks: list[dict[str, Any]], seeds: list[int]) -> list[dict[str, Any]]:
    """Per task, what the verifier needs: the environment's `reset` metadata, else the task's fields."""
    reset = getattr(environment, "reset", None)
    if reset is None:
        return [{k: v for k, v in task.items() if k != "messages"} for task in tasks]
    return [start.metadata for start in reset(tasks, seeds)]


class AgentRun:
    """One rollout's endpoint, sessions and agents (`run_agent_rollouts` runs it)."""

    def __init__(
        self,
        agent: AgentConfig,
        generator: Generates,
        tokenizer: Any,
        params: SamplingParams,
        batch_size: int,
    ):
        self.agent, self.tokenizer = agent, tokenizer
        self.remaining, self.workers = 0, 1  # agents not yet finished; at most this many at once
        self._lock = threading.Lock()
        self.queue = GenerationQueue(
            generator,
            batch_size=batch_size,
            wait_s=agent.batch_wait_s,
            max_wait_s=agent.batch_max_wait_s,
            expected=lambda: min(self.remaining, self.workers),
            thread=False,  # play_all serves it from the rollout's own thread
        )
        self.endpoint = AgentEndpoint(
            tokenizer,
            self.queue,
            params,
            request_sampling=agent.request_sampling,
            stop_at_tool_call=agent.stop_at_tool_call,
        )
        self.parser = get_tool_call_parser(agent.tool_parser)
        self.render_calls = None if template_supports_tools(tokenizer) else self.parser.render_calls
        self.function = load_agent_function(agent.function) if agent.function else None

    def open(self, session_id: str, limits: EpisodeLimits, group_id: int, metadata: dict[str, Any]) -> None:
        recorder = EpisodeRecorder(self.tokenizer, limits, group_id, metadata, render_calls=self.render_calls)
        self.endpoint.open_session(session_id, Session(recorder, self.parser))

    def play(self, base_url: str, session_id: str, task: dict[str, Any]) -> AgentOutcome:
        """One agent run; the batcher expects one fewer request once it is over."""
        try:
            if self.function is not None:
                return run_agent_function(self.function, base_url, session_id, task)
            assert self.agent.command is not None
            return run_agent_program(self.agent.command, base_url, session_id, task, self.agent.timeout_s)
        finally:
            with self._lock:
                self.remaining -= 1
                last = self.remaining == 0
            if last:
                self.queue.close()  # play_all's `serve` returns
            else:
                self.queue.wake()

    def play_all(self, server: EndpointServer, jobs: list[tuple[str, dict[str, Any]]]) -> list[AgentOutcome]:
        """Every (session id, task) played, up to `concurrency` at once. An agent still running when the
        rollout's time is up (`timeout_s` per round of `concurrency` agents) is an error; its thread is
        left behind and its session's requests fail from then on (404)."""
        if not jobs:
            return []
        workers = max(min(len(jobs), self.agent.concurrency or len(jobs)), 1)
        self.remaining, self.workers = len(jobs), workers
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agent")
        futures = [pool.submit(self.play, server.base_url(sid), sid, task) for sid, task in jobs]
        deadline = time.monotonic() + self.agent.timeout_s * math.ceil(len(jobs) / workers)
        self.queue.serve(deadline)  # the agents' requests, generated in this thread until the last agent ends
        wait(futures, timeout=max(deadline - time.monotonic(), 0.0))
        pool.shutdown(wait=False, cancel_futures=True)
        late = AgentOutcome(
            error=f"the agent ran past environment.agent.timeout_s ({self.agent.timeout_s} s)"
        )
        return [f.result() if f.done() and not f.cancelled() else late for f in futures]

    def close(self) -> None:
        self.queue.close()


def finish(session: Session, outcome: AgentOutcome, tokenizer: Any, group_id: int) -> Trajectory:
    """The session's trajectory with what went wrong in `info`; unscored when the agent failed, the
    history was edited or no request was made (then the sequence is one pad token, masked)."""
    t = session.recorder.trajectory
    if t is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        t = Trajectory([pad], [0], [0.0], [], dict(session.recorder.metadata), group_id, scored=False)
        t.info["agent_error"] = outcome.error or "the agent made no request"
    if outcome.error is not None:
        t.scored, t.info["agent_error"] = False, outcome.error
    if session.history_edited is not None:
        t.scored, t.info["history_edited"] = False, session.history_edited
    t.done = True
    t.stop_reason = t.stop_reason or "done"
    t.info["agent_requests"] = session.requests
    return t


def assign_rewards(
    trajectories: list[Trajectory],
    sessions: list[Session],
    outcomes: list[AgentOutcome],
    agent: AgentConfig,
    environment: Steps,
) -> list[EnvStepResult]:
    """Rewards of the scored episodes: the environment's verdict on each final transcript (one `step`
    over them all), or the agent's (returned, else posted; none: unscored). The reward is the last
    turn's; the earlier turns earn 0."""
    live = [i for i, t in enumerate(trajectories) if t.scored]
    results: list[EnvStepResult] = []
    if agent.reward == "environment" and live:
        result = environment.step(
            [trajectories[i].messages for i in live], [trajectories[i].metadata for i in live]
        )
        results.append(result)
        for j, i in enumerate(live):
            t = trajectories[i]
            _pay(t, result.rewards[j], result.info[j] if result.info else {})
            t.scored = result.scored[j]
            t.reward_components = {k: float(v) for k, v in result.reward_components[j].items()}
        return results
    for i in live:
        reward = outcomes[i].reward if outcomes[i].reward is not None else sessions[i].posted_reward
        if reward is None:
            trajectories[i].scored, trajectories[i].info["agent_error"] = False, "the agent gave no reward"
            continue
        _pay(trajectories[i], reward, sessions[i].posted_info)
    return results


def _pay(t: Trajectory, reward: float, info: dict[str, Any]) -> None:
    t.reward = float(reward)
    t.turn_rewards = [0.0] * max(t.num_turns - 1, 0) + [float(reward)]
    t.info.update(info)


def agent_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """agent/error_rate, agent/history_edited_rate, agent/requests_mean over the rollout's episodes."""
    n = max(len(trajectories), 1)
    return {
        "agent/error_rate": sum("agent_error" in t.info for t in trajectories) / n,
        "agent/history_edited_rate": sum("history_edited" in t.info for t in trajectories) / n,
        "agent/requests_mean": sum(t.info.get("agent_requests", 0) for t in trajectories) / n,
    }


def run_agent_rollouts(
    tasks: list[dict[str, Any]],
    *,
    agent: AgentConfig,
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
    max_episode_tokens: int | None = None,
    **_: Any,
) -> Rollouts:
    """G agent episodes per task through the endpoint (see the module docstring); the arguments are
    `run_rollouts`'s (its `turn_barrier` and `progress` do not apply), plus `agent`."""
    timer = timer or Timer()
    limits = EpisodeLimits(max_turns, max_seq_len, max_observation_tokens, max_episode_tokens)
    seeds = [first_group_id + i for i in range(len(tasks))]
    with timer("rewards"):
        metadata = task_metadata(environment, tasks, seeds)
    run = AgentRun(agent, generator, tokenizer, params, batch_size)
    run_id = uuid.uuid4().hex[:8]
    jobs, groups = [], []
    for i, task in enumerate(tasks):
        for k in range(generations_per_prompt):
            sid = f"{run_id}-{first_group_id + i}-{k}"
            run.open(sid, limits, first_group_id + i, metadata[i])
            jobs.append((sid, task))
            groups.append(first_group_id + i)
    try:
        with EndpointServer(run.endpoint, agent.host, agent.port) as server, timer("generation"):
            outcomes = run.play_all(server, jobs)
    finally:
        run.close()
    sessions = [run.endpoint.close_session(sid) for sid, _ in jobs]
    trajectories = [finish(s, o, tokenizer, g) for s, o, g in zip(sessions, outcomes, groups, strict=True)]
    with timer("rewards"):
        results = assign_rewards(trajectories, sessions, outcomes, agent, environment)
    metrics = environment.batch_metrics(EnvStepResult.concat(results)) if results else {}
    batching = {
        "agent/generator_calls": float(run.queue.batches),
        "agent/rows_per_call": run.queue.rows / max(run.queue.batches, 1),
    }
    return Rollouts(
        trajectories, {**metrics, **episode_metrics(trajectories), **agent_metrics(trajectories), **batching}
    )
