"""Any reasoning-gym task by name (countdown, maze, sudoku, basic_arithmetic, ...), scored by that
task's own `score_answer`; single-turn, or multi-turn "retry with feedback".

Tasks come from the reasoning-gym dataset itself: `generate_tasks(count, seed)` gives
`{"seed": seed, "size": count, "index": i}`, and `reset` rebuilds entry i of the dataset made
with that seed and size (reasoning-gym generates entry i from the seed and i alone), so a fixed
seed is a fixed set. `generate_tasks(count, seed, split="train" | "heldout")` keeps only the entries
of that split (`question_split`: one question in five, by its hash, is held out), so that a held-out
set never asks a training question; small families repeat (1-digit sums and differences have 242
distinct questions), and a different seed alone would ask the same ones. A task may also carry the entry itself (`question`, `answer`,
`metadata`, as reasoning-gym writes it, e.g. a row of an exported JSONL file).

The answer is read from the reply's `<answer>…</answer>` (`answer_format="answer_tag"`,
reasoning-gym's own convention and system prompt) or `\\boxed{}` (`"boxed"`), outside `<think>`
blocks; tags or boxes holding different answers are a hedge and answer nothing. The score is
`dataset.score_answer(answer, entry)` (a float in [0, 1]; some tasks give partial credit, e.g.
countdown 0.01 for no answer, basic_arithmetic len(answer) / len(reply) when the reply contains
the answer). An answer is correct when its score reaches `success_threshold`. An answer copied
from the prompt (`copied_from_prompt`: the question's expression, a placeholder such as
`answer here`) that the scorer does not find correct scores 0 and earns no format reward.

With `max_tries > 1`, a reply that is not correct gets the verdict back as the next user turn
("... scored 0.05 out of 1, which is not correct. Try again ...") until it is correct or the tries
run out. Intermediate turns have reward 0; the last turn's reward is the last try's score times
`retry_discount ** (tries - 1)`. With `format_reward`, the first try's turn earns at least that much
when its answer is found but wrong (a shaping reward for the answer format; `correct` counts right
answers only). The knobs are checked (`check_retry_rewards`) so that no episode pays more than
answering right at once: with retries, format_reward <= success_threshold * (1 - retry_discount).

`seeded_retries` (a share in [0, 1]) trains the retry on every episode that has one: that share of
the training split's tasks (`split="train"`, chosen by a hash of the task) starts after a wrong first
try the environment wrote (`seeded_wrong_answer`: the gold number off by 1 to 3, up or down) and its
feedback, so the policy's first reply is already a second try that can read the feedback. A group
shares its task, so GRPO compares second tries with each other. Held-out tasks and tasks of no split
are never seeded: they measure the policy's own first and second tries.

Some scorers run user text through sympy (countdown), which can hang on `9**9**9`: with
`timeout_s` (the default) scoring runs in a persistent subprocess (`TimeoutPool`) and a sample
past the limit scores 0 with `info["verifier_error"] = "timeout"`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from typing import Any, ClassVar, Literal

from posttrain.environments.calculator import parse_number
from posttrain.environments.interface import (
    EnvStepResult,
    EpisodeStart,
    Message,
    PooledEnvironment,
    last_assistant_content,
    register_environment,
    verifier_error_metrics,
)
from posttrain.environments.math import copied_from_prompt, final_boxed_answer, prompt_text, strip_think
from posttrain.environments.splits import HELDOUT_EVERY, check_split, question_split
from posttrain.environments.timeout_pool import TimeoutPool

BOXED_SYSTEM_PROMPT = (
    "Given a problem, your task is to answer the question by thinking step-by-step in a clear and "
    "specific manner.\nOnce you have thought about the reasoning process, give the final answer "
    "in \\boxed{}, like this: \\boxed{answer here}\nDo not explain your reasoning inside the box, "
    "give only the final answer. When an example is provided, strictly follow the format of its answer."
)

_DATASETS: OrderedDict[tuple[str, str], Any] = OrderedDict()


def load_dataset(name: str, config: dict[str, Any]) -> Any:
    """A reasoning-gym dataset (`reasoning_gym.create_dataset(name, **config)`), cached (a few per process)."""
    import reasoning_gym

    key = (name, json.dumps(config, sort_keys=True, default=str))
    if key not in _DATASETS:
        _DATASETS[key] = reasoning_gym.create_dataset(name, **config)
        if len(_DATASETS) > 8:
            _DATASETS.popitem(last=False)
    _DATASETS.move_to_end(key)
    return _DATASETS[key]


def score_with_dataset(name: str, config: dict[str, Any], answer: str | None, entry: dict[str, Any]) -> float:
    """`score_answer(answer, entry)` of the named dataset (module level: it runs in `TimeoutPool` processes)."""
    return float(load_dataset(name, config).score_answer(answer, entry))


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(reply: str, answer_format: str) -> str | None:
    """A reply's answer, read outside its `<think>` blocks (`strip_think`): the content of its
    `<answer>…</answer>` tags ("answer_tag") or `\\boxed{}` ("boxed", `final_boxed_answer`), stripped.
    None when there is none, or when tags (boxes) hold different answers: a hedge answers nothing."""
    reply = strip_think(reply)
    if answer_format == "boxed":
        return final_boxed_answer(reply)
    answers = [a.strip() for a in _ANSWER_TAG.findall(reply)]
    if len({re.sub(r"\s+", "", a) for a in answers}) != 1:
        return None
    return answers[-1]


def direction_hint(answer: str, gold: Any) -> str | None:
    """ "It is too high." / "It is too low." when the answer and the gold answer are both numbers
    and differ, else None: feedback that carries information a second try can use."""
    value, target = parse_number(answer), parse_number(str(gold)) if gold is not None else None
    if value is None or target is None or value == target:
        return None
    return "It is too high." if value > target else "It is too low."


FORMAT_REQUESTS = {
    ("placeholder", "answer_tag"): "as <answer>your answer</answer>",
    ("placeholder", "boxed"): "as \\boxed{your answer}",
    ("named", "answer_tag"): "in <answer></answer> tags",
    ("named", "boxed"): "in \\boxed{}",
}
"""How the retry turn asks for the answer, by (feedback_format, answer_format)."""


def _task_hash(task: dict[str, Any]) -> bytes:
    """SHA-256 of a task's identity (its fields but the rebuilt entry), stable across processes."""
    key = {k: v for k, v in task.items() if k != "entry"}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).digest()


def seeded_wrong_answer(gold: Any, task: dict[str, Any]) -> str | None:
    """A wrong answer for a seeded first try: the gold number moved up or down by 1, 2 or 3 (by the
    task's hash), written as the gold is (an integer stays an integer); None when the gold is not a number."""
    target = parse_number(str(gold)) if gold is not None else None
    if target is None:
        return None
    digest = _task_hash(task)
    offset = (1 + digest[1] % 3) * (1 if digest[2] % 2 else -1)
    value = target + offset
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def check_retry_rewards(
    *, max_tries: int, success_threshold: float, retry_discount: float, format_reward: float
) -> None:
    """Raise ValueError unless no episode pays more than answering right at once.

    Write s = success_threshold, d = retry_discount, f = format_reward, T = max_tries. An episode's
    reward is the sum of its turns': the first try's turn pays at least f when its answer is found
    but wrong, later turns before the last pay 0, and the last pays its score times d^(tries - 1).
    With T = 1 a wrong answer pays max(score, f) < s when f < s. With T >= 2, a path whose first
    right answer (score q >= s) comes on try k >= 2 pays at most f + q·d^(k-1) <= f + q·d, and the
    same answer at once pays q; f + q·d <= q for every q >= s exactly when f <= s·(1 - d). Under
    that inequality a path never right pays at most f + s·d^(T-1) < s, less than any right first
    answer. So the knobs must satisfy 0 < s <= 1, 0 < d <= 1, 0 <= f < s and, with T >= 2,
    f <= s·(1 - d) (up to 1e-12, so that decimal knobs such as d = 0.9, f = 0.1 pass).
    """
    if not 0.0 < success_threshold <= 1.0:
        raise ValueError(
            f"success_threshold must be in (0, 1] (scores are in [0, 1]), got {success_threshold}"
        )
    if not 0.0 < retry_discount <= 1.0:
        raise ValueError(f"retry_discount must be in (0, 1], got {retry_discount}")
    if not 0.0 <= format_reward < success_threshold:
        raise ValueError(
            f"format_reward must be in [0, success_threshold={success_threshold}), got {format_reward}"
        )
    bound = success_threshold * (1.0 - retry_discount)
    if max_tries > 1 and format_reward > bound + 1e-12:
        raise ValueError(
            f"format_reward={format_reward} with max_tries={max_tries} and retry_discount={retry_discount} "
            f"pays a wrong first answer then a right one (score {success_threshold:g}) "
            f"{format_reward + retry_discount * success_threshold:g}, more than the right answer at once "
            f"({success_threshold:g}). Need format_reward <= success_threshold * (1 - retry_discount) = "
            f"{bound:g}: lower format_reward, lower retry_discount (e.g. 0.5 allows format_reward up to "
            f"{success_threshold * 0.5:g}), or set max_tries=1"
        )


@register_environment("reasoning_gym")
class ReasoningGymEnvironment(PooledEnvironment):
    """A reasoning-gym task as an environment (see the module docstring).

    Args:
        dataset: the reasoning-gym dataset name (`reasoning_gym.factory.DATASETS`).
        dataset_config: its config fields (e.g. {"min_numbers": 3} for countdown), besides seed and size.
        answer_format: "answer_tag" (`<answer>…</answer>`) or "boxed" (`\\boxed{}`).
        system_prompt: the system message; None: reasoning-gym's default prompt for "answer_tag",
            a \\boxed{} version of it for "boxed"; "": no system message.
        max_tries: answers allowed per episode (1 = single-turn).
        success_threshold: the score from which an answer counts as correct (ends the episode).
        retry_discount: the final reward is multiplied by this for every try before the last; in (0, 1].
        format_reward: the least reward of the first try's turn when its answer is found (in the
            answer format, not blank, scored without error) but not correct (0: off). It teaches the answer format
            before the model is ever right; with retries it is that turn's reward and the episode
            goes on. A right answer still earns the full score; `correct` and `env/accuracy` count
            right answers only. Later tries get none: the feedback turn shows the format
            ("\\boxed{your answer}"), and a policy learned to copy it for the format reward. With
            max_tries > 1 it must be <= success_threshold * (1 - retry_discount) (`check_retry_rewards`).
        timeout_s: limit for scoring one answer, in a subprocess; None scores in-process.
        num_procs: scoring processes.
        feedback: "verdict" (the retry turn says the answer's score and that it is not correct) or
            "direction" (for a numeric task, also whether the answer is too high or too low: the
            second try has information the first did not; the verdict alone is its baseline).
        seeded_retries: the share of training-split tasks whose episode starts after a wrong first
            try the environment wrote, with its feedback (see the module docstring); needs max_tries >= 2.
        feedback_format: how the retry turn asks for the answer format: "placeholder" shows it filled
            with a placeholder ("give your final answer as \\boxed{your answer}"), "named" only names
            it ("give your final answer in \\boxed{}"), leaving nothing to copy: a small policy
            copied the placeholder in up to 77% of its second tries (issue #32 item 4).
        examples: messages placed between the system prompt and the question (a worked example:
            a user question and the assistant's answer in the answer format); a small model copies
            a demonstrated answer format far more often than it follows a described one. An answer
            copied from them that is not right scores 0 (`copied_from_prompt`).

    Metadata: the task's fields, "entry" (question, answer, metadata) and "tries" (answers so far).
    Info per turn: "extracted_answer", "score", "correct", "tries", "verifier_error", "copied_prompt".
    """

    turn_limit_kwarg: ClassVar[str] = "max_tries"
    """`environment.max_turns` must be at least `max_tries` (checked by the config): see `episode_turn_limit`."""

    def __init__(
        self,
        dataset: str = "basic_arithmetic",
        dataset_config: dict[str, Any] | None = None,
        answer_format: Literal["answer_tag", "boxed"] = "answer_tag",
        system_prompt: str | None = None,
        max_tries: int = 1,
        success_threshold: float = 1.0,
        retry_discount: float = 1.0,
        format_reward: float = 0.0,
        timeout_s: float | None = 10.0,
        num_procs: int = 1,
        feedback: Literal["verdict", "direction"] = "verdict",
        feedback_format: Literal["placeholder", "named"] = "placeholder",
        examples: list[Message] | None = None,
        seeded_retries: float = 0.0,
    ) -> None:
        import reasoning_gym

        if feedback not in ("verdict", "direction"):
            raise ValueError(f"feedback must be 'verdict' or 'direction', got {feedback!r}")
        self.feedback_mode = feedback
        if feedback_format not in ("placeholder", "named"):
            raise ValueError(f"feedback_format must be 'placeholder' or 'named', got {feedback_format!r}")
        self.feedback_format = feedback_format
        if not 0.0 <= seeded_retries <= 1.0:
            raise ValueError(f"seeded_retries must be in [0, 1], got {seeded_retries}")
        if seeded_retries > 0 and max_tries < 2:
            raise ValueError(
                f"seeded_retries={seeded_retries} needs max_tries >= 2 (a try left after the seeded one)"
            )
        self.seeded_retries = seeded_retries

        if dataset not in reasoning_gym.factory.DATASETS:
            raise ValueError(
                f"unknown reasoning-gym dataset {dataset!r}; known: {sorted(reasoning_gym.factory.DATASETS)}"
            )
        if answer_format not in ("answer_tag", "boxed"):
            raise ValueError(f"answer_format must be 'answer_tag' or 'boxed', got {answer_format!r}")
        if max_tries < 1:
            raise ValueError(f"max_tries must be >= 1, got {max_tries}")
        check_retry_rewards(
            max_tries=max_tries,
            success_threshold=success_threshold,
            retry_discount=retry_discount,
            format_reward=format_reward,
        )
        self.dataset = dataset
        self.dataset_config = dict(dataset_config or {})
        self.answer_format = answer_format
        if system_prompt is None:
            system_prompt = (
                reasoning_gym.utils.SYSTEM_PROMPTS["default"]
                if answer_format == "answer_tag"
                else BOXED_SYSTEM_PROMPT
            )
        self.system_prompt = system_prompt
        self.max_tries = max_tries
        self.success_threshold = success_threshold
        self.retry_discount = retry_discount
        self.format_reward = format_reward
        self.timeout_s = timeout_s
        self.num_procs = num_procs
        self.examples = [dict(m) for m in examples or ()]
        self._pool: TimeoutPool | None = None

    def generate_tasks(self, count: int, seed: int, split: str | None = None) -> list[dict[str, Any]]:
        """The first `count` entries of the dataset made with `seed` (and size `count`); with `split`
        ("train" or "heldout"), the first `count` entries whose question is in that split
        (`question_split`), read from a dataset as large as it takes."""
        if split is None:
            return [{"seed": seed, "size": count, "index": i} for i in range(count)]
        check_split(split)
        size = 2 * HELDOUT_EVERY * count
        while True:
            config = {**self.dataset_config, "seed": seed, "size": size}
            dataset = load_dataset(self.dataset, config)
            found = [i for i in range(size) if question_split(dataset[i]["question"]) == split][:count]
            if len(found) == count:
                return [{"seed": seed, "size": size, "index": i, "split": split} for i in found]
            if size >= 100 * HELDOUT_EVERY * count:
                raise ValueError(
                    f"{self.dataset} {self.dataset_config} gave {len(found)} of {count} {split!r} "
                    f"questions in {size} entries: the family has too few distinct questions for a {split} split"
                )
            size *= 4

    def entry(self, task: dict[str, Any], seed: int) -> dict[str, Any]:
        """The reasoning-gym entry of a task: its own question/answer/metadata, or entry "index" of the
        dataset made with the task's "seed" (default: the episode's seed) and "size"."""
        if "question" in task:
            return {
                "question": task["question"],
                "answer": task.get("answer"),
                "metadata": task.get("metadata", {}),
            }
        index = int(task.get("index", 0))
        config = {
            **self.dataset_config,
            "seed": int(task.get("seed", seed)),
            "size": int(task.get("size", index + 1)),
        }
        return load_dataset(self.dataset, config)[index]

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """One episode per task: the system prompt (if any) and the question."""
        starts = []
        for task, seed in zip(tasks, seeds, strict=True):
            entry = self.entry(task, seed)
            messages: list[Message] = [
                *(dict(m) for m in self.examples),
                {"role": "user", "content": entry["question"]},
            ]
            if self.system_prompt:
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            wrong = self._seeded_answer(task, entry)
            if wrong is None:
                starts.append(EpisodeStart(messages, {**task, "entry": entry, "tries": 0}))
                continue
            boxed = (
                f"<answer>{wrong}</answer>" if self.answer_format == "answer_tag" else f"\\boxed{{{wrong}}}"
            )
            messages += [
                {"role": "assistant", "content": f"The answer is {boxed}."},
                {"role": "user", "content": self.feedback(wrong, 0.0, entry.get("answer"))},
            ]
            starts.append(EpisodeStart(messages, {**task, "entry": entry, "tries": 1, "seeded": True}))
        return starts

    def _seeded_answer(self, task: dict[str, Any], entry: dict[str, Any]) -> str | None:
        """The wrong first answer this task's episode starts from, or None (not seeded)."""
        if self.seeded_retries <= 0 or task.get("split") != "train":
            return None
        if int.from_bytes(_task_hash(task)[:1]) >= round(256 * self.seeded_retries):
            return None
        return seeded_wrong_answer(entry.get("answer"), task)

    def _scores(
        self, answers: list[str | None], entries: list[dict[str, Any]]
    ) -> list[tuple[float, str | None]]:
        """(score, error) per answer; a failed or timed-out scoring is (0.0, error)."""
        args = [(self.dataset, self.dataset_config, a, e) for a, e in zip(answers, entries, strict=True)]
        if self.timeout_s is None:
            out = []
            for a in args:
                try:
                    out.append((score_with_dataset(*a), None))
                except Exception as e:  # one sample's failure scores it 0; the batch goes on
                    out.append((0.0, f"exception: {type(e).__name__}: {e}"[:500]))
            return out
        if self._pool is None:
            # the warm-up imports reasoning-gym and builds the dataset before the first timed call
            warmup = (self.dataset, self.dataset_config, None, {})
            self._pool = TimeoutPool(
                score_with_dataset, timeout_s=self.timeout_s, num_procs=self.num_procs, warmup_args=warmup
            )
        return [(float(o.value), None) if o.ok else (0.0, o.error) for o in self._pool.map(args)]

    def feedback(self, answer: str | None, score: float, gold: Any = None) -> str:
        """The user turn after an answer that is not correct: the verdict, and with
        `feedback="direction"` whether a numeric answer is too high or too low (`direction_hint`)."""
        fmt = FORMAT_REQUESTS[self.feedback_format, self.answer_format]
        if answer is None:
            return f"I could not find your final answer. Try again, and give it {fmt}."
        verdict = f"Your answer {answer!r} scored {score:g} out of 1, which is not correct."
        hint = direction_hint(answer, gold) if self.feedback_mode == "direction" else None
        if hint:
            verdict += f" {hint}"
        return f"{verdict} Try again, and give your final answer {fmt}."

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        answers = [extract_answer(last_assistant_content(log), self.answer_format) for log in message_logs]
        copies = [
            a is not None and copied_from_prompt(a, prompt_text(log), m["entry"].get("answer"))
            for a, log, m in zip(answers, message_logs, metadata, strict=True)
        ]
        scores = self._scores(answers, [m["entry"] for m in metadata])
        rewards, observations, done, new_metadata, info = [], [], [], [], []
        for answer, copied, (score, error), meta in zip(answers, copies, scores, metadata, strict=True):
            tries = meta.get("tries", 0) + 1
            correct = error is None and score >= self.success_threshold
            copied = copied and not correct  # the task's own scorer may accept an answer in the question
            score = 0.0 if copied else score
            finished = correct or tries >= self.max_tries
            reward = score * self.retry_discount ** (tries - 1) if finished else 0.0
            found = answer is not None and answer.strip() and not copied
            if tries == 1 and not correct and error is None and found:
                reward = max(reward, self.format_reward)
            rewards.append(reward)
            observations.append(
                None
                if finished
                else {"role": "user", "content": self.feedback(answer, score, meta["entry"].get("answer"))}
            )
            done.append(finished)
            new_metadata.append({**meta, "tries": tries})
            info.append(
                {
                    "extracted_answer": answer,
                    "score": score,
                    "correct": correct,
                    "tries": tries,
                    "verifier_error": error,
                    "copied_prompt": copied,
                    **({"seeded": True} if meta.get("seeded") else {}),
                }
            )
        return EnvStepResult(rewards, observations, done, new_metadata, info)

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        """Per turn: `env/answer_rate`, `env/score_mean`, verifier errors; over the episodes that ended:
        `env/accuracy` (correct at the end), `env/tries_per_episode`, and `env/first_try_accuracy`
        over the episodes that were not seeded; with seeded episodes, `env/seeded_share` and
        `env/seeded_accuracy` (right after the seeded wrong try)."""
        n = max(len(results), 1)
        metrics = {
            "env/answer_rate": sum(i.get("extracted_answer") is not None for i in results.info) / n,
            "env/score_mean": sum(i.get("score", 0.0) for i in results.info) / n,
            **verifier_error_metrics(results),
        }
        ended = [i for i, d in zip(results.info, results.done, strict=True) if d]
        if not ended:
            return metrics
        metrics["env/accuracy"] = sum(bool(i.get("correct")) for i in ended) / len(ended)
        metrics["env/tries_per_episode"] = sum(i.get("tries", 1) for i in ended) / len(ended)
        own = [i for i in ended if not i.get("seeded")]
        seeded = [i for i in ended if i.get("seeded")]
        if own:
            metrics["env/first_try_accuracy"] = sum(
                bool(i.get("correct")) and i.get("tries") == 1 for i in own
            ) / len(own)
        if seeded:
            metrics["env/seeded_share"] = len(seeded) / len(ended)
            metrics["env/seeded_accuracy"] = sum(bool(i.get("correct")) for i in seeded) / len(seeded)
        return metrics
