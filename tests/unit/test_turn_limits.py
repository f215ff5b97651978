"""Environment turn limits vs `environment.max_turns` (issue #29 item 6): an environment that allows
an episode n turns (sliding puzzle: max_moves, reasoning-gym: max_tries) needs max_turns >= n, or
the rollout ends the episode before its last turn is paid."""

from __future__ import annotations

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.config.rl import GRPOConfig
from posttrain.config.rollout import EnvironmentConfig
from posttrain.environments.interface import episode_turn_limit
from posttrain.environments.reasoning_gym_env import ReasoningGymEnvironment
from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment
from posttrain.environments.sliding_puzzle_board import shuffled_grid

ENV_CLASSES = {"sliding_puzzle": SlidingPuzzleEnvironment, "reasoning_gym": ReasoningGymEnvironment}


@pytest.mark.parametrize(
    ("name", "key", "default"), [("sliding_puzzle", "max_moves", 50), ("reasoning_gym", "max_tries", 1)]
)
def test_a_limit_above_max_turns_is_a_config_error(name: str, key: str, default: int) -> None:
    assert episode_turn_limit(ENV_CLASSES[name], {}) == (key, default)
    assert episode_turn_limit(ENV_CLASSES[name], {key: 3}) == (key, 3)
    with pytest.raises(ConfigError) as e:
        load_config(GRPOConfig, None, [f"environment.name={name}", f"environment.kwargs.{key}=3", "environment.max_turns=2"])  # fmt: skip
    message = str(e.value)
    assert f"environment.kwargs.{key}=3 is above environment.max_turns=2" in message
    assert f"Set environment.max_turns=3, or environment.kwargs.{key}=2" in message
    # the environment's default counts when the kwarg is left out
    if default > 1:
        with pytest.raises(ConfigError, match=f"environment.kwargs.{key}={default} is above"):
            load_config(GRPOConfig, None, [f"environment.name={name}", "environment.max_turns=4"])
    # equal, or more turns than the environment uses, is fine: the environment ends the episode
    for turns in (3, 5):
        cfg = load_config(GRPOConfig, None, [f"environment.name={name}", f"environment.kwargs.{key}=3", f"environment.max_turns={turns}"])  # fmt: skip
        assert cfg.environment.max_turns == turns
    # a later assignment is checked too
    env_cfg = EnvironmentConfig(name=name, kwargs={key: 3}, max_turns=3)
    with pytest.raises(ValueError, match="is above environment.max_turns=2"):
        env_cfg.max_turns = 2


def test_environments_without_a_turn_limit_are_unchanged() -> None:
    assert EnvironmentConfig().max_turns == 1
    assert EnvironmentConfig(name="math").max_turns == 1
    assert EnvironmentConfig(name="tool_calculator", max_turns=3).max_turns == 3
    # an import path of a class without a turn limit (an unimportable one is an error: test_environment_spec)
    assert EnvironmentConfig(name="posttrain.environments.math:MathEnvironment", max_turns=1).max_turns == 1


def test_a_task_can_lower_max_moves_never_raise_it() -> None:
    env = SlidingPuzzleEnvironment(max_moves=4)
    base = {"size": 2, "shuffle_moves": 3, "puzzle_seed": 5}
    starts = env.reset([{**base, "max_moves": 100}, {**base, "max_moves": 2}, base], [0, 0, 0])
    assert [s.metadata["max_moves"] for s in starts] == [4, 2, 4]
    # the task that asked for 100 moves ends, scored, on the environment's 4th turn
    grid = shuffled_grid(2, 3, 5)
    assert starts[0].metadata["grid"] == grid
    log, meta = list(starts[0].messages), starts[0].metadata
    for turn in range(1, 5):
        log.append({"role": "assistant", "content": "<action>view</action>"})
        result = env.step([log], [meta])
        assert result.done == [turn == 4]
        if not result.done[0]:
            log.append(result.observations[0])
            meta = result.metadata[0]
