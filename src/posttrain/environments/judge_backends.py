"""Judge backends: who writes the judge's reply to a judge prompt.

A backend has `complete(conversations) -> list[str | JudgeFailure]`: one reply per conversation (a
list of chat messages), or a `JudgeFailure` for a conversation it could not answer (the judge
environment then leaves that sample out of the loss). An exception fails the whole call (every
sample of it is masked). A conversation that ends with an assistant message asks for its
continuation (the judge's reply starts with that text, e.g. "Score:"); the backend returns only
the continuation.

- `FunctionJudge(fn)`: any function prompt text -> reply (a rule, a client of your own service).
- `TransformersJudge(model)`: a local transformers causal LM, greedy, in this process.
- `ActorJudge(TransformersJudge, kwargs, num_cpus=, num_gpus=)`: any backend in its own Ray actor,
  with the CPUs and GPUs it reserves from Ray's scheduler.
- `HTTPJudge(base_url, model)`: any OpenAI-compatible `/v1/chat/completions` endpoint (vLLM's
  server, a hosted API): per-request timeout, retries with exponential backoff on connection
  errors, timeouts, 408/409/429 and 5xx, at most `max_concurrency` requests in flight.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from posttrain.environments.interface import Message


@dataclass(frozen=True)
class JudgeFailure:
    """A conversation the backend could not answer (why, for `info["judge_error"]`)."""

    error: str


class JudgeBackend(Protocol):
    """Writes one judge reply per conversation (a list of chat messages)."""

    def complete(self, conversations: Sequence[list[Message]]) -> list[str | JudgeFailure]: ...


def failure_of(e: BaseException) -> JudgeFailure:
    return JudgeFailure(f"{type(e).__name__}: {e}"[:500])


class FunctionJudge:
    """A backend from a function `fn(prompt_text) -> judge text` (a rule-based judge, or a client of
    your own service); `prompt_text` is the last user message. A call that raises is that
    conversation's failure."""

    def __init__(self, fn: Callable[[str], str]) -> None:
        self.fn = fn

    def complete(self, conversations: Sequence[list[Message]]) -> list[str | JudgeFailure]:
        out: list[str | JudgeFailure] = []
        for conversation in conversations:
            try:
                prompt = next(m["content"] for m in reversed(conversation) if m["role"] == "user")
                out.append(str(self.fn(prompt)))
            except Exception as e:  # one failed verdict masks one sample
                out.append(failure_of(e))
        return out


class TransformersJudge:
    """A local transformers causal LM (a posttrain alias, an HF folder or a hub id), greedy.

    Loaded on first use; generates `batch_size` conversations at a time under the model's chat
    template. `num_threads`: torch CPU threads (None: torch's default).
    """

    def __init__(
        self,
        model: str,
        *,
        max_new_tokens: int = 64,
        batch_size: int = 8,
        device: str = "cpu",
        dtype: str = "float32",
        num_threads: int | None = None,
    ) -> None:
        self.model_name, self.max_new_tokens, self.batch_size = model, max_new_tokens, batch_size
        self.device, self.dtype, self.num_threads = device, dtype, num_threads
        self._model: Any = None
        self._tokenizer: Any = None

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from posttrain.checkpoint.export import resolve_model_source
        from posttrain.modeling.loading import set_torch_threads
        from posttrain.modeling.tokenizer import load_tokenizer

        set_torch_threads(self.num_threads)
        source = resolve_model_source(self.model_name)
        self._tokenizer = load_tokenizer(source.tokenizer)
        self._tokenizer.padding_side = "left"
        dtype = getattr(torch, self.dtype)
        self._model = AutoModelForCausalLM.from_pretrained(source.model, dtype=dtype).to(self.device).eval()

    def ready(self) -> bool:
        """Load the model now (an actor's first call; errors surface at start)."""
        if self._model is None:
            self._load()
        return True

    def complete(self, conversations: Sequence[list[Message]]) -> list[str | JudgeFailure]:
        import torch

        self.ready()
        tok, out = self._tokenizer, []
        for start in range(0, len(conversations), self.batch_size):
            chunk = conversations[start : start + self.batch_size]
            texts = [_render(tok, c) for c in chunk]
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


def _render(tokenizer: Any, conversation: list[Message]) -> str:
    """The conversation under the chat template, ready for the judge's reply (or the continuation
    of its last, assistant message)."""
    if conversation[-1]["role"] == "assistant":
        return tokenizer.apply_chat_template(conversation, tokenize=False, continue_final_message=True)
    return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)


class ActorJudge:
    """`backend_cls(**kwargs)` in its own Ray actor, which reserves `num_cpus` and `num_gpus` from
    Ray's scheduler (Ray is started locally if it is not running).

    `timeout_s`: the longest wait for one `complete` call (None: no limit); past it the call fails
    (every sample of it is masked) while the actor finishes the call in the background.
    """

    def __init__(
        self,
        backend_cls: type,
        kwargs: dict[str, Any],
        *,
        num_cpus: float = 0.0,
        num_gpus: float = 0.0,
        timeout_s: float | None = None,
    ) -> None:
        import ray

        if not ray.is_initialized():
            from posttrain.config.common import ClusterConfig
            from posttrain.distributed.workers import init_ray

            init_ray(ClusterConfig())
        options = {"num_cpus": num_cpus, "num_gpus": num_gpus}
        self._actor: Any = ray.remote(backend_cls).options(**options).remote(**kwargs)
        self.timeout_s = timeout_s
        ready = getattr(backend_cls, "ready", None)
        if ready is not None:
            try:
                ray.get(self._actor.ready.remote())
            except Exception:
                self.close()
                raise

    def complete(self, conversations: Sequence[list[Message]]) -> list[str | JudgeFailure]:
        import ray

        if self._actor is None:
            raise RuntimeError("the judge actor is closed")
        return ray.get(self._actor.complete.remote(list(conversations)), timeout=self.timeout_s)

    def close(self) -> None:
        """End the actor (and free what it reserved). Idempotent."""
        if self._actor is not None:
            import ray

            ray.kill(self._actor)
            self._actor = None


RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


class _Retry(Exception):
    """A failed attempt worth repeating (connection refused, timeout, 429, 5xx)."""

    def __init__(self, message: str, wait_s: float | None = None) -> None:
        super().__init__(message)
        self.wait_s = wait_s


class HTTPJudge:
    """An OpenAI-compatible chat endpoint: POST `{base_url}/chat/completions` (e.g. base_url
    "http://127.0.0.1:8000/v1" for `vllm serve`), one request per conversation, greedy by default.

    Args:
        base_url: the API root, ending in /v1.
        model: the served model's name (vLLM: `--served-model-name`, or the path given to --model).
        api_key_env: the environment variable holding the API key (sent as a Bearer token when set);
            the key itself never goes into a config.
        max_tokens, temperature: of the judge's reply.
        timeout_s: per attempt (connect and read).
        max_retries: attempts after the first, on connection errors, timeouts, 408/409/429 and 5xx;
            other 4xx answers and malformed replies fail at once.
        backoff_s, max_backoff_s: the wait before retry k is min(max_backoff_s, backoff_s * 2**k),
            times a random factor in [0.5, 1] (jitter); a 429's Retry-After (seconds) is honoured
            up to max_backoff_s.
        max_concurrency: requests in flight at once.
        extra_body: more fields for the request body (e.g. {"top_p": 1.0}).

    A conversation ending with an assistant message is sent with vLLM's `continue_final_message`
    (and no generation prompt): the server continues that message (vLLM and servers that follow it).

    `retries` counts the retries made so far (all threads).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        max_tokens: int = 64,
        temperature: float = 0.0,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        max_concurrency: int = 8,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ValueError(
                f"need max_concurrency >= 1, max_retries >= 0, timeout_s > 0; got {max_concurrency}, "
                f"{max_retries}, {timeout_s}"
            )
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key_env = model, api_key_env
        self.max_tokens, self.temperature = max_tokens, temperature
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.max_concurrency, self.extra_body = max_concurrency, dict(extra_body or {})
        self.retries = 0
        self._lock = threading.Lock()

    def complete(self, conversations: Sequence[list[Message]]) -> list[str | JudgeFailure]:
        if not conversations:
            return []
        workers = min(self.max_concurrency, len(conversations))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="judge-http") as pool:
            return list(pool.map(self.complete_one, conversations))

    def complete_one(self, messages: list[Message]) -> str | JudgeFailure:
        """One conversation's reply, retried as configured; a `JudgeFailure` when every attempt failed."""
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            **self.extra_body,
        }
        if messages and messages[-1]["role"] == "assistant":
            body.update(continue_final_message=True, add_generation_prompt=False)
        data = json.dumps(body).encode()
        for attempt in range(self.max_retries + 1):
            try:
                return self._post(data)
            except _Retry as e:
                if attempt == self.max_retries:
                    return JudgeFailure(f"{e} (after {attempt + 1} attempts)"[:500])
                with self._lock:
                    self.retries += 1
                time.sleep(self._wait(attempt, e.wait_s))
            except Exception as e:  # not worth repeating: a 4xx, a reply without a message
                return failure_of(e)
        raise AssertionError("unreachable")

    def _wait(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(self.max_backoff_s, retry_after)
        return min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _post(self, data: bytes) -> str:
        request = urllib.request.Request(self.url, data=data, headers=self._headers(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:200].decode(errors="replace")
            message = f"HTTP {e.code} from {self.url}: {detail}"
            if e.code in RETRY_STATUSES:
                raise _Retry(message, _retry_after(e.headers.get("Retry-After"))) from e
            raise RuntimeError(message) from e
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise _Retry(f"{type(reason).__name__}: {reason} ({self.url})") from e
        return _message_content(payload)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: use the exponential backoff instead
        return None


def _message_content(payload: bytes) -> str:
    """choices[0].message.content of a chat completion; ValueError for anything else."""
    try:
        content = json.loads(payload)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise ValueError(f"not a chat completion: {payload[:200]!r}") from e
    if not isinstance(content, str):
        raise ValueError(f"chat completion without text content: {payload[:200]!r}")
    return content
