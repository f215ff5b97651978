"""Partial rollouts: weights that change between the decode steps of one generation (tiny random model)."""

import torch
from transformers import AutoModelForCausalLM

from posttrain.config.common import PolicyConfig
from posttrain.generation.sampler import WeightUpdates, sample
from posttrain.generation.sampling import SamplingParams
from posttrain.generation.worker import GenerationWorker
from posttrain.weights.refit import SharedSnapshot

SWITCH_AT = 4  # the new weights sample tokens 4, 5, ... of every row


def _perturbed(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in state.items()}


def _recomputed(model, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """log softmax(logits / T) of each generated token, by one forward over prompt + tokens."""
    ids = torch.tensor([prompt + tokens])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@torch.no_grad()
def test_tokens_keep_the_logprobs_of_the_weights_that_sampled_them(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    old = {k: v.clone() for k, v in model.state_dict().items()}
    new = _perturbed(old, seed=1)
    polls = []

    def poll() -> int | None:  # called between decode steps: the 4th time, version 1 is published
        polls.append(len(polls))
        if len(polls) == SWITCH_AT:
            model.load_state_dict(new)
            return 1
        return None

    texts = ["What is 2 + 3?", "Add 4 and 5, then say hello to everyone", "7 + 1 ="]
    prompts = [tokenizer(t)["input_ids"] for t in texts]
    prompts = [prompts[0], prompts[1], prompts[0], prompts[2]]  # a shared prefill, left padding
    updates = WeightUpdates(poll, version=0)
    temperature = 0.7
    tokens, logprobs = sample(
        model,
        prompts,
        max_new_tokens=10,
        eos_ids={-1},
        pad_id=tokenizer.pad_token_id,
        temperature=temperature,
        seed=3,
        updates=updates,
    )
    assert updates.version == 1
    assert updates.versions == [[0] * SWITCH_AT + [1] * (10 - SWITCH_AT)] * len(prompts)
    # logits are fp32 before the log softmax: |logprob| ~ 11, fp32 rounding ~1e-6
    tolerance = 1e-5
    after_differs = 0.0
    for prompt, row_tokens, row_logprobs in zip(prompts, tokens, logprobs, strict=True):
        got = torch.tensor(row_logprobs, dtype=torch.float32)
        model.load_state_dict(old)
        under_old = _recomputed(model, prompt, row_tokens, temperature)
        model.load_state_dict(new)
        under_new = _recomputed(model, prompt, row_tokens, temperature)
        torch.testing.assert_close(got[:SWITCH_AT], under_old[:SWITCH_AT], atol=tolerance, rtol=0)
        torch.testing.assert_close(got[SWITCH_AT:], under_new[SWITCH_AT:], atol=tolerance, rtol=0)
        after_differs = max(after_differs, float((got[SWITCH_AT:] - under_old[SWITCH_AT:]).abs().max()))
    assert after_differs > 1e-3  # the switch was visible: the old weights give other logprobs


@torch.no_grad()
def test_generation_worker_polls_the_shared_snapshot(tiny_model_dir, tmp_path):
    """The worker loads snapshot version 0; a newer version written later is loaded by the poll before
    the next partial-rollout generation, whose tokens are all recorded as that version."""
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    snapshot = SharedSnapshot(policy, directory=str(tmp_path))
    snapshot.write(policy, 0)
    worker = GenerationWorker(
        PolicyConfig(model_name=str(tiny_model_dir), dtype="float32"),
        model_path=str(tiny_model_dir),
        tokenizer_path=str(tiny_model_dir),
    )
    worker.load_shared(snapshot.handle)
    assert worker.weights_version == 0 and worker.poll_snapshot() is None
    policy.load_state_dict(_perturbed(policy.state_dict(), seed=2))
    snapshot.write(policy, 1)
    params = SamplingParams(max_new_tokens=5, seed=0, partial_rollouts=True)
    out = worker.generate([[1, 2, 3], [4, 5]], params, batch_size=8)
    assert worker.weights_version == 1
    assert out.versions == [[1] * len(ids) for ids in out.token_ids]
    for name, param in worker.model.named_parameters():
        assert torch.equal(param, dict(policy.named_parameters())[name])
    assert worker.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3), 8).versions == []  # off: none
    snapshot.close()


def test_async_run_with_partial_rollouts_records_token_versions(tiny_model_dir, tmp_path):
    """Async GRPO (local backend, shared-memory snapshots) with partial rollouts runs; the buffered
    trajectories carry a version per generated token, never decreasing, and their version is the oldest."""
    from conftest import grpo_test_config

    from posttrain.trainers.grpo import GRPOTrainer
    from posttrain.trainers.rl.asynchronous import STATE_FILE

    cfg = grpo_test_config(
        tiny_model_dir,
        tmp_path / "run",
        **{
            "generation.placement": "split",
            "grpo.async_mode": True,
            "grpo.partial_rollouts": True,
            "grpo.max_trajectory_age_steps": 1,
            "grpo.max_steps": 2,
            "grpo.val_at_start": False,
            "grpo.val_every": 100,
            "checkpoint.save_every": 2,
            "logging.plots": False,
            "environment.name": "length_env:LengthEnvironment",
            "policy.optimizer.lr": 1e-3,
        },
    )
    trainer = GRPOTrainer(cfg)
    try:
        result = trainer.runtime.fit()
    finally:
        trainer.runtime.shutdown()
    rows = [h for h in result.history if "pg_loss" in h]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["async/age_max"] > 0 or "timing/old_logprobs" not in r  # shortcut only when on-policy
    saved = torch.load(result.last_checkpoint / STATE_FILE, weights_only=False)
    trajectories = [t for g in saved["buffer"]["groups"] for t in g["trajectories"]]
    assert trajectories
    for t in trajectories:
        versions = t["token_versions"]
        assert len(versions) == sum(t["loss_mask"]) and versions == sorted(versions)
        assert t["policy_version"] == versions[0]
