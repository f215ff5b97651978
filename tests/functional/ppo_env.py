"""Environments with known rewards for the PPO tests (a random model earns nothing from math)."""

from posttrain.environments.interface import EnvStepResult


class TwoTurnEnvironment:
    """Every episode has two turns: the first earns 0.25 and gets a user observation back, the second
    earns 0.5 and ends the episode (reward 0.75 in all)."""

    def step(self, message_logs, metadata):
        turns = [sum(m["role"] == "assistant" for m in log) for log in message_logs]
        done = [n >= 2 for n in turns]
        observations = [None if d else {"role": "user", "content": "Once more, please."} for d in done]
        rewards = [0.25 * n for n in turns]
        return EnvStepResult(rewards, observations, done, [dict(m) for m in metadata])

    def batch_metrics(self, results):
        return {}
