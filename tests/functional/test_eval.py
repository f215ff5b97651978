"""`posttrain eval` end to end: summary and per-sample files agree, on a checkpoint and on SmolLM2."""

import json
import math

import pytest

from posttrain.cli import main
from posttrain.config import load_config
from posttrain.config.eval import EvalConfig
from posttrain.trainers.eval import run_eval, vote_key


def _problems(path, n=6):
    with open(path, "w") as f:
        for a in range(n):
            f.write(json.dumps({"question": f"What is {a} + {a + 1}?", "answer": str(2 * a + 1)}) + "\n")
    return path


def _overrides(model, data, out, **extra):
    base = {
        "model": str(model),
        "data.dataset.path": str(data),
        "data.dataset.problem_key": "question",
        "generation.max_new_tokens": 24,
        "output_dir": str(out),
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _check_files_agree(out, n, ks):
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert len(rows) == summary["num_problems"] * n
    assert set(rows[0]) >= {"prompt", "completion", "extracted_answer", "correct", "answer"}
    by_problem = [rows[i * n : (i + 1) * n] for i in range(summary["num_problems"])]
    for k in ks:  # pass@k recomputed with exact binomials
        expected = sum(
            1 - math.comb(n - sum(r["correct"] for r in p), k) / math.comb(n, k) for p in by_problem
        ) / len(by_problem)
        assert summary[f"pass@{k}"] == pytest.approx(expected)
    assert summary["accuracy"] == pytest.approx(sum(r["correct"] for r in rows) / len(rows))
    return rows, summary


def test_eval_a_checkpoint_through_the_cli(tiny_model_dir, tmp_path, capsys):
    from conftest import sft_overrides, write_sft_jsonl

    from posttrain.config.supervised import SFTConfig
    from posttrain.trainers.sft import run_sft

    sft_data = write_sft_jsonl(tmp_path / "sft.jsonl", n=16)
    run_sft(
        load_config(
            SFTConfig, None, sft_overrides(tiny_model_dir, sft_data, tmp_path / "run", **{"sft.max_steps": 2})
        )
    )
    data = _problems(tmp_path / "problems.jsonl")
    overrides = _overrides(
        tmp_path / "run",
        data,
        tmp_path / "eval",
        **{"sampling.samples_per_prompt": 3, "sampling.k": "[1,3]", "generation.temperature": 1.0},
    )
    assert main(["eval", *overrides]) == 0
    assert "pass@1=" in capsys.readouterr().out
    rows, summary = _check_files_agree(tmp_path / "eval", 3, [1, 3])
    assert summary["checkpoint"].endswith("step_000002") and summary["num_problems"] == 6
    assert summary["samples_per_prompt"] == 3 and 0 <= summary["cons@3"] <= 1


def test_a_checkpoint_evaluates_in_the_dtype_its_run_computed_in(tiny_model_dir, tmp_path):
    """dtype=auto: a checkpoint of a bf16-compute run evaluates in bfloat16 (its fp32 master weights are
    not the function the run trained); dtype=float32 on that checkpoint warns."""
    from conftest import sft_overrides, write_sft_jsonl

    from posttrain.config.common import ConfigWarning
    from posttrain.config.supervised import SFTConfig
    from posttrain.trainers.sft import run_sft

    sft_data = write_sft_jsonl(tmp_path / "sft.jsonl", n=8)
    extra = {"sft.max_steps": 1, "policy.dtype": "bfloat16"}
    run_sft(load_config(SFTConfig, None, sft_overrides(tiny_model_dir, sft_data, tmp_path / "run", **extra)))
    data = _problems(tmp_path / "problems.jsonl", n=2)

    def evaluate(model, out, **extra):
        cfg = load_config(EvalConfig, None, _overrides(model, data, tmp_path / out, **extra))
        return run_eval(cfg).summary["dtype"]

    assert evaluate(tmp_path / "run", "auto") == "bfloat16"  # other models: tests/unit/test_weights_dtype.py
    with pytest.warns(ConfigWarning, match="fp32 master weights"):
        assert evaluate(tmp_path / "run", "fp32", dtype="float32") == "float32"


def test_an_eval_whose_verifier_fails_is_an_error_not_zero_accuracy(tiny_model_dir, tmp_path):
    """A reward function that raises scores every episode 0; the eval writes its samples (each with
    its error) and then stops with an error naming the environment, instead of reporting 0% accuracy.
    With environment.max_error_fraction=null it reports, and the summary says how many failed."""
    from posttrain.environments.interface import VerifierErrorsError

    data = _problems(tmp_path / "problems.jsonl", n=3)
    broken = {"environment.name": "reward_fn", "environment.kwargs.reward_fn": "flaky_env:broken_reward"}
    cfg = load_config(EvalConfig, None, _overrides(tiny_model_dir, data, tmp_path / "eval", **broken))
    with pytest.raises(VerifierErrorsError, match="3 of 3 samples could not be scored"):
        run_eval(cfg)
    rows = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all("KeyError" in r["verifier_error"] for r in rows)
    lenient = _overrides(
        tiny_model_dir, data, tmp_path / "eval2", **broken, **{"environment.max_error_fraction": "null"}
    )
    summary = run_eval(load_config(EvalConfig, None, lenient)).summary
    assert summary["verifier_error_rate"] == 1.0 and summary["accuracy"] == 0.0


def test_k_above_n_is_a_config_error(tmp_path):
    from posttrain.config import ConfigError

    with pytest.raises(ConfigError, match="every k must be between 1 and sampling.samples_per_prompt=2"):
        load_config(EvalConfig, None, ["sampling.samples_per_prompt=2", "sampling.k=[1,4]"])


@pytest.mark.slow
def test_eval_smollm2_scores_real_answers(smollm_dir, tmp_path):
    """The quickstart's held-out problems (reasoning-gym, the default data), first 8."""
    overrides = {
        "model": str(smollm_dir),
        "data.dataset.max_samples": 8,
        "sampling.samples_per_prompt": 2,
        "sampling.k": "[1,2]",
        "generation.temperature": 0.7,
        "output_dir": str(tmp_path / "eval"),
    }
    result = run_eval(load_config(EvalConfig, None, [f"{k}={v}" for k, v in overrides.items()]))
    rows, summary = _check_files_agree(tmp_path / "eval", 2, [1, 2])
    assert summary["num_problems"] == 8
    assert all(r["completion"].strip() for r in rows) and summary["mean_completion_tokens"] > 2
    for r in rows:  # math-verify's verdict agrees with a plain integer comparison on these answers
        assert r["correct"] == (vote_key(r["extracted_answer"]) == r["answer"])
    assert result.summary == summary


def test_records_read_boxed_answers_with_the_math_environment(tokenizer):
    """Scoring without a model: replies written by hand (a scripted generator), judged by the real
    math environment through the same rollout code as training."""
    from posttrain.environments.group import EnvironmentGroup
    from posttrain.generation.sampling import GenerationOutput, SamplingParams
    from posttrain.rollout.rollout import run_rollouts
    from posttrain.trainers.eval import sample_records, summarize

    texts = ["So \\boxed{3}.", "It is 3.", "\\boxed{3.0}", "\\boxed{10}", "\\boxed{1 + 9}", "\\boxed{12}"]

    class Scripted:
        def generate(self, prompt_ids, params, batch_size):
            ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
            return GenerationOutput(ids, [[0.0] * len(i) for i in ids], [False] * len(ids))

    tasks = [
        {"messages": [{"role": "user", "content": "1 + 2?"}], "answer": "3"},
        {"messages": [{"role": "user", "content": "5 + 5?"}], "answer": "10"},
    ]
    with EnvironmentGroup("math", {}, backend="local") as env:
        rollouts = run_rollouts(
            tasks,
            generations_per_prompt=3,
            generator=Scripted(),
            environment=env,
            tokenizer=tokenizer,
            params=SamplingParams(),
            batch_size=8,
            max_turns=1,
            max_seq_len=256,
        )
    records = sample_records(rollouts, 3)
    assert [r.completion for r in records] == texts
    assert [r.extracted_answer for r in records] == ["3", None, "3.0", "10", "1 + 9", "12"]
    assert [r.correct for r in records] == [True, False, True, True, False, False]
    assert [(r.problem_index, r.sample_index) for r in records][:4] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert [r.answer for r in records] == ["3"] * 3 + ["10"] * 3 and records[0].prompt == "1 + 2?"
    out = summarize(
        [[r.correct for r in records[:3]], [r.correct for r in records[3:]]],
        [[r.extracted_answer for r in records[:3]], [r.extracted_answer for r in records[3:]]],
        [1, 3],
    )
    # problem 0: c=2 of 3; "3" and "3.0" vote together -> right. problem 1: c=1, three-way tie -> "10" (first)
    assert out["pass@1"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert out["pass@3"] == 1.0 and out["cons@3"] == 1.0
