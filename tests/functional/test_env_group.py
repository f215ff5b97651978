"""EnvironmentGroup: MathEnvironment in Ray actors (order, hung verifiers, whole-batch errors) and in-process."""

from __future__ import annotations

import sys
import time

import pytest

from posttrain.distributed.workers import WorkerError
from posttrain.environments import EnvironmentGroup, EnvStepResult

# Ray actors cannot import this test module by name: send its functions and classes by value.
# (A driver script's own functions, in `__main__`, go by value without this.)
pytest.importorskip("ray").cloudpickle.register_pickle_by_value(sys.modules[__name__])


def hanging_verify(prediction: str, answer: str) -> bool:
    if prediction == "hang":
        time.sleep(60)
    return prediction == answer


class BrokenEnvironment:
    """Fails the whole batch: a bug in an environment, not a verifier error."""

    def step(self, message_logs, metadata) -> EnvStepResult:
        raise RuntimeError("environment bug")

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        return {}


def math_batch(n: int) -> tuple[list, list]:
    """Sample k answers k*7 (as a fraction for even k); every third sample is wrong."""
    logs, metadata = [], []
    for k in range(n):
        guess = k * 7 + (1 if k % 3 == 0 else 0)
        boxed = f"\\frac{{{2 * guess}}}{{2}}" if k % 2 == 0 else str(guess)
        logs.append(
            [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": f"\\boxed{{{boxed}}}"}]
        )
        metadata.append({"answer": str(k * 7), "index": k})
    return logs, metadata


@pytest.mark.ray
def test_math_in_two_ray_actors_keeps_order(ray_cluster):
    envs = EnvironmentGroup("math", {"timeout_s": 10.0, "format_reward": 0.0}, num_workers=2)
    try:
        assert envs.num_workers == 2
        for n in (13, 1):  # uneven split; fewer samples than workers
            logs, metadata = math_batch(n)
            result = envs.step(logs, metadata)
            assert [m["index"] for m in result.metadata] == list(range(n))
            assert [i["extracted_answer"] for i in result.info] == [log[-1]["content"][7:-1] for log in logs]
            assert result.rewards == [0.0 if k % 3 == 0 else 1.0 for k in range(n)]
        logs, metadata = math_batch(12)
        metrics = envs.batch_metrics(envs.step(logs, metadata))
        assert metrics["env/accuracy"] == pytest.approx(8 / 12)
        assert metrics["env/boxed_rate"] == 1.0
        assert metrics["env/verifier_errors"] == 0
        assert len(envs.step([], [])) == 0
    finally:
        envs.shutdown()


@pytest.mark.ray
def test_hanging_verifier_through_ray(ray_cluster):
    envs = EnvironmentGroup(
        "math", {"timeout_s": 1.0, "format_reward": 0.0, "verify_fn": hanging_verify}, num_workers=2
    )
    try:
        answers = [str(k) for k in range(8)]
        predictions = list(answers)
        predictions[2] = predictions[6] = "hang"  # one hung sample in each actor's chunk
        logs = [[{"role": "assistant", "content": f"\\boxed{{{p}}}"}] for p in predictions]
        start = time.monotonic()
        result = envs.step(logs, [{"answer": a} for a in answers])
        elapsed = time.monotonic() - start
        assert elapsed < 30, f"hung verifiers (60 s) blocked the batch for {elapsed:.1f}s"
        assert result.rewards == [0.0 if k in (2, 6) else 1.0 for k in range(8)]
        assert [i["verifier_error"] for i in result.info] == [
            "timeout" if k in (2, 6) else None for k in range(8)
        ]
        metrics = envs.batch_metrics(result)
        assert metrics["env/verifier_timeouts"] == 2
        assert metrics["env/verifier_errors"] == 2

        result = envs.step(logs[:2], [{"answer": "0"}, {"answer": "9"}])  # still works
        assert result.rewards == [1.0, 0.0]
    finally:
        envs.shutdown()


@pytest.mark.ray
def test_whole_batch_error_names_the_actor(ray_cluster):
    envs = EnvironmentGroup(BrokenEnvironment, num_workers=1)
    try:
        with pytest.raises(WorkerError, match=r"env-BrokenEnvironment-0(.|\n)*environment bug"):
            envs.step([[{"role": "assistant", "content": "x"}]], [{}])
    finally:
        envs.shutdown()


@pytest.mark.ray
def test_bad_constructor_arguments_fail_at_start(ray_cluster):
    with pytest.raises(WorkerError, match="env-math-0"):
        EnvironmentGroup("math", {"no_such_argument": 1})


def test_local_backend():
    envs = EnvironmentGroup("math", {"timeout_s": 10.0, "format_reward": 0.0}, backend="local", num_workers=4)
    try:
        logs, metadata = math_batch(6)
        result = envs.step(logs, metadata)
        assert result.rewards == [0.0 if k % 3 == 0 else 1.0 for k in range(6)]
        assert envs.batch_metrics(result)["env/accuracy"] == pytest.approx(4 / 6)
    finally:
        envs.shutdown()
    with pytest.raises(WorkerError, match=r"env-BrokenEnvironment-0 \(local\)"):
        EnvironmentGroup(BrokenEnvironment, backend="local").step([[]], [{}])


def longer_wins(prompt: str) -> str:
    """A fair pairwise judge: the longer reply wins, equal lengths tie."""
    a = prompt.split("Answer A:\n")[1].split("\n\nAnswer B:")[0]
    b = prompt.split("Answer B:\n")[1].split("\n\n")[0]
    return "Winner: tie" if len(a) == len(b) else f"Winner: {'A' if len(a) > len(b) else 'B'}"


@pytest.mark.ray
def test_pairwise_judge_groups_stay_whole_across_two_actors(ray_cluster):
    """Two groups, interleaved: contiguous halves would cut both; each must reach one actor whole.
    Group q has replies of lengths 1, 2, 2, 3 (win rates 0, 1/2, 1/2, 1 over 6 comparisons each),
    group p lengths 1 and 2 (0 and 1 over 2)."""
    from posttrain.environments.judge_backends import FunctionJudge

    replies = [("q", "x"), ("q", "yy"), ("p", "a"), ("q", "zz"), ("p", "bb"), ("q", "www")]
    logs = [[{"role": "user", "content": q}, {"role": "assistant", "content": r}] for q, r in replies]
    metadata = [{"index": k} for k in range(len(logs))]
    kwargs = {"mode": "pairwise", "backend": FunctionJudge(longer_wins)}
    with EnvironmentGroup("judge", kwargs, num_workers=2) as envs:
        result = envs.step(logs, metadata)
    assert [m["index"] for m in result.metadata] == list(range(6))
    assert [i["judge_comparisons"] for i in result.info] == [6, 6, 2, 6, 2, 6]
    assert result.rewards == [0.0, 0.5, 0.0, 0.5, 1.0, 1.0] and all(result.scored)


class WholeGroupsWithoutKey:
    needs_whole_groups = True

    def step(self, message_logs, metadata) -> EnvStepResult:
        return EnvStepResult.final([0.0] * len(message_logs), metadata, [{}] * len(message_logs))

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        return {}


def test_whole_groups_without_a_group_key_are_refused():
    with pytest.raises(ValueError, match="group_key"):
        EnvironmentGroup(WholeGroupsWithoutKey, backend="local")
