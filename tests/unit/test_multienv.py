"""One RL run over several environments: the config (`environments`, `data.sources`, weights into
counts), the tasks of its sources (a row's `task_name`), the sampler, the dispatch of a mixed batch
to its environments (each sample's result from its own, in input order) and the metrics per
environment. Counts and metrics are worked by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from posttrain.config.loader import ConfigError, config_from_data, to_yaml
from posttrain.config.multienv import source_counts
from posttrain.config.rl import GRPOConfig
from posttrain.data.batching import MixtureSampler
from posttrain.data.sources import DataError
from posttrain.data.trajectory import Trajectory
from posttrain.environments.group import EnvironmentGroup
from posttrain.environments.interface import EnvStepResult, EpisodeStart
from posttrain.generation.sampling import GenerationOutput, SamplingParams
from posttrain.rollout.multienv import (
    EnvironmentSet,
    environment_batch_metrics,
    environment_validation_metrics,
    held_out_metrics,
    mixed_rollouts,
    source_split_tasks,
)
from posttrain.rollout.rollout import Rollouts, run_rollouts

SUMS = {"reasoning_gym": {"size": 40}}
PUZZLE = {"name": "sliding_puzzle", "kwargs": {"min_size": 2, "max_size": 2, "max_moves": 4}, "max_turns": 4}


def multi(**over: Any) -> dict[str, Any]:
    """A run over math and the sliding puzzle: sums (weight 2) and puzzles (weight 1)."""
    data = {
        "environments": {"math": {}, "puzzle": PUZZLE},
        "data": {
            "sources": {
                "sums": {"environment": "math", "weight": 2, "train": SUMS},
                "puzzles": {"environment": "puzzle", "train": {"environment_tasks": {"size": 20}}},
            }
        },
    }
    data.update(over)
    return data


# ----------------------------------------------------------------------------------- weights -> counts
@pytest.mark.parametrize(
    ("weights", "total", "counts"),
    [
        ([1, 1, 1], 8, [3, 3, 2]),  # quotas 8/3 each: floors 2, 2, 2; the 2 left to the first two (ties)
        ([2, 1, 1], 8, [4, 2, 2]),  # quotas 4, 2, 2: exact
        ([5, 3, 2], 4, [2, 1, 1]),  # quotas 2, 1.2, 0.8: floors 2, 1, 0; the 1 left to 0.8's source
        ([3, 1], 5, [4, 1]),  # quotas 3.75, 1.25: floors 3, 1; the 1 left to 0.75 > 0.25
        ([1, 1], 3, [2, 1]),  # quotas 1.5, 1.5: a tie, the first listed
        ([0.5, 0.25, 0.25], 6, [3, 2, 1]),  # quotas 3, 1.5, 1.5: the tie to the first listed
        ([1, 100], 8, [0, 8]),  # quotas 8/101, 800/101 (7.92): floors 0, 7; the 1 left to 0.92 > 0.079
    ],
)
def test_weights_become_counts_by_largest_remainders(
    weights: list[float], total: int, counts: list[int]
) -> None:
    assert source_counts(weights, total) == counts


def test_counts_sum_to_the_batch_and_follow_the_weights() -> None:
    for total in range(0, 40):
        counts = source_counts([0.1, 0.2, 0.7], total)
        assert sum(counts) == total
        assert all(abs(c - total * w) < 1 for c, w in zip(counts, [0.1, 0.2, 0.7], strict=True))


def test_weights_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive weights"):
        source_counts([1, 0], 4)


# ----------------------------------------------------------------------------------- the config
def test_a_run_over_several_environments_loads_and_dumps_back() -> None:
    cfg = config_from_data(GRPOConfig, multi())
    assert list(cfg.environments) == ["math", "puzzle"]
    assert cfg.environments["math"].name == "math"  # `name` defaults to the key
    assert cfg.environments["puzzle"].max_turns == 4 and cfg.data.sources["sums"].weight == 2
    dumped = cfg.model_dump(mode="json")
    assert "environment" not in dumped and "train" not in dumped["data"]  # the unused sections
    again = config_from_data(GRPOConfig, json.loads(json.dumps(dumped)))
    assert again.model_dump() == cfg.model_dump()
    assert "environments:" in to_yaml(cfg)


def test_a_run_over_one_environment_dumps_as_before() -> None:
    dumped = GRPOConfig().model_dump()
    assert "environments" not in dumped and "sources" not in dumped["data"]
    assert dumped["environment"]["name"] == "math" and "train" in dumped["data"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (multi(environment={"name": "math"}), "both `environment` and `environments` are set"),
        ({"data": multi()["data"]}, "`environments` is not set"),
        (multi(environments={}), "environments is empty"),
        (multi(environments={"math": {}, "val": PUZZLE}), "environments.val: an environment's name"),
        (multi(environments={"math": {}, "a.b": PUZZLE}), "environments.a.b: an environment's name"),
        (
            multi(data={"sources": {"sums": {"environment": "maths", "train": SUMS}}}),
            "data.sources.sums.environment='maths' is not one of the named environments",
        ),
        (
            multi(data={"sources": {"sums": {"train": SUMS}}}),
            "data.sources.sums.train generates its tasks",
        ),
        (
            multi(data={"sources": {"sums": {"environment": "math", "train": SUMS}}}),
            r"environments \['puzzle'\] get no tasks",
        ),
        (
            multi(data={**multi()["data"], "system_prompt": "Box it."}),
            "data.sources is set, and so is data.system_prompt",
        ),
        (multi(data={"sources": {}}), "data.sources is empty"),
        (
            multi(
                data={
                    "sources": {
                        "sums": {"environment": "math", "weight": 30, "train": SUMS},
                        "puzzles": {"environment": "puzzle", "train": {"environment_tasks": {}}},
                    }
                }
            ),
            r"data.sources.puzzles.weight=1.0 gives it 0 of the 8 prompts per step .*'sums': 8, 'puzzles': 0",
        ),
        (
            multi(
                data={
                    "sources": {
                        "puzzles": {
                            "environment": "puzzle",
                            "train": {"environment_tasks": {}},
                            "example_turns": [
                                {"role": "user", "content": "a"},
                                {"role": "assistant", "content": "b"},
                            ],
                        }
                    }
                }
            ),
            "example_turns is set but train uses environment_tasks",
        ),
        (
            multi(generation={"max_new_tokens": 32, "max_episode_tokens": 200}),
            r"what environments.puzzle.max_turns=4 turns generate \(128\)",
        ),
        (
            multi(environments={"math": {}, "puzzle": {**PUZZLE, "max_turns": 2}}),
            "environment.kwargs.max_moves=4 is above environment.max_turns=2",
        ),
    ],
)
def test_config_errors_say_what_to_set(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_data(GRPOConfig, data)


def test_the_episode_budget_is_the_largest_environment_s() -> None:
    """The overlong buffer and Dr.GRPO's normaliser take the budget of the environment with the most
    turns: 4 × 32 = 128 here, where math alone allows 32."""
    from posttrain.config.rollout import run_episode_token_budget

    cfg = config_from_data(
        GRPOConfig, multi(generation={"max_new_tokens": 32}, dapo={"overlong_buffer": 100})
    )
    assert run_episode_token_budget(cfg) == 128
    with pytest.raises(ConfigError, match=r"overlong_buffer=129 is longer than the episode token budget 128"):
        config_from_data(GRPOConfig, multi(generation={"max_new_tokens": 32}, dapo={"overlong_buffer": 129}))


def test_each_environment_may_set_its_own_turn_limit() -> None:
    """environments.<name>.max_new_tokens: that environment's turns' limit, its budget max_turns × it;
    the others keep generation.max_new_tokens. The run's budget is the largest-turn environment's."""
    from posttrain.config.rollout import episode_token_budget, run_episode_token_budget, turn_token_limit
    from posttrain.trainers.common import sampling_params

    puzzle = {**PUZZLE, "max_new_tokens": 8}
    cfg = config_from_data(
        GRPOConfig, multi(environments={"math": {}, "puzzle": puzzle}, generation={"max_new_tokens": 48})
    )
    math, moves = cfg.environments["math"], cfg.environments["puzzle"]
    assert (turn_token_limit(cfg.generation, math), turn_token_limit(cfg.generation, moves)) == (48, 8)
    assert (episode_token_budget(cfg.generation, math), episode_token_budget(cfg.generation, moves)) == (
        48,
        32,
    )
    assert run_episode_token_budget(cfg) == 48  # math's 1 × 48 > the puzzle's 4 × 8
    assert sampling_params(cfg.generation, 0, environment=moves).max_new_tokens == 8
    assert sampling_params(cfg.generation, 0).max_new_tokens == 48
    # an explicit budget is checked against the most-turns environment's own turn limit (4 × 8 = 32)
    over = multi(
        environments={"math": {}, "puzzle": puzzle},
        generation={"max_new_tokens": 48, "max_episode_tokens": 40},
    )
    with pytest.raises(
        ConfigError, match=r"between one turn \(max_new_tokens=8, environments.puzzle's\) and .* \(32\)"
    ):
        config_from_data(GRPOConfig, over)


def test_rows_may_name_their_environments_in_data_train() -> None:
    """Without data.sources, data.train's rows name their environments (NeMo RL's dataset shape)."""
    cfg = config_from_data(
        GRPOConfig,
        {"environments": {"math": {}, "puzzle": PUZZLE}, "data": {"train": {"path": "mixed.jsonl"}}},
    )
    assert cfg.data.sources is None and cfg.data.validation is None  # a path of its own: no quickstart split


# ----------------------------------------------------------------------------------- tasks of a source
def _rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _source(path: Path, environment: str | None = None) -> Any:
    cfg = config_from_data(
        GRPOConfig,
        multi(data={"sources": {"mixed": {"environment": environment, "train": {"path": str(path)}}}}),
    )
    return cfg.data.sources["mixed"], cfg.environments


def test_a_row_naming_an_unknown_environment_is_a_data_error_naming_file_and_row(tmp_path: Path) -> None:
    path = _rows(tmp_path / "mixed.jsonl", [{"prompt": "1+1", "answer": "2", "task_name": "math"}] * 2)
    with path.open("a") as f:
        f.write(json.dumps({"prompt": "2+2", "answer": "4", "task_name": "chess"}) + "\n")
    source, environments = _source(path)
    with pytest.raises(
        DataError, match=r"mixed.jsonl row 3: task_name='chess' is not one of .*\['math', 'puzzle'\]"
    ):
        source_split_tasks(source, source.train, environments, tokenizer=None, max_prompt_len=100)


def test_a_row_without_task_name_needs_its_source_s_environment(tmp_path: Path) -> None:
    path = _rows(tmp_path / "mixed.jsonl", [{"prompt": "1+1", "answer": "2"}])
    source, environments = _source(path)
    with pytest.raises(DataError, match=r"mixed.jsonl row 1: no 'task_name' field, and its source names no"):
        source_split_tasks(source, source.train, environments, tokenizer=None, max_prompt_len=100)


def test_a_row_missing_its_environment_s_field_is_a_data_error(tmp_path: Path) -> None:
    path = _rows(tmp_path / "mixed.jsonl", [{"prompt": "1+1", "task_name": "math"}])
    source, environments = _source(path)
    with pytest.raises(DataError, match=r"row 1: missing field 'answer', which the math environment needs"):
        source_split_tasks(source, source.train, environments, tokenizer=None, max_prompt_len=100)


@pytest.mark.slow  # the real tokenizer: outside the fast lane
def test_rows_get_their_own_or_their_source_s_environment(tmp_path: Path, tokenizer: Any) -> None:
    rows = [{"prompt": "1+1", "answer": "2"}, {"prompt": "2+2", "answer": "4", "task_name": "math"}]
    source, environments = _source(_rows(tmp_path / "mixed.jsonl", rows), environment="math")
    tasks = source_split_tasks(source, source.train, environments, tokenizer=tokenizer, max_prompt_len=100)
    assert [t["task_name"] for t in tasks] == ["math", "math"]
    assert [t["messages"][-1]["content"] for t in tasks] == ["1+1", "2+2"]


@pytest.mark.slow  # the real tokenizer: outside the fast lane
def test_generated_tasks_carry_their_source_s_environment(tokenizer: Any) -> None:
    cfg = config_from_data(GRPOConfig, multi())
    source = cfg.data.sources["puzzles"]
    tasks = source_split_tasks(
        source, source.train, cfg.environments, tokenizer=tokenizer, max_prompt_len=100
    )
    assert len(tasks) == 20 and {t["task_name"] for t in tasks} == {"puzzle"}


# ----------------------------------------------------------------------------------- the sampler
def test_the_mixture_sampler_gives_each_source_its_count_interleaved() -> None:
    sampler = MixtureSampler([6, 4, 10], [3, 2, 1], seed=0)
    batches = [sampler.next_batch() for _ in range(4)]
    for batch in batches:
        sources = ["a" if i < 6 else "b" if i < 10 else "c" for i in batch]
        assert sources == ["a", "b", "c", "a", "b", "a"]  # one of each in turn
    first_epoch_a = sorted(i for b in batches[:2] for i in b if i < 6)
    assert first_epoch_a == list(range(6))  # source a: every item once per epoch (2 batches of 3)
    fresh = MixtureSampler([6, 4, 10], [3, 2, 1], seed=0)
    fresh.next_batch()
    state = json.loads(json.dumps(fresh.state_dict()))
    again = MixtureSampler([6, 4, 10], [3, 2, 1], seed=0)
    again.load_state_dict(state)
    assert again.next_batch() == fresh.next_batch() == batches[1]


def test_the_mixture_sampler_refuses_a_source_smaller_than_its_count() -> None:
    with pytest.raises(ValueError, match="data.sources.b has 1 tasks and would give 2 of every batch"):
        MixtureSampler([5, 1], [2, 2], seed=0, names=["data.sources.a", "data.sources.b"])


# ----------------------------------------------------------------------------------- the dispatch
class _Tagged:
    """A fake environment: episode starts say its label, every turn pays `REWARD`; it ends an episode
    after `TURNS` turns, answering the others with an observation; it records what it stepped."""

    LABEL, REWARD, TURNS = "?", 0.0, 1
    stepped: list[str] = []

    def reset(self, tasks: list[dict], seeds: list[int]) -> list[EpisodeStart]:
        return [
            EpisodeStart([{"role": "user", "content": f"{self.LABEL}: {t['q']}"}], {"q": t["q"], "turn": 0})
            for t in tasks
        ]

    def step(self, message_logs: list, metadata: list[dict]) -> EnvStepResult:
        type(self).stepped.extend(f"{self.LABEL}:{m['q']}" for m in metadata)
        done = [m["turn"] + 1 >= self.TURNS for m in metadata]
        observations = [None if d else {"role": "user", "content": "again"} for d in done]
        new = [{**m, "turn": m["turn"] + 1} for m in metadata]
        info = [{"label": self.LABEL} for _ in metadata]
        return EnvStepResult([self.REWARD] * len(metadata), observations, done, new, info)

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        return {"env/reward_sum": float(sum(results.rewards))}


class _A(_Tagged):
    LABEL, REWARD, TURNS, stepped = "A", 1.0, 1, []


class _B(_Tagged):
    LABEL, REWARD, TURNS, stepped = "B", 10.0, 1, []


class _C(_Tagged):  # multi-turn: three turns, 100 each
    LABEL, REWARD, TURNS, stepped = "C", 100.0, 3, []


class _Replies:
    """Generates "ok" for every prompt; records the prompts' count per call."""

    def __init__(self, tokenizer: Any) -> None:
        self.ids = tokenizer("ok", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        self.calls: list[int] = []

    def generate(self, prompts: list[list[int]], params: SamplingParams, batch_size: int) -> GenerationOutput:
        self.calls.append(len(prompts))
        n = len(prompts)
        return GenerationOutput([list(self.ids)] * n, [[-0.5] * len(self.ids)] * n, [False] * n)


@pytest.mark.slow  # the real tokenizer: outside the fast lane
def test_a_mixed_batch_steps_each_task_with_its_environment_in_input_order(tokenizer: Any) -> None:
    groups = {name: EnvironmentGroup(cls, backend="local") for name, cls in (("a", _A), ("b", _B), ("c", _C))}
    turns = {"a": 1, "b": 1, "c": 3}
    tasks = [{"q": q, "task_name": name} for q, name in enumerate(["c", "a", "b", "a", "c", "b", "a"])]
    generator = _Replies(tokenizer)

    def run(name: str, own: list[dict]) -> Rollouts:
        return run_rollouts(
            own, generations_per_prompt=2, generator=generator, environment=groups[name], tokenizer=tokenizer,
            params=SamplingParams(temperature=1.0, max_new_tokens=4, seed=0), batch_size=8,
            max_turns=turns[name], max_seq_len=256, first_group_id=40,
        )  # fmt: skip

    out = mixed_rollouts(tasks, run, names=["a", "b", "c"], first_group_id=40)
    assert len(out.trajectories) == 14
    names = [t.task_name for t in out.trajectories]
    assert names == [t["task_name"] for t in tasks for _ in range(2)]  # input order, G = 2 each
    assert [t.group_id for t in out.trajectories] == [40 + i for i in range(7) for _ in range(2)]
    for t, task in zip(out.trajectories, [t for t in tasks for _ in range(2)], strict=True):
        label = task["task_name"].upper()
        assert t.messages[0]["content"] == f"{label}: {task['q']}"  # its own environment's reset
        assert t.info == {"label": label}
        assert t.reward == {"A": 1.0, "B": 10.0, "C": 300.0}[label]  # C: three turns of 100
        assert t.num_turns == (3 if label == "C" else 1)
    assert _A.stepped == [f"A:{q}" for q in (1, 1, 3, 3, 6, 6)]  # each environment only its own
    assert _B.stepped == [f"B:{q}" for q in (2, 2, 5, 5)]
    assert _C.stepped == [f"C:{q}" for q in (0, 0, 4, 4)] * 3
    assert out.env_metrics["a/env/reward_sum"] == 6.0 and out.env_metrics["c/env/reward_sum"] == 1200.0
    assert out.env_metrics["c/episode/turns_mean"] == 3.0
    assert out.env_metrics["episode/turns_mean"] == pytest.approx((4 * 3 + 10 * 1) / 14)
    for group in groups.values():
        group.shutdown()


def test_a_task_naming_no_environment_is_refused() -> None:
    with pytest.raises(ValueError, match="task 1 has task_name='z'"):
        mixed_rollouts(
            [{"task_name": "a"}, {"task_name": "z"}],
            lambda n, t: Rollouts([], {}),
            names=["a"],
            first_group_id=0,
        )


def test_the_environment_set_starts_each_task_with_its_own_reset() -> None:
    envs = EnvironmentSet(
        {"a": EnvironmentGroup(_A, backend="local"), "b": EnvironmentGroup(_B, backend="local")}
    )
    starts = envs.reset([{"q": 0, "task_name": "b"}, {"q": 1, "task_name": "a"}], [0, 1])
    assert [s.messages[0]["content"] for s in starts] == ["B: 0", "A: 1"]
    with pytest.raises(ValueError, match=r"tasks \[0\] name no environment"):
        envs.reset([{"q": 0, "task_name": "c"}], [0])
    envs.shutdown()


# ----------------------------------------------------------------------------------- the metrics
def _episode(
    name: str, reward: float, *, scored: bool = True, correct: bool | None = None, length: int = 1
) -> Trajectory:
    t = Trajectory([0] * (length + 1), [0] + [1] * length, [0.0] * (length + 1), [], {}, 0, reward=reward)
    t.task_name, t.scored = name, scored
    if correct is not None:
        t.info = {"correct": correct}
    return t


def test_batch_metrics_per_environment_by_hand() -> None:
    """a: rewards 1, 0, 1 (scored) → mean 2/3, std sqrt(1/3) (Bessel: Σ(r − 2/3)² = 2/3 over 2);
    b: rewards 0.5 and an unscored 0 → mean 0.5, std 0 (one scored); c: none → share 0 only."""
    rollouts = Rollouts(
        [
            _episode("a", 1.0),
            _episode("b", 0.5),
            _episode("a", 0.0),
            _episode("b", 0.0, scored=False),
            _episode("a", 1.0),
        ],
        {},
    )
    metrics = environment_batch_metrics(rollouts, ["a", "b", "c"])
    assert metrics["a/share"] == 3 / 5 and metrics["b/share"] == 2 / 5 and metrics["c/share"] == 0.0
    assert metrics["a/reward/mean"] == pytest.approx(2 / 3) and metrics["a/reward/std"] == pytest.approx(
        math.sqrt(1 / 3)
    )
    assert metrics["b/reward/mean"] == 0.5 and metrics["b/reward/std"] == 0.0
    assert "c/reward/mean" not in metrics


def test_validation_metrics_per_environment_by_hand() -> None:
    """n = 2 samples per task, tasks in a row: a's two tasks (right, wrong), (wrong, wrong) → accuracy
    1/4, pass@2 = (1 + 0) / 2; b's one task (right by reward 1, no info), (wrong: reward 0.5) → 1/2,
    pass@2 1; overall 2/6. The environments' own metrics go under val/<name>/env/."""
    trajectories = [
        _episode("a", 1.0, correct=True, length=2), _episode("a", 0.0, correct=False, length=4),
        _episode("a", 0.0, correct=False), _episode("a", 0.0, correct=False),
        _episode("b", 1.0), _episode("b", 0.5),
    ]  # fmt: skip
    rollouts = Rollouts(trajectories, {"a/env/x": 0.25, "b/env/y": 0.75, "a/episode/turns_mean": 1.0})
    overall = held_out_metrics(rollouts, 2)
    assert overall["accuracy"] == 2 / 6 and overall["pass@2"] == pytest.approx(2 / 3)
    metrics = environment_validation_metrics(rollouts, 2, ["a", "b", "c"])
    assert metrics["val/a/accuracy"] == 1 / 4 and metrics["val/a/pass@2"] == 1 / 2
    assert metrics["val/a/reward"] == 1 / 4 and metrics["val/a/response_length"] == (2 + 4 + 1 + 1) / 4
    assert (
        metrics["val/b/accuracy"] == 1 / 2
        and metrics["val/b/pass@2"] == 1.0
        and metrics["val/b/reward"] == 0.75
    )
    assert metrics["val/a/env/x"] == 0.25 and metrics["val/b/env/y"] == 0.75
    assert not any(k.startswith("val/c/") for k in metrics) and "val/a/episode/turns_mean" not in metrics


def test_the_mixture_sampler_describes_its_sources() -> None:
    sampler = MixtureSampler([6, 4], [3, 1], seed=0, names=["data.sources.a", "data.sources.b"])
    assert (
        sampler.describe()
        == "sources: data.sources.a 6 tasks, 3 per batch; data.sources.b 4 tasks, 1 per batch"
    )
