"""The reward-model environment: scores equal transformers' forward, and GRPO steps scored by it (local, Ray)."""

import json

import pytest
import torch
from preference_helpers import preference_overrides, write_preference_jsonl

from posttrain.config import load_config
from posttrain.config.rl import GRPOConfig
from posttrain.config.supervised import RMConfig
from posttrain.environments import make_environment
from posttrain.environments.reward_model import RewardModelEnvironment
from posttrain.trainers.grpo import run_grpo
from posttrain.trainers.rm import run_rm

SYSTEM = "Put the final answer in \\boxed{}."


@pytest.fixture(scope="module")
def rm_checkpoint(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("rm")
    data = write_preference_jsonl(root / "d.jsonl", n=8)
    overrides = preference_overrides(tiny_model_dir, data, root / "run", "rm", **{"rm.max_steps": 2})
    return run_rm(load_config(RMConfig, None, overrides)).last_checkpoint


def _logs(n=3):
    return [
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is {i} + {i}?"},
            {"role": "assistant", "content": "It is " + "very " * i + f"\\boxed{{{2 * i}}}"},
        ]
        for i in range(n)
    ]


def test_scores_equal_transformers_forward_one_by_one(rm_checkpoint):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    env = make_environment("reward_model", model_path=str(rm_checkpoint), batch_size=2)
    assert isinstance(env, RewardModelEnvironment)
    logs = _logs(3)
    result = env.step(logs, [{"answer": "0"}, {"answer": "3"}, {"answer": "4"}])
    folder = rm_checkpoint / "model"
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        expected = [
            float(
                model(
                    **tok(
                        tok.apply_chat_template(log, tokenize=False),
                        add_special_tokens=False,
                        return_tensors="pt",
                    )
                ).logits
            )
            for log in logs
        ]
    assert result.rewards == pytest.approx(expected, abs=1e-5)
    assert len(set(result.rewards)) == 3
    assert [i["correct"] for i in result.info] == [True, False, True]  # ground truth, not the model's opinion
    metrics = env.batch_metrics(result)
    assert metrics["env/accuracy"] == pytest.approx(2 / 3) and metrics["env/rm_score_std"] > 0
    shifted = RewardModelEnvironment(str(folder), scale=2.0, shift=1.0).step(logs, [{}] * 3)
    assert shifted.rewards == pytest.approx([2 * r + 1 for r in expected], abs=1e-5)


def _grpo_cfg(tiny_model_dir, rm_checkpoint, run_dir, **extra) -> GRPOConfig:
    overrides = {
        "policy.model_name": str(tiny_model_dir),
        "policy.max_seq_len": 96,
        "data.example_turns": "[]",  # the quickstart's worked example does not fit in 96 tokens
        "data.train.reasoning_gym.size": 32,
        "data.validation.reasoning_gym.size": 4,
        "grpo.max_steps": 1,
        "grpo.prompts_per_step": 2,
        "grpo.generations_per_prompt": 4,
        "generation.max_new_tokens": 12,
        "environment.name": "reward_model",
        "environment.kwargs": json.dumps({"model_path": str(rm_checkpoint)}),
        "cluster.backend": "local",
        "logging.run_dir": str(run_dir),
        "logging.tensorboard": False,
        **extra,
    }
    return load_config(GRPOConfig, None, [f"{k}={v}" for k, v in overrides.items()])


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_grpo_step_scored_by_the_reward_model(request, tiny_model_dir, rm_checkpoint, tmp_path, backend):
    extra = {"cluster.backend": backend}
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
        extra["cluster.cpus_per_worker"] = 1
    result = run_grpo(_grpo_cfg(tiny_model_dir, rm_checkpoint, tmp_path / backend, **extra))
    [step] = [h for h in result.history if "reward/mean" in h]
    assert step["reward/std"] > 0 and step["grad_norm"] > 0  # real-valued rewards give nonzero advantages
    assert "env/rm_score_mean" in step and "env/accuracy" in step
    # the rewards GRPO trained on are the reward model's scores of those conversations
    samples = [json.loads(x) for x in (result.run_dir / "samples.jsonl").read_text().splitlines()]
    logs = [
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": s["prompt"]},
            {"role": "assistant", "content": s["completion"]},
        ]
        for s in samples
    ]
    scores = RewardModelEnvironment(str(rm_checkpoint)).scores(logs)
    assert [s["reward"] for s in samples] == pytest.approx(scores, abs=1e-4)
