"""Single-turn math GRPO is bit-identical before and after tasks and episodes replaced math problems.

The pre-refactor path (math problems built from dataset rows, then one generate call and one
environment step) is kept here, frozen, as the reference: the same rows and the same seeded
generator must give the same token ids, masks, generation logprobs and rewards through today's
`build_tasks` + `run_rollouts`, and so the same batch and the same training step.
"""

from __future__ import annotations

import functools

import torch

from posttrain.algorithms.rl_loss import grpo_loss
from posttrain.config.common import (
    DatasetConfig,
    OptimizerConfig,
    PolicyConfig,
    ReasoningGymConfig,
    SchedulerConfig,
)
from posttrain.data.math import read_answer
from posttrain.data.sources import load_rows
from posttrain.data.tasks import build_tasks, tasks_within
from posttrain.data.tokenize import encode_prompt
from posttrain.data.trajectory import Trajectory
from posttrain.distributed.actor import ActorPolicy
from posttrain.environments.group import EnvironmentGroup
from posttrain.generation.sampling import SamplingParams
from posttrain.rollout.rollout import build_rl_batch, run_rollouts

SYSTEM = "Put the final answer in \\boxed{}."
DATA = DatasetConfig(
    reasoning_gym=ReasoningGymConfig(
        size=6,
        seed=3,
        kwargs={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]},
    )
)


def old_problems(tokenizer, max_prompt_len: int) -> list[tuple[list[dict], list[int], str]]:
    """The former `build_math_problems`: (messages, prompt ids, answer) per row."""
    problems = []
    for row in load_rows(DATA):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row.data["prompt"]}]
        ids = encode_prompt(tokenizer, messages)
        if len(ids) <= max_prompt_len:
            problems.append((messages, ids, read_answer(row, DATA)))
    return problems


def old_rollouts(problems, g, generator, environment, tokenizer, params, max_seq_len) -> list[Trajectory]:
    """The former single-turn `run_rollouts`: one generate call, one environment step."""
    trajectories = [
        Trajectory(
            list(ids), [0] * len(ids), [0.0] * len(ids), list(messages), {"answer": answer}, group_id=i
        )
        for i, (messages, ids, answer) in enumerate(problems)
        for _ in range(g)
    ]
    out = generator.generate([t.input_ids for t in trajectories], params, 64)
    for t, ids, lps, truncated in zip(trajectories, out.token_ids, out.logprobs, out.truncated, strict=True):
        room = max_seq_len - len(t.input_ids)
        t.truncated = truncated or len(ids) > room
        ids, lps = ids[:room], lps[:room]
        t.input_ids += ids
        t.loss_mask += [1] * len(ids)
        t.generation_logprobs += lps
        t.messages.append({"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)})
    result = environment.step([t.messages for t in trajectories], [t.metadata for t in trajectories])
    for t, reward in zip(trajectories, result.rewards, strict=True):
        t.reward = reward
    return trajectories


def _policy(model_dir) -> ActorPolicy:
    cfg = PolicyConfig(
        train_micro_batch_size=4,
        optimizer=OptimizerConfig(lr=1e-2, max_grad_norm=None),
        scheduler=SchedulerConfig(name="constant"),
        logprob_temperature=1.0,
    )
    return ActorPolicy(cfg, model_path=str(model_dir), total_steps=1, tokenizer_path=str(model_dir))


def test_single_turn_math_rollouts_and_step_are_bit_identical(tiny_model_dir, tokenizer):
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    max_seq_len, g = 96, 4
    with EnvironmentGroup("math", {}, backend="local") as env:
        old = old_rollouts(
            old_problems(tokenizer, max_seq_len - 12),
            g,
            _policy(tiny_model_dir),
            env,
            tokenizer,
            params,
            max_seq_len,
        )
        tasks = tasks_within(build_tasks(DATA, system_prompt=SYSTEM), tokenizer, max_seq_len - 12)
        new = run_rollouts(
            tasks,
            generations_per_prompt=g,
            generator=_policy(tiny_model_dir),
            environment=env,
            tokenizer=tokenizer,
            params=params,
            batch_size=64,
            max_turns=1,
            max_seq_len=max_seq_len,
        ).trajectories
    assert len(old) == len(new) == 24
    for a, b in zip(old, new, strict=True):
        assert (a.input_ids, a.loss_mask, a.generation_logprobs) == (
            b.input_ids,
            b.loss_mask,
            b.generation_logprobs,
        )
        assert (a.reward, a.truncated, a.group_id, a.messages) == (
            b.reward,
            b.truncated,
            b.group_id,
            b.messages,
        )
    advantages = torch.linspace(-1, 1, len(old))
    steps = []
    for trajectories in (old, new):
        batch = build_rl_batch(trajectories, advantages, tokenizer.pad_token_id)
        tokens = float(batch.loss_mask.sum())
        policy = _policy(tiny_model_dir)
        out = policy.train(batch, functools.partial(grpo_loss, token_normalizer=tokens), tokens)
        steps.append((out.grad_norm, out.loss_metrics["pg_loss"], policy.state_dict_cpu()))
    (norm_a, loss_a, params_a), (norm_b, loss_b, params_b) = steps
    assert norm_a == norm_b and loss_a == loss_b
    assert all(torch.equal(params_a[k], params_b[k]) for k in params_a)
