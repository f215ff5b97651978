"""A multi-turn environment with reset, and an environment with a tool (the code of the sections
"Write a multi-turn environment" and "Add a tool" of docs/environments.md).

Run it: `python examples/multiturn_env.py` (plays scripted replies; no model needed).
"""

from __future__ import annotations

import random
import re

from posttrain.environments import (
    EnvStepResult,
    EpisodeStart,
    ToolEnvironment,
    ToolRegistry,
    last_assistant_content,
    register_environment,
)

# --- 1. A multi-turn environment: Nim against the environment ---


@register_environment("nim")
class NimEnvironment:
    """Players take 1 to 3 stones in turn; whoever takes the last stone wins. The model moves
    first with <move>k</move>; the environment answers with the best move it has."""

    def __init__(self, max_stones: int = 12) -> None:
        self.max_stones = max_stones

    def generate_tasks(self, count: int, seed: int) -> list[dict]:
        rng = random.Random(seed)
        return [{"stones": rng.randint(5, self.max_stones)} for _ in range(count)]

    def reset(self, tasks: list[dict], seeds: list[int]) -> list[EpisodeStart]:
        rules = "Nim with {stones} stones: take 1, 2 or 3 per turn; whoever takes the last stone wins. "
        rules += "You start. Answer like <move>2</move>."
        return [
            EpisodeStart(
                messages=[{"role": "user", "content": rules.format(**t)}],
                metadata={"stones": t["stones"]},
                stop_strings=("</move>",),
            )
            for t in tasks
        ]

    def step(self, message_logs: list[list[dict]], metadata: list[dict]) -> EnvStepResult:
        turns = [
            self.turn(last_assistant_content(log), m) for log, m in zip(message_logs, metadata, strict=True)
        ]
        return EnvStepResult(
            rewards=[t[0] for t in turns],
            observations=[t[1] for t in turns],
            done=[t[2] for t in turns],
            metadata=[t[3] for t in turns],
            scored=[t[4] for t in turns],
            stop_strings=[None if t[2] else ("</move>",) for t in turns],
        )

    def turn(self, reply: str, meta: dict) -> tuple[float, dict | None, bool, dict, bool]:
        """(reward, observation, done, metadata, scored) of one episode's turn."""
        stones = meta["stones"]
        if stones < 1:  # a broken task: leave the episode out of the loss instead of scoring it 0
            return 0.0, None, True, meta, False
        move = re.search(r"<move>\s*(\d+)", reply)
        take = int(move.group(1)) if move else 0
        if not 1 <= take <= min(3, stones):
            return 0.0, None, True, meta, True  # an illegal move loses
        stones -= take
        if stones == 0:
            return 1.0, None, True, {**meta, "stones": 0}, True  # the model took the last stone
        answer = stones % 4 or 1  # leave a multiple of 4 when possible
        stones -= answer
        if stones == 0:
            return 0.0, None, True, {**meta, "stones": 0}, True
        note = f"I take {answer}. {stones} stones left. Your move."
        return 0.0, {"role": "user", "content": note}, False, {**meta, "stones": stones}, True

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        ended = [r for r, d in zip(results.rewards, results.done, strict=True) if d]
        return {"env/win_rate": sum(ended) / len(ended)} if ended else {}


# --- 2. A tool: a typed function with a docstring, in an environment that may call it ---


def word_length(word: str) -> int:
    """Count the letters of a word.

    Args:
        word: the word to measure
    """
    return len(word)


@register_environment("longer_word")
class LongerWordEnvironment(ToolEnvironment):
    """Which of two words is longer? The model may measure them with `word_length` first."""

    def __init__(self, max_tool_calls: int = 4, tools_in_system_prompt: bool = False) -> None:
        super().__init__(
            ToolRegistry([word_length]),
            max_tool_calls=max_tool_calls,
            tools_in_system_prompt=tools_in_system_prompt,
        )

    def reset(self, tasks: list[dict], seeds: list[int]) -> list[EpisodeStart]:
        question = "Which word is longer, {a} or {b}? Reply with the word only."
        return [self.start([{"role": "user", "content": question.format(**t)}], dict(t)) for t in tasks]

    def score(self, reply: str, metadata: dict) -> tuple[float, dict]:
        longer = max(metadata["a"], metadata["b"], key=len)
        correct = reply.strip().lower() == longer
        return float(correct), {"correct": correct}


def play(env, task: dict, replies: list[str]) -> list[dict]:
    """Play scripted assistant replies through reset and step; return the conversation."""
    [start] = env.reset([task], [0])
    log, meta = list(start.messages), start.metadata
    for reply in replies:
        log.append({"role": "assistant", "content": reply})
        result = env.step([log], [meta])
        meta = result.metadata[0]
        if result.done[0]:
            print(f"reward {result.rewards[0]}, scored {result.scored[0]}")
            break
        log.append(result.observations[0])
    return log


if __name__ == "__main__":
    for message in play(NimEnvironment(), {"stones": 7}, ["<move>3</move>", "<move>3</move>"]):
        print(f"{message['role']}: {message['content']}")
    call = '<tool_call>{"name": "word_length", "arguments": {"word": "banana"}}</tool_call>'
    for message in play(LongerWordEnvironment(), {"a": "banana", "b": "fig"}, [call, "banana"]):
        print(f"{message['role']}: {message['content']}")
