"""LLM-as-judge (pointwise): a judge model reads the question and the reply and writes a score.

    env = JudgeEnvironment(model="smollm2-135m-instruct")        # a local transformers model
    env = JudgeEnvironment(backend=FunctionJudge(my_rule))         # any function prompts -> texts

Per sample the judge gets `prompt_template` filled with the task's question (the first user
message), the reply (the last assistant message) and, when the task has one, its `reference`
answer. The score is the last match of `pattern` (one group, a number) in the judge's text; a
score in [min_score, max_score] becomes the reward (min_score, max_score) -> (0, 1), linearly.
A judge text without a score in range, or a backend that raises, leaves the sample out of the
loss (`scored=False`, reward 0) instead of scoring it 0. Verdicts are cached by the exact judge
prompt (LRU, `cache_size` entries): a repeated (question, reply) pair is not judged again.

Metrics: `env/judge_score_mean` (over parsed samples), `env/judge_parse_failures`,
`env/judge_errors`, `env/judge_cache_hits`, `env/judge_latency_s` (time in the backend this step).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from posttrain.environments.interface import (
    EnvStepResult,
    Message,
    last_assistant_content,
    register_environment,
)

DEFAULT_PROMPT = (
    "Rate the assistant's answer to the question below from {min_score} (useless) to {max_score} "
    "(perfect), for correctness and helpfulness.{reference_block}\n\n"
    "Question:\n{question}\n\nAnswer:\n{reply}\n\n"
    "Give a one-sentence reason, then end with a line 'Score: <number>'."
)
DEFAULT_PATTERN = r"[Ss]core\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)(?!\w|\.\d)"


def parse_score(
    text: str, pattern: str = DEFAULT_PATTERN, min_score: float = 1, max_score: float = 10
) -> float | None:
    """The last number `pattern` captures in `text`, if within [min_score, max_score]; else None."""
    matches = re.findall(pattern, text or "")
    if not matches:
        return None
    last = matches[-1]
    try:
        value = float(last if isinstance(last, str) else last[0])
    except ValueError:
        return None
    if not min_score <= value <= max_score:  # also rejects nan
        return None
    return value


def normalise(score: float, min_score: float, max_score: float) -> float:
    """`score` in [min_score, max_score] mapped linearly to [0, 1]."""
    return (score - min_score) / (max_score - min_score)


class JudgeBackend(Protocol):
    """Writes one judge reply per conversation (a list of chat messages)."""

    def complete(self, conversations: Sequence[list[Message]]) -> list[str]: ...


class FunctionJudge:
    """A backend from a function `fn(prompt_text) -> judge text` (a rule-based judge, or a client of
    your own service)."""

    def __init__(self, fn: Callable[[str], str]) -> None:
        self.fn = fn

    def complete(self, conversations: Sequence[list[Message]]) -> list[str]:
        return [self.fn(c[-1]["content"]) for c in conversations]


class TransformersJudge:
    """A local transformers causal LM (a posttrain alias, an HF folder or a hub id), greedy.

    Loaded on first use; generates `batch_size` conversations at a time under the model's chat template.
    """

    def __init__(
        self,
        model: str,
        *,
        max_new_tokens: int = 64,
        batch_size: int = 8,
        device: str = "cpu",
        dtype: str = "float32",
    ) -> None:
        self.model_name, self.max_new_tokens, self.batch_size = model, max_new_tokens, batch_size
        self.device, self.dtype = device, dtype
        self._model: Any = None
        self._tokenizer: Any = None

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from posttrain.checkpoint.export import resolve_model_source
        from posttrain.models.tokenizer import load_tokenizer

        source = resolve_model_source(self.model_name)
        self._tokenizer = load_tokenizer(source.tokenizer)
        self._tokenizer.padding_side = "left"
        dtype = getattr(torch, self.dtype)
        self._model = (
            AutoModelForCausalLM.from_pretrained(source.model, torch_dtype=dtype).to(self.device).eval()
        )

    def complete(self, conversations: Sequence[list[Message]]) -> list[str]:
        import torch

        if self._model is None:
            self._load()
        tok, out = self._tokenizer, []
        for start in range(0, len(conversations), self.batch_size):
            chunk = conversations[start : start + self.batch_size]
            texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chunk]
            batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
            with torch.no_grad():
                ids = self._model.generate(
                    **batch,
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                )
            out += tok.batch_decode(ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        return out


def _question(log: list[Message]) -> str:
    """The first user message's content."""
    return next((m.get("content") or "" for m in log if m.get("role") == "user"), "")


@register_environment("judge")
class JudgeEnvironment:
    """Pointwise LLM-as-judge reward (see the module docstring).

    Args:
        model: the judge model for the transformers backend (ignored when `backend` is given).
        backend: any `JudgeBackend` (e.g. `FunctionJudge`); default a `TransformersJudge(model)`.
        prompt_template: with {question}, {reply}, {reference_block}, {min_score}, {max_score}.
        pattern: a regex whose (first) group is the score.
        min_score, max_score: the score range; scores outside are parse failures.
        cache_size: verdicts kept (0: no cache).
        max_new_tokens, batch_size, device, dtype: for the transformers backend.
    """

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        backend: JudgeBackend | None = None,
        prompt_template: str = DEFAULT_PROMPT,
        pattern: str = DEFAULT_PATTERN,
        min_score: float = 1,
        max_score: float = 10,
        cache_size: int = 10_000,
        max_new_tokens: int = 64,
        batch_size: int = 8,
        device: str = "cpu",
        dtype: str = "float32",
    ) -> None:
        if not max_score > min_score:
            raise ValueError(f"max_score ({max_score}) must be above min_score ({min_score})")
        if re.compile(pattern).groups < 1:
            raise ValueError(
                f"pattern {pattern!r} needs a group that captures the score, e.g. 'Score: (\\d+)'"
            )
        self.backend = backend or TransformersJudge(
            model, max_new_tokens=max_new_tokens, batch_size=batch_size, device=device, dtype=dtype
        )
        self.prompt_template, self.pattern = prompt_template, pattern
        self.min_score, self.max_score, self.cache_size = min_score, max_score, cache_size
        self._cache: OrderedDict[str, str] = OrderedDict()

    def judge_prompt(self, log: list[Message], meta: dict[str, Any]) -> str:
        """The judge's user message for one sample."""
        reference = meta.get("reference")
        block = f"\n\nA reference answer:\n{reference}" if reference else ""
        return self.prompt_template.format(
            question=_question(log),
            reply=last_assistant_content(log),
            reference_block=block,
            min_score=self.min_score,
            max_score=self.max_score,
        )

    def _judge(self, prompts: list[str]) -> tuple[list[str | None], list[bool], float, str | None]:
        """Judge texts (None where the backend failed), cache hits, backend seconds, the error."""
        keys = [hashlib.sha256(p.encode()).hexdigest() for p in prompts]
        hits = [k in self._cache for k in keys]
        missing = list(dict.fromkeys(k for k, h in zip(keys, hits, strict=True) if not h))
        by_key = {k: p for k, p in zip(keys, prompts, strict=True)}
        error, started = None, time.perf_counter()
        if missing:
            try:
                texts = self.backend.complete([[{"role": "user", "content": by_key[k]}] for k in missing])
                fresh = dict(zip(missing, texts, strict=True))
            except Exception as e:  # the judge failed: these samples are not scored
                fresh, error = {}, f"{type(e).__name__}: {e}"[:500]
        else:
            fresh = {}
        latency = time.perf_counter() - started
        out = [self._cache[k] if h else fresh.get(k) for k, h in zip(keys, hits, strict=True)]
        for k, text in fresh.items():
            self._remember(k, text)
        return out, hits, latency, error

    def _remember(self, key: str, text: str) -> None:
        if self.cache_size <= 0:
            return
        self._cache[key] = text
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        prompts = [self.judge_prompt(log, meta) for log, meta in zip(message_logs, metadata, strict=True)]
        texts, hits, latency, error = self._judge(prompts)
        rewards, infos, scored = [], [], []
        for text, hit in zip(texts, hits, strict=True):
            score = None if text is None else parse_score(text, self.pattern, self.min_score, self.max_score)
            info: dict[str, Any] = {"judge_text": (text or "")[-500:], "judge_score": score, "cache_hit": hit}
            if text is None:
                info["judge_error"] = error
            elif score is None:
                info["judge_error"] = "parse_failure"
            rewards.append(0.0 if score is None else normalise(score, self.min_score, self.max_score))
            infos.append(info)
            scored.append(score is not None)
        out = EnvStepResult.final(rewards, metadata, infos)
        out.scored = scored
        if infos:
            infos[0]["judge_latency_s"] = latency
        return out

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        infos = results.info
        scores = [i["judge_score"] for i in infos if i.get("judge_score") is not None]
        return {
            "env/judge_score_mean": sum(scores) / len(scores) if scores else 0.0,
            "env/judge_parse_failures": float(sum(i.get("judge_error") == "parse_failure" for i in infos)),
            "env/judge_errors": float(
                sum(i.get("judge_error") not in (None, "parse_failure") for i in infos)
            ),
            "env/judge_cache_hits": float(sum(bool(i.get("cache_hit")) for i in infos)),
            "env/judge_latency_s": float(sum(i.get("judge_latency_s", 0.0) for i in infos)),
        }
