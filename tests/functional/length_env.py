"""A reward that differs within almost every group: the reply's length in characters / 100."""

from posttrain.environments.interface import EnvStepResult


class LengthEnvironment:
    def step(self, message_logs, metadata):
        rewards = [len(m[-1]["content"]) / 100 for m in message_logs]
        return EnvStepResult.final(rewards, metadata, [{} for _ in metadata])

    def batch_metrics(self, results):
        return {}
