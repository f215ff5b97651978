"""A reward environment whose verifier raises on some samples and hangs on others (for tests)."""

import time

from posttrain.environments.interface import RewardFunctionEnvironment


def flaky_reward(completion: str, metadata: dict) -> float:
    answer = int(metadata["answer"])
    if answer % 3 == 0:
        raise ValueError("verifier crashed")
    if answer % 3 == 1:
        time.sleep(60)
    return 1.0 if len(completion) % 2 else 0.0


class FlakyEnvironment(RewardFunctionEnvironment):
    def __init__(self) -> None:
        super().__init__(flaky_reward, timeout_s=1.0, num_procs=2)


def broken_reward(completion: str, metadata: dict) -> float:
    """A reward function with a bug: every call raises."""
    raise KeyError("solution")
