"""On-policy distillation on tiny random models: the teacher's and student's sides against full-logit
references, the teacher's scores land on the right tokens, the divergence goes down, student = teacher
gives zero loss and gradient, a clear error for another tokenizer, runs end to end with resume."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from conftest import make_tiny_model_dir

from posttrain.config import load_config
from posttrain.config.common import OptimizerConfig, PolicyConfig, SchedulerConfig
from posttrain.config.rl import DistillConfig
from posttrain.data.trajectory import Trajectory
from posttrain.distributed.actor import ActorPolicy
from posttrain.distributed.student import DistillBatch, StudentActor
from posttrain.distributed.teacher_group import TokenizerMismatchError, check_same_tokenizer
from posttrain.generation.sampling import SamplingParams
from posttrain.models.distill_logprobs import (
    PositionInputs,
    student_topk_from_rows,
    teacher_topk_chunk,
)
from posttrain.models.teacher import Teacher
from posttrain.rollout.rollout import build_rl_batch
from posttrain.trainers.distill import distill_loss_fn, run_distill


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tokenizer):
    """A second tiny random model, another seed and larger weights: a peaked distribution (entropy about
    3.9 nats, top-8 mass about 0.6) where the student's is almost uniform over the 49152 tokens."""
    return make_tiny_model_dir(
        tmp_path_factory.mktemp("tiny_teacher"), tokenizer, seed=1, initializer_range=0.5
    )


# ----------------------------------------------------------------------------- the logits side
def test_student_side_matches_full_logits_in_value_and_gradient():
    """Chunked (and recomputed in backward) gathers and log-sum-exps equal the full-logits formulas, and
    their gradients w.r.t. the hidden states and the head's weight equal autograd's, float64, for chunk
    sizes 1, 3 and all rows."""
    torch.manual_seed(0)
    n, hidden, vocab, k = 7, 5, 13, 4
    head = torch.nn.Linear(hidden, vocab, bias=False).double()
    h = torch.randn(n, hidden, dtype=torch.float64)
    idx = torch.stack([torch.randperm(vocab)[:k] for _ in range(n)])
    targets = torch.randint(0, vocab, (n,))
    weights = torch.randn(4, n, dtype=torch.float64)  # an arbitrary function of the four outputs

    def objective(out) -> torch.Tensor:
        return sum(
            (w * x).sum() for w, x in zip(weights, (out[0].sum(-1), out[1], out[2], out[3]), strict=True)
        )

    h_ref = h.clone().requires_grad_(True)
    logits = head(h_ref) / 0.7
    outside = torch.ones(n, vocab, dtype=torch.bool).scatter(1, idx, False)
    lse = torch.logsumexp(logits, -1)
    ref = (
        logits.gather(1, idx),
        lse,
        torch.logsumexp(logits.masked_fill(~outside, -math.inf), -1),
        logits.gather(1, targets[:, None]).squeeze(1) - lse,
    )
    ref_grads = torch.autograd.grad(objective(ref), [h_ref, head.weight])
    for chunk in (1, 3, n):
        h_in = h.clone().requires_grad_(True)
        inputs = PositionInputs(h_in, lambda rows: head(rows) / 0.7, lean=True)
        out = student_topk_from_rows(inputs, idx, targets, chunk)
        for got, want in zip(out[:4], ref, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        assert torch.equal(out.top1, logits.argmax(-1))
        grads = torch.autograd.grad(objective(out), [h_in, head.weight])
        for got, want in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_teacher_chunk_is_the_top_k_of_the_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(5, 11, dtype=torch.float64)
    targets = torch.tensor([0, 3, 10, 2, 2])
    out = teacher_topk_chunk(logits, 3, targets)
    lp = torch.log_softmax(logits, -1)
    top, idx = lp.topk(3, -1)
    torch.testing.assert_close(out.logprobs, top.float())
    assert torch.equal(out.indices, idx.int()) and out.indices.dtype == torch.int32
    # the tail is the log of what the top-3 leave, computed over the other 8 tokens
    torch.testing.assert_close(
        out.tail_logprob.double(), torch.log1p(-top.exp().sum(-1)), rtol=1e-6, atol=1e-6
    )
    torch.testing.assert_close(out.sampled_logprob, lp.gather(1, targets[:, None]).squeeze(1).float())
    everything = teacher_topk_chunk(logits, 50, targets)  # k capped at V: nothing outside
    assert everything.logprobs.shape == (5, 11) and (everything.tail_logprob == -math.inf).all()


# ----------------------------------------------------------------------------- workers
def _cfg(lr: float = 1e-2) -> PolicyConfig:
    return PolicyConfig(
        train_micro_batch_size=3,
        optimizer=OptimizerConfig(lr=lr, max_grad_norm=None),
        scheduler=SchedulerConfig(name="constant"),
    )


def _student(model_dir, lr: float = 1e-2, **kw) -> StudentActor:
    return StudentActor(
        _cfg(lr), model_path=str(model_dir), total_steps=100, tokenizer_path=str(model_dir), **kw
    )


def _sampled_batch(policy: ActorPolicy, tokenizer, n: int = 6) -> DistillBatch:
    prompts = [tokenizer(f"What is {i} + {2 * i}?")["input_ids"] for i in range(n)]
    out = policy.generate(prompts, SamplingParams(max_new_tokens=10, seed=0), batch_size=8)
    trajectories = [
        Trajectory(p + ids, [0] * len(p) + [1] * len(ids), [0.0] * len(p) + lps, [], {}, group_id=i)
        for i, (p, ids, lps) in enumerate(zip(prompts, out.token_ids, out.logprobs, strict=True))
    ]
    return DistillBatch.of(build_rl_batch(trajectories, torch.zeros(n), tokenizer.pad_token_id))


def test_teacher_scores_land_on_the_scored_tokens(tiny_model_dir, teacher_dir, tokenizer):
    """The teacher's sampled-token log-probabilities, placed in the batch, equal the same model's
    per-token log-probabilities from the policy code; its top-1 is at least as likely; the [B, T, k]
    tensors follow row selection (trimmed like [B, T] ones)."""
    student = _student(tiny_model_dir)
    batch = _sampled_batch(student, tokenizer)
    teacher = Teacher(model_path=str(teacher_dir), batch_size=4, chunk_size=5)
    scored = batch.with_teacher(teacher.topk_logprobs(batch, k=8))
    reference = ActorPolicy(
        _cfg(), model_path=str(teacher_dir), total_steps=1, tokenizer_path=str(teacher_dir)
    )
    expected = reference.logprobs(batch)
    mask = batch.loss_mask.bool()
    torch.testing.assert_close(scored.teacher_logprobs[mask], expected[mask], rtol=1e-5, atol=1e-5)
    assert (scored.teacher_topk_logprobs[mask][:, 0] >= scored.teacher_logprobs[mask] - 1e-6).all()
    assert (scored.teacher_logprobs[~mask] == 0).all() and (scored.teacher_topk_indices[~mask] == 0).all()
    part = scored.select(2, 4)
    assert part.teacher_topk_indices.shape == (*part.input_ids.shape, 8)
    torch.testing.assert_close(
        part.teacher_topk_logprobs, scored.teacher_topk_logprobs[2:4, : part.input_ids.shape[1]]
    )


def _train_steps(student: StudentActor, batch: DistillBatch, steps: int, **knobs) -> list[dict[str, float]]:
    normalizer = float(batch.loss_mask.sum())
    loss_fn = functools.partial(distill_loss_fn, **knobs)
    out = []
    for _ in range(steps):
        result = student.train(batch, loss_fn, normalizer)
        out.append({**result.loss_metrics, "grad_norm": result.grad_norm})
    return out


@pytest.fixture(scope="module")
def peaked_student_dir(tmp_path_factory, tokenizer):
    """A student as peaked as the teacher, elsewhere (another seed)."""
    return make_tiny_model_dir(
        tmp_path_factory.mktemp("peaked_student"), tokenizer, seed=2, initializer_range=0.5
    )


@pytest.mark.parametrize(
    "knobs, drop",
    [
        (dict(divergence="forward_kl"), 0.2),
        (dict(divergence="reverse_kl"), 0.01),
        (dict(divergence="mixed_kl", top_k_mode="renormalized"), 0.5),
        (dict(divergence="jsd"), 0.01),
    ],
    ids=["forward_kl", "reverse_kl", "mixed_kl-renormalized", "jsd"],
)
def test_divergence_goes_down_on_a_fixed_batch(peaked_student_dir, teacher_dir, tokenizer, knobs, drop):
    """Teacher != student: every update on one batch (the student's samples, the teacher's top-8) lowers
    the divergence, by at least `drop` of it over 8 updates. (Reverse KL and JSD with a tail bucket
    start slowly: the student's mass on the teacher's top-8 is about 3e-5, and their gradients there
    are proportional to it.)"""
    student = _student(peaked_student_dir, lr=1e-3)
    batch = _sampled_batch(student, tokenizer)
    batch = batch.with_teacher(Teacher(model_path=str(teacher_dir)).topk_logprobs(batch, k=8))
    divergence = [h["distill/divergence"] for h in _train_steps(student, batch, 8, **knobs)]
    assert divergence[0] > 0.1
    assert all(b < a for a, b in zip(divergence, divergence[1:], strict=False)), divergence
    assert divergence[-1] < (1 - drop) * divergence[0], divergence


def test_microbatch_layouts_give_the_same_step(tiny_model_dir, teacher_dir, tokenizer):
    """1x6 = 6x1 = 2x3 microbatches, in float64 (exact math: a sum over tokens divided by the global
    count): the same loss, gradient norm and updated weights up to float64 rounding."""
    from posttrain.weights.refit import weights_checksum

    sampler = _student(tiny_model_dir)
    batch = _sampled_batch(sampler, tokenizer)
    batch = batch.with_teacher(Teacher(model_path=str(teacher_dir)).topk_logprobs(batch, k=8))
    results = {}
    for micro in (6, 1, 3):
        cfg = _cfg().model_copy(update={"train_micro_batch_size": micro})
        student = StudentActor(
            cfg, model_path=str(tiny_model_dir), total_steps=1, tokenizer_path=str(tiny_model_dir)
        )
        student.model.double()
        [metrics] = _train_steps(student, batch, 1, divergence="jsd")
        results[micro] = metrics, weights_checksum(student.model.parameters())
    ref, ref_sums = results[6]
    assert ref["distill/divergence"] > 0.1
    for micro in (1, 3):
        metrics, sums = results[micro]
        assert metrics["distill/divergence"] == pytest.approx(ref["distill/divergence"], rel=1e-12)
        assert metrics["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-12)
        assert sums == pytest.approx(ref_sums, rel=1e-12)


def test_student_equal_to_teacher_gives_zero_loss_and_gradient(tiny_model_dir, tokenizer):
    """Teacher = the student's own model, colocated in its worker: divergence 0, gradient 0, top-1
    agreement 1, sampled reverse KL 0 (fp32 rounding)."""
    teacher_kwargs = dict(model_path=str(tiny_model_dir), batch_size=4, chunk_size=7)
    student = _student(tiny_model_dir, teacher=teacher_kwargs)
    batch = _sampled_batch(student, tokenizer)
    batch = batch.with_teacher(student.teacher_topk_logprobs(batch, 16))
    for knobs in (dict(divergence="reverse_kl"), dict(divergence="jsd", top_k_mode="renormalized")):
        [metrics] = _train_steps(_student(tiny_model_dir), batch, 1, **knobs)
        assert abs(metrics["distill/divergence"]) < 1e-6, metrics
        assert metrics["grad_norm"] < 1e-5, metrics
        assert metrics["distill/top1_agreement"] == pytest.approx(1.0)
        assert abs(metrics["distill/sampled_reverse_kl"]) < 1e-5


def test_a_teacher_with_another_tokenizer_is_refused(tokenizer, tmp_path):
    from posttrain.modeling.tokenizer import load_tokenizer

    tokenizer.save_pretrained(tmp_path / "other")
    other = load_tokenizer(str(tmp_path / "other"))
    other.add_tokens(["<extra_token_for_the_test>"])
    with pytest.raises(TokenizerMismatchError, match=r"49152 tokens for the student, 49153 for the teacher"):
        check_same_tokenizer(tokenizer, other, student_name="s", teacher_name="t")
    check_same_tokenizer(
        tokenizer, load_tokenizer(str(tmp_path / "other")), student_name="s", teacher_name="t"
    )


# ----------------------------------------------------------------------------- the trainer
def _distill_cfg(model_dir, teacher, run_dir, **extra) -> DistillConfig:
    overrides = {
        "policy.model_name": str(model_dir),
        "policy.max_seq_len": 96,
        "data.example_turns": "[]",  # the quickstart's worked example does not fit in 96 tokens
        "policy.optimizer.lr": 1e-3,
        "teacher.model_name": str(teacher),
        "data.train.reasoning_gym.size": 32,
        "data.validation.reasoning_gym.size": 4,
        "distill.max_steps": 2,
        "distill.prompts_per_step": 2,
        "distill.generations_per_prompt": 2,
        "distill.topk_logits_k": 16,
        "distill.val_every": 2,
        "generation.max_new_tokens": 12,
        "cluster.backend": "local",
        "logging.run_dir": str(run_dir),
        "logging.tensorboard": False,
        **extra,
    }
    return load_config(DistillConfig, None, [f"{k}={v}" for k, v in overrides.items()])


def _check_history(history: list[dict[str, float]], steps: int) -> None:
    train = [h for h in history if "distill/divergence" in h]
    assert [h["step"] for h in train] == list(range(1, steps + 1))
    for h in train:
        assert h["distill/divergence"] > 0 and 0 <= h["distill/top1_agreement"] <= 1
        assert h["timing/teacher"] > 0 and h["distill/tokens"] > 0 and "reward/mean" in h
    assert any("val/accuracy" in h for h in history)


def test_two_distill_steps_end_to_end_and_resume(tiny_model_dir, teacher_dir, tmp_path):
    """2 steps (local backend, split teacher in-process), the second after a stop and resume from the
    checkpoint; then the same with the teacher colocated and two updates per batch."""
    cfg = _distill_cfg(tiny_model_dir, teacher_dir, tmp_path / "run", **{"teacher.placement": "split"})
    first = run_distill(cfg, stop_after=1)
    assert first.step == 1 and first.last_checkpoint.name == "step_000001"
    second = run_distill(cfg)
    assert second.step == 2 and second.last_checkpoint.name == "step_000002"
    _check_history(first.history + second.history, 2)
    assert (second.run_dir / "samples.jsonl").is_file() and (second.run_dir / "plots").is_dir()

    colocated = _distill_cfg(
        tiny_model_dir,
        teacher_dir,
        tmp_path / "colocated",
        **{"teacher.placement": "colocated", "distill.updates_per_batch": 2, "distill.loss": "reverse_kl"},
    )
    _check_history(run_distill(colocated).history, 2)


def test_cli_distill_needs_a_teacher(tiny_model_dir, tmp_path, capsys):
    from posttrain.cli import main

    args = [f"policy.model_name={tiny_model_dir}", "cluster.backend=local", f"logging.run_dir={tmp_path}"]
    assert main(["distill", *args]) == 2
    assert "teacher.model_name is not set" in capsys.readouterr().err
    assert main(["distill", *args, f"teacher.model_name={tmp_path / 'missing'}"]) == 2
    assert "no such file or directory" in capsys.readouterr().err


@pytest.mark.ray
@pytest.mark.parametrize(
    "extra",
    [
        {"teacher.placement": "split"},
        {"teacher.placement": "colocated", "cluster.num_workers": 2, "policy.fsdp": True},
    ],
    ids=["split_teacher", "fsdp2_students_colocated_teacher"],
)
def test_two_distill_steps_on_ray(ray_cluster, tiny_model_dir, teacher_dir, tmp_path, extra):
    """The teacher as its own Ray actor (1 CPU) beside the student's; or held by each of two FSDP2
    student ranks (the student's logits then come from the whole model's forward): 2 steps end to end."""
    cfg = _distill_cfg(
        tiny_model_dir,
        teacher_dir,
        tmp_path / "ray",
        **{"cluster.backend": "ray", "cluster.cpus_per_worker": 1, **extra},
    )
    _check_history(run_distill(cfg).history, 2)
