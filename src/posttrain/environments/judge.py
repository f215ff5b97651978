"""LLM-as-judge: a judge model reads the question and the reply (or two replies) and writes a verdict.

    env = JudgeEnvironment()                                       # pointwise, local SmolLM2
    env = JudgeEnvironment(mode="pairwise", backend="http", base_url="http://127.0.0.1:8000/v1",
                           model="smollm2")                        # any OpenAI-compatible server
    env = JudgeEnvironment(mode="reference", backend=FunctionJudge(my_rule))

Modes (the question is the first user message, a reply the last assistant message):

- pointwise: the judge rates each reply; the last match of `pattern` (a number) in its text, in
  [min_score, max_score], maps linearly to a reward in [0, 1]. The task's `reference`, when it has
  one, is shown to the judge.
- pairwise: the replies that share a prompt (a GRPO group) are compared pair by pair, each pair
  judged in both orders (A/B and B/A) so that a judge's preference for a position cancels. The
  judge ends with "Winner: A", "Winner: B" or "Winner: tie"; a win is 1 point, a tie 0.5, and a
  sample's reward is its points over its judged comparisons (its win rate). Identical replies tie
  without a judge call. Comparisons the judge failed on are left out; a sample with none left is
  masked. It sets `needs_whole_groups` (and `group_key`: the prompt), so `EnvironmentGroup` gives
  each group to one worker whatever environment.num_workers is.
- reference: a verifier first (math-verify of the last \\boxed{} against the task's `reference`,
  or its `answer`): a match is reward 1 without the judge; otherwise the judge decides whether the
  reply matches the reference ("Verdict: yes" -> 1, "Verdict: no" -> 0).

The verdict is parsed from the judge's output only (the reply prefix and what the judge wrote), and
the policy's reply is shown to the judge without text the verdict pattern would read (`neutralise`:
"Score: 10" becomes "[verdict removed]"), so a judge that quotes the reply cannot end on the
reply's own verdict.

A judge reply without a verdict (a parse failure) or a backend failure (after its retries) leaves
the sample out of the loss (`scored=False`, reward 0) instead of scoring it 0. Verdicts are cached
by the exact judge prompt (LRU, `cache_size` entries): a repeated judge prompt, in a later step or
in the same batch, is not sent again.

The prompts, verdict patterns and parsers are in `posttrain.environments.judge_prompts`.

Backends (`posttrain.environments.judge_backends`): "transformers" (a local model, greedy; with
`actor=True` in its own Ray actor reserving `actor_cpus` / `actor_gpus`), "http" (an OpenAI-compatible
`/chat/completions` endpoint: timeouts, retries with backoff, bounded concurrency), or any object
with `complete(conversations)`.

Metrics: `env/reward_mean`, `env/judge_calls` (verdicts looked up), `env/judge_requests` (sent to
the backend), `env/judge_cache_hits`, `env/judge_cache_hit_rate`, `env/judge_parse_failures`,
`env/judge_parse_failure_rate` (over the replies received), `env/judge_errors` (backend failures),
`env/judge_retries` (HTTP), `env/judge_masked` (samples left out of the loss), `env/judge_latency_s`
(seconds in the backend this step), `env/judge_latency_per_request_s`; by mode
`env/judge_score_mean`, `env/judge_position_consistency` (pairs whose two orders agree),
`env/verifier_match_rate`; `env/accuracy` when tasks have an `answer` (the last \\boxed{} equals it).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from posttrain.environments.interface import (
    EnvStepResult,
    Message,
    last_assistant_content,
    register_environment,
)
from posttrain.environments.judge_backends import (
    ActorJudge,
    FunctionJudge,
    HTTPJudge,
    JudgeBackend,
    JudgeFailure,
    TransformersJudge,
    failure_of,
)
from posttrain.environments.judge_prompts import (
    DEFAULT_PATTERN,
    DEFAULT_PROMPT,
    PAIRWISE_LABELS,
    PAIRWISE_PATTERN,
    PAIRWISE_PROMPT,
    REFERENCE_LABELS,
    REFERENCE_PATTERN,
    REFERENCE_PROMPT,
    Mode,
    boxed_equals,
    neutralise,
    normalise,
    parse_label,
    parse_score,
    prompt_key,
    question_of,
    reference_block,
    reference_of,
)

__all__ = [
    "DEFAULT_PATTERN",
    "FunctionJudge",
    "HTTPJudge",
    "JudgeEnvironment",
    "TransformersJudge",
    "neutralise",
    "normalise",
    "parse_label",
    "parse_score",
]


@dataclass
class Verdict:
    """One judge lookup: the judge's text (None when the backend failed), whether it came from the
    cache, and the backend's error."""

    text: str | None
    cache_hit: bool
    error: str | None = None


@dataclass
class _Tally:
    """Per-sample counts of the judge lookups made for it (summed over a batch by `batch_metrics`)."""

    calls: int = 0
    hits: int = 0
    parse_failures: int = 0
    errors: int = 0

    def add(self, verdict: Verdict, parsed: bool) -> None:
        self.calls += 1
        self.hits += verdict.cache_hit
        self.errors += verdict.text is None
        self.parse_failures += verdict.text is not None and not parsed

    def info(self) -> dict[str, int]:
        return {
            "judge_calls": self.calls,
            "judge_cache_hits": self.hits,
            "judge_parse_failures": self.parse_failures,
            "judge_errors": self.errors,
        }


def make_backend(
    backend: str | JudgeBackend,
    *,
    model: str,
    actor: bool,
    actor_cpus: float,
    actor_gpus: float,
    transformers_kwargs: dict[str, Any],
    http_kwargs: dict[str, Any],
) -> JudgeBackend:
    """The backend object for a name ("transformers", "http") or the object itself."""
    if not isinstance(backend, str):
        return backend
    if backend == "transformers":
        if actor:
            kwargs = {"model": model, **transformers_kwargs}
            return ActorJudge(TransformersJudge, kwargs, num_cpus=actor_cpus, num_gpus=actor_gpus)
        return TransformersJudge(model, **transformers_kwargs)
    if backend == "http":
        if not http_kwargs.get("base_url"):
            raise ValueError("the http judge backend needs base_url, e.g. 'http://127.0.0.1:8000/v1'")
        return HTTPJudge(model=model, **http_kwargs)
    raise ValueError(f"judge backend must be 'transformers', 'http' or an object; got {backend!r}")


@register_environment("judge")
class JudgeEnvironment:
    """LLM-as-judge reward (see the module docstring).

    Args:
        mode: "pointwise", "pairwise" or "reference".
        backend: "transformers", "http", or any `JudgeBackend` (e.g. `FunctionJudge(fn)`).
        model: the judge model: for transformers a posttrain alias, an HF folder or a hub id; for
            http the served model's name.
        prompt_template: the judge's user message; None: the mode's default. Fields: pointwise
            {question} {reply} {reference_block} {min_score} {max_score}; pairwise {question}
            {reply_a} {reply_b} {reference_block}; reference {question} {reply} {reference}.
        pattern: a regex whose first group is the verdict (pointwise: a number; pairwise: A, B or
            tie; reference: yes or no); None: the mode's default.
        min_score, max_score: pointwise score range; a score outside is a parse failure.
        cache_size: verdicts kept (0: no cache).
        reply_prefix: the start of the judge's reply, written for it (e.g. "Score:"): the judge only
            continues it, so a small judge that would not end with the verdict line still gives
            one (a few max_new_tokens suffice). The parsed text is the prefix plus the reply.
            HTTP: needs vLLM's `continue_final_message` (vLLM's server has it).
        verifier: reference mode: "math" (math-verify of the last \\boxed{}) or None (judge only).
        verifier_timeout_s: reference mode: limit for one verification.
        max_new_tokens, batch_size, device, dtype, num_threads: transformers backend.
        actor, actor_cpus, actor_gpus: transformers backend in its own Ray actor with these resources.
        base_url, api_key_env, timeout_s, max_retries, backoff_s, max_backoff_s, max_concurrency:
            http backend (see `HTTPJudge`); its replies are `max_new_tokens` long at most.
    """

    def __init__(
        self,
        mode: Mode = "pointwise",
        backend: str | JudgeBackend = "transformers",
        model: str = "smollm2-135m-instruct",
        prompt_template: str | None = None,
        pattern: str | None = None,
        min_score: float = 1,
        max_score: float = 10,
        cache_size: int = 10_000,
        reply_prefix: str | None = None,
        verifier: Literal["math"] | None = "math",
        verifier_timeout_s: float = 5.0,
        max_new_tokens: int = 64,
        batch_size: int = 8,
        device: str = "cpu",
        dtype: str = "float32",
        num_threads: int | None = None,
        actor: bool = False,
        actor_cpus: float = 0.0,
        actor_gpus: float = 0.0,
        base_url: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        max_concurrency: int = 8,
    ) -> None:
        defaults = {
            "pointwise": (DEFAULT_PROMPT, DEFAULT_PATTERN),
            "pairwise": (PAIRWISE_PROMPT, PAIRWISE_PATTERN),
            "reference": (REFERENCE_PROMPT, REFERENCE_PATTERN),
        }
        if mode not in defaults:
            raise ValueError(f"judge mode must be one of {sorted(defaults)}, got {mode!r}")
        if not max_score > min_score:
            raise ValueError(f"max_score ({max_score}) must be above min_score ({min_score})")
        if verifier not in ("math", None):
            raise ValueError(f"verifier must be 'math' or null, got {verifier!r}")
        self.mode = mode
        self.needs_whole_groups = mode == "pairwise"  # read by EnvironmentGroup
        self.prompt_template = prompt_template or defaults[mode][0]
        self.pattern = pattern or defaults[mode][1]
        if re.compile(self.pattern).groups < 1:
            raise ValueError(
                f"pattern {self.pattern!r} needs a group that captures the verdict, e.g. 'Score: (\\d+)'"
            )
        self.min_score, self.max_score, self.cache_size = min_score, max_score, cache_size
        self.reply_prefix = reply_prefix or ""
        self.backend = make_backend(
            backend,
            model=model,
            actor=actor,
            actor_cpus=actor_cpus,
            actor_gpus=actor_gpus,
            transformers_kwargs=dict(
                max_new_tokens=max_new_tokens,
                batch_size=batch_size,
                device=device,
                dtype=dtype,
                num_threads=num_threads,
            ),
            http_kwargs=dict(
                base_url=base_url,
                api_key_env=api_key_env,
                max_tokens=max_new_tokens,
                timeout_s=timeout_s,
                max_retries=max_retries,
                backoff_s=backoff_s,
                max_backoff_s=max_backoff_s,
                max_concurrency=max_concurrency,
            ),
        )
        self._verifier: Any = None
        if mode == "reference" and verifier == "math":
            from posttrain.environments.math import MathEnvironment

            self._verifier = MathEnvironment(timeout_s=verifier_timeout_s, format_reward=0.0)
        self._cache: OrderedDict[str, str] = OrderedDict()

    @staticmethod
    def group_key(log: list[Message], meta: dict[str, Any]) -> tuple:
        """The samples pairwise mode compares with each other: those with one prompt (`prompt_key`)."""
        return prompt_key(log)

    # ------------------------------------------------------------------ prompts
    def judge_prompt(self, log: list[Message], meta: dict[str, Any]) -> str:
        """The judge's user message for one sample (pointwise and reference modes); the reply is
        shown `neutralise`d (without verdict-shaped text)."""
        reply = neutralise(last_assistant_content(log), self.pattern)
        if self.mode == "reference":
            return self.prompt_template.format(
                question=question_of(log), reply=reply, reference=reference_of(meta)
            )
        return self.prompt_template.format(
            question=question_of(log),
            reply=reply,
            reference_block=reference_block(meta),
            min_score=self.min_score,
            max_score=self.max_score,
        )

    def pair_prompt(self, log_a: list[Message], log_b: list[Message], meta: dict[str, Any]) -> str:
        """The judge's user message comparing reply A (of `log_a`) with reply B (of `log_b`), both
        `neutralise`d."""
        return self.prompt_template.format(
            question=question_of(log_a),
            reply_a=neutralise(last_assistant_content(log_a), self.pattern),
            reply_b=neutralise(last_assistant_content(log_b), self.pattern),
            reference_block=reference_block(meta),
        )

    # ------------------------------------------------------------------ the judge, cached
    def judge(self, prompts: list[str]) -> tuple[list[Verdict], float, int]:
        """One verdict per judge prompt; the backend's seconds and the number of prompts sent to it.

        A prompt already in the cache, or earlier in `prompts`, is a cache hit and is not sent."""
        keys = [hashlib.sha256(p.encode()).hexdigest() for p in prompts]
        known: dict[str, str | JudgeFailure] = {k: self._cache[k] for k in keys if k in self._cache}
        hits, missing = [], {}
        for key, prompt in zip(keys, prompts, strict=True):
            hits.append(key in known or key in missing)
            if not hits[-1]:
                missing[key] = prompt
        started = time.perf_counter()
        if missing:
            conversations = [self._conversation(p) for p in missing.values()]
            try:
                replies = list(self.backend.complete(conversations))
                if len(replies) != len(conversations):
                    raise RuntimeError(f"the judge returned {len(replies)} replies for {len(conversations)}")
            except Exception as e:  # the whole call failed: these samples are not scored
                replies = [failure_of(e)] * len(conversations)
            for key, reply in zip(missing, replies, strict=True):
                known[key] = self.reply_prefix + reply if isinstance(reply, str) else reply
                if isinstance(reply, str):
                    self._remember(key, known[key])
        latency = time.perf_counter() - started
        verdicts = []
        for key, hit in zip(keys, hits, strict=True):
            reply = known[key]
            if isinstance(reply, JudgeFailure):
                verdicts.append(Verdict(None, hit, reply.error))
            else:
                verdicts.append(Verdict(reply, hit))
        return verdicts, latency, len(missing)

    def _conversation(self, prompt: str) -> list[Message]:
        """The judge's conversation: the prompt, and the start of its reply if there is one."""
        messages: list[Message] = [{"role": "user", "content": prompt}]
        if self.reply_prefix:
            messages.append({"role": "assistant", "content": self.reply_prefix})
        return messages

    def _remember(self, key: str, text: str) -> None:
        if self.cache_size <= 0:
            return
        self._cache[key] = text
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    # ------------------------------------------------------------------ modes
    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        if len(message_logs) != len(metadata):
            raise ValueError(f"{len(message_logs)} message logs but {len(metadata)} metadata entries")
        retries_before = getattr(self.backend, "retries", 0)
        if self.mode == "pairwise":
            rewards, scored, infos, latency, sent = self._pairwise(message_logs, metadata)
        else:
            rewards, scored, infos, latency, sent = self._per_sample(message_logs, metadata)
        for log, meta, info in zip(message_logs, metadata, infos, strict=True):
            if meta.get("answer") is not None:
                info["correct"] = boxed_equals(last_assistant_content(log), meta["answer"])
        out = EnvStepResult.final(rewards, metadata, infos)
        out.scored = scored
        if infos:
            infos[0]["judge_latency_s"] = latency
            infos[0]["judge_requests"] = sent
            infos[0]["judge_retries"] = getattr(self.backend, "retries", 0) - retries_before
        return out

    def _per_sample(
        self, logs: list[list[Message]], metadata: list[dict[str, Any]]
    ) -> tuple[list[float], list[bool], list[dict[str, Any]], float, int]:
        """Pointwise and reference modes: one judge lookup per sample (reference: unless verified)."""
        verified = [False] * len(logs)
        if self.mode == "reference":
            for k, meta in enumerate(metadata):
                reference_of(meta, k)
            verified = self._verify(logs, metadata)
        to_judge = [k for k, ok in enumerate(verified) if not ok]
        verdicts, latency, sent = self.judge([self.judge_prompt(logs[k], metadata[k]) for k in to_judge])
        rewards, scored = [1.0 if ok else 0.0 for ok in verified], [True] * len(logs)
        infos: list[dict[str, Any]] = [{} for _ in logs]
        for k, verdict in zip(to_judge, verdicts, strict=True):
            value = None if verdict.text is None else self._parse(verdict.text)
            tally = _Tally()
            tally.add(verdict, value is not None)
            infos[k] = {"judge_text": (verdict.text or "")[-500:], "cache_hit": verdict.cache_hit}
            infos[k].update(tally.info())
            if self.mode == "pointwise":
                infos[k]["judge_score"] = value
            if verdict.text is None:
                infos[k]["judge_error"] = verdict.error
            elif value is None:
                infos[k]["judge_error"] = "parse_failure"
            rewards[k] = 0.0 if value is None else self._reward(value)
            scored[k] = value is not None
        if self.mode == "reference":
            for k, ok in enumerate(verified):
                infos[k]["verifier_match"] = ok
        return rewards, scored, infos, latency, sent

    def _parse(self, text: str) -> float | None:
        if self.mode == "pointwise":
            return parse_score(text, self.pattern, self.min_score, self.max_score)
        if self.mode == "reference":
            return parse_label(text, self.pattern, REFERENCE_LABELS)
        return parse_label(text, self.pattern, PAIRWISE_LABELS)

    def _reward(self, value: float) -> float:
        return normalise(value, self.min_score, self.max_score) if self.mode == "pointwise" else value

    def _verify(self, logs: list[list[Message]], metadata: list[dict[str, Any]]) -> list[bool]:
        """Reference mode: whether the verifier accepts each reply (all False without a verifier)."""
        if self._verifier is None:
            return [False] * len(logs)
        answers = [{"answer": str(reference_of(meta))} for meta in metadata]
        result = self._verifier.step(logs, answers)
        return [bool(i.get("correct")) for i in result.info]

    def _pairwise(
        self, logs: list[list[Message]], metadata: list[dict[str, Any]]
    ) -> tuple[list[float], list[bool], list[dict[str, Any]], float, int]:
        """Every pair of samples with the same prompt, judged in both orders; reward = win rate."""
        groups: dict[tuple, list[int]] = {}
        for k, log in enumerate(logs):
            groups.setdefault(prompt_key(log), []).append(k)
        points, comparisons = [0.0] * len(logs), [0] * len(logs)
        tallies = [_Tally() for _ in logs]
        orders: list[tuple[int, int]] = []  # (sample in position A, sample in position B)
        for members in groups.values():
            for x, a in enumerate(members):
                for b in members[x + 1 :]:
                    if last_assistant_content(logs[a]) == last_assistant_content(logs[b]):
                        for k in (a, b):  # identical replies tie, in both orders
                            points[k] += 1.0
                            comparisons[k] += 2
                    else:
                        orders += [(a, b), (b, a)]
        prompts = [self.pair_prompt(logs[a], logs[b], metadata[a]) for a, b in orders]
        verdicts, latency, sent = self.judge(prompts)
        outcome: dict[tuple[int, int], float | None] = {}
        for (a, b), verdict in zip(orders, verdicts, strict=True):
            value = None if verdict.text is None else self._parse(verdict.text)
            tallies[a].add(verdict, value is not None)
            outcome[(a, b)] = value
            if value is not None:
                points[a] += value
                points[b] += 1.0 - value
                comparisons[a] += 1
                comparisons[b] += 1
        rewards = [p / n if n else 0.0 for p, n in zip(points, comparisons, strict=True)]
        errors: dict[int, str] = {}
        for (a, b), verdict in zip(orders, verdicts, strict=True):
            for k in (a, b):
                if verdict.error:
                    errors.setdefault(k, verdict.error)
        infos: list[dict[str, Any]] = []
        for k in range(len(logs)):
            info: dict[str, Any] = {"judge_win_rate": rewards[k] if comparisons[k] else None}
            info.update(tallies[k].info(), judge_comparisons=comparisons[k], **_consistency(outcome, k))
            if not comparisons[k]:  # nothing judged: alone in its group, a failed judge, or no verdict
                alone = len(groups[prompt_key(logs[k])]) == 1
                info["judge_error"] = "no_comparison" if alone else errors.get(k, "parse_failure")
            infos.append(info)
        return rewards, [n > 0 for n in comparisons], infos, latency, sent

    # ------------------------------------------------------------------ metrics
    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        infos, n = results.info, max(len(results), 1)
        total = {k: float(sum(i.get(k, 0) for i in infos)) for k in _Tally().info()}
        calls, hits = total["judge_calls"], total["judge_cache_hits"]
        received = calls - total["judge_errors"]
        requests = float(sum(i.get("judge_requests", 0) for i in infos))
        latency = float(sum(i.get("judge_latency_s", 0.0) for i in infos))
        metrics = {
            "env/reward_mean": sum(results.rewards) / n,
            "env/judge_calls": calls,
            "env/judge_requests": requests,
            "env/judge_cache_hits": hits,
            "env/judge_cache_hit_rate": hits / calls if calls else 0.0,
            "env/judge_parse_failures": total["judge_parse_failures"],
            "env/judge_parse_failure_rate": total["judge_parse_failures"] / received if received else 0.0,
            "env/judge_errors": total["judge_errors"],
            "env/judge_retries": float(sum(i.get("judge_retries", 0) for i in infos)),
            "env/judge_masked": float(sum(not s for s in results.scored)),
            "env/judge_latency_s": latency,
            "env/judge_latency_per_request_s": latency / requests if requests else 0.0,
        }
        scores = [i["judge_score"] for i in infos if i.get("judge_score") is not None]
        if self.mode == "pointwise":
            metrics["env/judge_score_mean"] = sum(scores) / len(scores) if scores else 0.0
        if self.mode == "pairwise":
            pairs = sum(i.get("judge_pairs", 0) for i in infos)
            agree = sum(i.get("judge_consistent_pairs", 0) for i in infos)
            metrics["env/judge_position_consistency"] = agree / pairs if pairs else 0.0
        if self.mode == "reference":
            metrics["env/verifier_match_rate"] = sum(bool(i.get("verifier_match")) for i in infos) / n
        checked = [i["correct"] for i in infos if "correct" in i]
        if checked:
            metrics["env/accuracy"] = sum(checked) / len(checked)
        return metrics

    def close(self) -> None:
        """Stop the verifier's process and the judge's actor, if any."""
        if self._verifier is not None:
            self._verifier.close()
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()


def _consistency(outcome: dict[tuple[int, int], float | None], k: int) -> dict[str, int]:
    """Pairs with k in position A first (each pair counted once): how many were judged in both
    orders, and how many of those agree (the same winner, or a tie both times)."""
    pairs = consistent = 0
    for (a, b), value in outcome.items():
        if a != k or a > b:
            continue
        swapped = outcome.get((b, a))
        if value is None or swapped is None:
            continue
        pairs += 1
        consistent += value == 1.0 - swapped
    return {"judge_pairs": pairs, "judge_consistent_pairs": consistent}
