"""Reward environments with controlled group spread, for the dynamic-sampling and advantage tests."""

from posttrain.environments.interface import EnvStepResult


class ConstantEnvironment:
    """Every sample scores 0.1 (the math environment's format reward; not exact in float32)."""

    def step(self, message_logs, metadata):
        return EnvStepResult.final([0.1] * len(message_logs), metadata, [{} for _ in metadata])

    def batch_metrics(self, results):
        return {}


class OneGroupVariesEnvironment(ConstantEnvironment):
    """The first problem of each call scores 0, 1, 0, 1, ... over its samples; the others 0.1:
    exactly one group per generation round has rewards that differ."""

    def step(self, message_logs, metadata):
        first = metadata[0]["answer"] if metadata else None
        rewards, seen = [], 0
        for meta in metadata:
            if meta["answer"] == first:
                rewards.append(float(seen % 2))
                seen += 1
            else:
                rewards.append(0.1)
        return EnvStepResult.final(rewards, metadata, [{} for _ in metadata])
