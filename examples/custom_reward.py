"""A custom reward function and a custom multi-turn environment (the code of docs/environments.md).

Run it: `python examples/custom_reward.py`.
"""

from __future__ import annotations

import re

from posttrain.environments import (
    EnvironmentGroup,
    EnvStepResult,
    RewardFunctionEnvironment,
    last_assistant_content,
    register_environment,
)

# --- 1. A reward function: (completion, metadata) -> float ---


def exact_answer_reward(completion: str, metadata: dict) -> float:
    """1 if the last line of the completion states the expected answer, else 0."""
    lines = completion.strip().splitlines() or [""]
    return 1.0 if metadata["answer"] in lines[-1] else 0.0


reward_env = RewardFunctionEnvironment(exact_answer_reward, timeout_s=2.0)


# --- 2. An environment: a guessing game over several turns ---


@register_environment("guess_number")
class GuessNumberEnvironment:
    """The model guesses metadata["target"]; it is told "higher" or "lower" until right or out of turns."""

    def __init__(self, max_turns: int = 3) -> None:
        self.max_turns = max_turns

    def step(self, message_logs: list[list[dict]], metadata: list[dict]) -> EnvStepResult:
        rewards, observations, done, new_metadata = [], [], [], []
        for log, meta in zip(message_logs, metadata, strict=True):
            numbers = re.findall(r"-?\d+", last_assistant_content(log))
            guess = int(numbers[-1]) if numbers else None
            turn = meta.get("turn", 0) + 1
            solved = guess == meta["target"]
            finished = solved or turn >= self.max_turns
            hint = "higher" if guess is None or guess < meta["target"] else "lower"
            rewards.append(1.0 if solved else 0.0)
            observations.append(None if finished else {"role": "user", "content": hint})
            done.append(finished)
            new_metadata.append({**meta, "turn": turn})
        return EnvStepResult(rewards, observations, done, new_metadata)

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        return {"env/solved": sum(results.rewards) / max(len(results), 1)}


if __name__ == "__main__":
    chat = [{"role": "user", "content": "What is 6 * 7?"}, {"role": "assistant", "content": "6 * 7 =\n42"}]
    result = reward_env.step([chat], [{"answer": "42"}])
    print("reward function:", result.rewards, reward_env.batch_metrics(result))
    reward_env.close()

    envs = EnvironmentGroup("guess_number", {"max_turns": 3}, backend="local")  # backend="ray" for actors
    game = [{"role": "user", "content": "Guess my number (1-10)."}, {"role": "assistant", "content": "5"}]
    result = envs.step([game], [{"target": 7}])
    print("guess_number:", result.rewards, result.observations, result.done, envs.batch_metrics(result))
    envs.shutdown()
