"""The `reward_funcs` environment: TRL-shaped reward functions, their weighted sum, None = unscored."""

from __future__ import annotations

import pytest

from posttrain.config.loader import to_yaml
from posttrain.config.rl import GRPOConfig
from posttrain.environments import RewardFuncsEnvironment, make_environment

LOGS = [
    [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "3"},
    ],
    [{"role": "user", "content": "4+4?"}, {"role": "assistant", "content": "eight"}],
]
META = [{"answer": "5", "level": 1}, {"answer": "2"}, {"answer": "8", "level": 2}]


def exact(prompts, completions, answer, **kwargs):
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


def short(prompts, completions, **kwargs):
    return [None if len(c) > 3 else 1.0 / len(c) for c in completions]


def test_functions_get_prompts_completions_and_row_fields_as_columns():
    seen = {}

    def spy(prompts, completions, **fields):
        seen.update(prompts=prompts, completions=completions, fields=fields)
        return [0.0] * len(completions)

    RewardFuncsEnvironment([spy]).step(LOGS, META)
    assert seen["prompts"] == [log[:-1] for log in LOGS]
    assert seen["completions"] == ["5", "3", "eight"]
    assert seen["fields"] == {"answer": ["5", "2", "8"], "level": [1, None, 2]}


def test_weighted_sum_none_is_not_applicable_and_a_sample_nobody_scored_is_unscored():
    env = RewardFuncsEnvironment([exact, short], weights=[1.0, 0.5])
    result = env.step(LOGS, META)
    # exact: 1, 0, 0; short: 1/1, 1/1, None
    assert result.rewards == [1.0 + 0.5 * 1.0, 0.0 + 0.5 * 1.0, 0.0]
    assert result.scored == [True, True, True]
    assert env.batch_metrics(result) == {
        "env/reward_mean": (1.5 + 0.5 + 0.0) / 3,
        "env/reward/exact": 1 / 3,
        "env/reward/short": 1.0,
    }
    only_short = RewardFuncsEnvironment([short]).step(LOGS, META)
    assert only_short.scored == [True, True, False] and only_short.rewards[2] == 0.0
    assert RewardFuncsEnvironment([short]).batch_metrics(only_short)["env/reward_mean"] == 1.0


def test_a_failing_or_malformed_function_stops_the_run_naming_it():
    def broken(prompts, completions, **kw):
        raise KeyError("answer")

    with pytest.raises(RuntimeError, match="reward function 'broken' raised KeyError"):
        RewardFuncsEnvironment([broken]).step(LOGS, META)
    with pytest.raises(RuntimeError, match="returned 1 rewards for 3 completions"):
        RewardFuncsEnvironment([lambda prompts, completions, **kw: [1.0]]).step(LOGS, META)
    with pytest.raises(RuntimeError, match="returned nan"):
        RewardFuncsEnvironment([lambda prompts, completions, **kw: [float("nan")] * 3]).step(LOGS, META)
    with pytest.raises(ValueError, match="2 reward weights for 1 reward functions"):
        RewardFuncsEnvironment([exact], weights=[1, 2])


def test_import_strings_resolve_and_configs_record_callables_by_import_path():
    env = make_environment("reward_funcs", reward_funcs=[f"{__name__}:exact"])
    assert env.step(LOGS, META).rewards == [1.0, 0.0, 0.0]
    cfg = GRPOConfig(environment={"name": "reward_funcs", "kwargs": {"reward_funcs": [exact, short]}})
    assert cfg.environment.kwargs["reward_funcs"] == [exact, short]  # the objects themselves run
    assert f"- {__name__}:exact\n    - {__name__}:short\n" in to_yaml(cfg)
