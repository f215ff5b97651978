"""Pure parts of asynchronous GRPO: when a batch is exactly on-policy, importance-ratio statistics."""

import math

import pytest
import torch

from posttrain.algorithms.importance import importance_weights
from posttrain.algorithms.metrics import importance_ratio_stats
from posttrain.data.trajectory import Trajectory
from posttrain.rollout.replay_buffer import RolloutGroup
from posttrain.trainers.rl.asynchronous import age_metrics, exactly_on_policy


def test_exactly_on_policy_only_when_every_row_has_the_trainers_version():
    assert exactly_on_policy(torch.tensor([3, 3, 3]), 3)
    assert not exactly_on_policy(torch.tensor([3, 2, 3]), 3)  # one stale row: π_old must be recomputed
    assert not exactly_on_policy(torch.tensor([-1, -1]), 0)  # unknown versions are never on-policy
    assert not exactly_on_policy(None, 0)
    assert not exactly_on_policy(torch.tensor([], dtype=torch.long), 0)


def test_importance_weight_is_one_when_generator_and_trainer_agree():
    lp = torch.tensor([[0.0, -0.3, -1.7, -2.2], [0.0, -0.01, -4.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.float64)
    stats = importance_ratio_stats(lp, lp.clone(), mask)
    assert stats == {"mean": 1.0, "min": 1.0, "max": 1.0, "std": 0.0, "out_of_bounds": 0.0}
    for correction in ("truncated", "icepop", "seq_mask"):
        w, out = importance_weights(lp, lp.clone(), mask, correction=correction, cap=2.0, min_ratio=0.5)
        assert torch.equal(w, mask) and not out.any()


def test_importance_ratio_stats_hand_worked():
    old = torch.tensor([[0.0, math.log(0.5), math.log(0.2), 5.0]], dtype=torch.float64)
    behaviour = torch.tensor([[0.0, math.log(0.25), math.log(0.4), -5.0]], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 0]], dtype=torch.float64)  # ratios 2 and 0.5; the masked 5 - (-5) ignored
    stats = importance_ratio_stats(old, behaviour, mask, low=0.6, high=1.5)
    assert stats["mean"] == 1.25 and stats["min"] == 0.5 and stats["max"] == 2.0
    assert abs(stats["std"] - 0.75) < 1e-15 and stats["out_of_bounds"] == 1.0


def test_age_metrics():
    def group(version):
        return RolloutGroup([Trajectory([1], [0], [0.0], [], {}, 0)], version, 0)

    m = age_metrics([group(4), group(4), group(3), group(2)], version=4, max_age=2)
    assert m["async/age_mean"] == 0.75 and m["async/age_max"] == 2.0
    assert (m["async/age_0_fraction"], m["async/age_1_fraction"], m["async/age_2_fraction"]) == (
        0.5,
        0.25,
        0.25,
    )


def _grpo(**sections):
    from posttrain.config.rl import GRPOConfig

    base = {"grpo": {"async_mode": True}, "generation": {"placement": "split"}, "cluster": {"backend": "ray"}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return GRPOConfig.model_validate(base)


def test_async_config_rules():
    import pytest

    assert _grpo().loss.importance_correction == "truncated"  # async default
    assert _grpo(loss={"importance_correction": None}).loss.importance_correction is None  # explicit choice
    assert _grpo(loss={"importance_correction": "icepop"}).loss.importance_correction == "icepop"
    with pytest.raises(ValueError, match="generation.placement=split"):
        _grpo(generation={"placement": "colocated"})
    with pytest.raises(ValueError, match="collective"):
        _grpo(generation={"refit_transport": "collective"})
    with pytest.raises(ValueError, match="dynamic_sampling"):
        _grpo(dapo={"dynamic_sampling": True})
    with pytest.raises(ValueError, match="async_buffer_groups"):
        _grpo(grpo={"async_buffer_groups": 2})
    from posttrain.config.rl import GRPOConfig

    assert GRPOConfig().loss.importance_correction is None  # synchronous default unchanged


def test_partial_rollouts_config_rules():
    import pytest

    assert _grpo().grpo.partial_rollouts is False  # off by default
    assert _grpo(grpo={"partial_rollouts": True}).grpo.partial_rollouts  # ray on one CPU node: shared memory
    with pytest.raises(ValueError, match="needs grpo.async_mode=true"):
        _grpo(grpo={"async_mode": False, "partial_rollouts": True})
    with pytest.raises(ValueError, match="generation.backend=hf"):
        _grpo(grpo={"partial_rollouts": True}, generation={"backend": "vllm"})
    with pytest.raises(ValueError, match="the refit transport here is object_store"):
        _grpo(grpo={"partial_rollouts": True}, generation={"refit_transport": "object_store"})
    with pytest.raises(ValueError, match="turn_barrier=true"):
        _grpo(grpo={"partial_rollouts": True}, environment={"max_turns": 2, "turn_barrier": False})
    assert _grpo(grpo={"partial_rollouts": True}, environment={"max_turns": 2, "turn_barrier": True})


def test_partial_rollout_trajectory_is_as_old_as_its_oldest_token():
    """A trajectory whose tokens came from versions 3 then 5 is version 3 (its age counts from there),
    its group takes its oldest trajectory's version, and the batch is not on-policy at version 5."""
    from posttrain.rollout.rollout import Rollouts
    from posttrain.trainers.rl.asynchronous import group_rollouts

    def traj(group_id, versions):
        return Trajectory([1] * 3, [1] * 3, [0.0] * 3, [], {}, group_id, token_versions=versions)

    switched, late, whole = traj(0, [3, 3, 5]), traj(0, [5, 5, 5]), traj(1, [])
    groups = group_rollouts(Rollouts([switched, late, whole], {}), version=3, batch_index=7, metrics={})
    assert [t.policy_version for t in (switched, late, whole)] == [3, 5, 3]  # no versions: the batch's
    assert [g.policy_version for g in groups] == [3, 3]
    assert groups[0].age(5) == 2
    assert not exactly_on_policy(torch.tensor([switched.policy_version, late.policy_version]), 5)
    assert exactly_on_policy(torch.tensor([late.policy_version]), 5)


# Engine mismatch vs staleness (issue #29 item 12), a hand-built batch; the trainer is at version 5.
#   row 0: version 5 (fresh), valid t0 t1:  gen - old = [0, ln 2]      -> exp|.| = [1, 2]
#   row 1: version 4 (stale), valid t0..t2: gen - old = [ln 4, 0, -ln 4] -> exp|.| = [4, 1, 4]
#   row 2: version 5 (fresh), valid t1 t2:  gen - old = [-ln 2, 0]     -> exp|.| = [2, 1]
# fresh: token_mult_prob_error = (1 + 2 + 2 + 1) / 4 = 1.5; gen_kl = mean k3 with log r = old - gen:
#   k3(-ln 2) = 1/2 + ln 2 - 1, k3(ln 2) = 2 - ln 2 - 1 -> sum 0.5 -> 0.125
# stale: (4 + 1 + 4) / 3 = 3; k3(-ln 4) = 1/4 + ln 4 - 1, k3(ln 4) = 4 - ln 4 - 1 -> sum 2.25 -> 0.75
# all rows together (what the loss reported before): (1 + 2 + 4 + 1 + 4 + 2 + 1) / 7 = 15 / 7
LN2, LN4, NAN = math.log(2), math.log(4), float("nan")


def _gap_batch(versions=(5, 4, 5), old_logprobs=True):
    from posttrain.rollout.rollout import RLBatch

    old = torch.tensor([[-1.0, -2.0, NAN], [-1.0, -1.0, -1.0], [NAN, -0.5, -3.0]], dtype=torch.float64)
    gap = torch.tensor([[0.0, LN2, 0.0], [LN4, 0.0, -LN4], [0.0, -LN2, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    return RLBatch(
        input_ids=torch.zeros(3, 3, dtype=torch.long),
        attention_mask=torch.ones(3, 3, dtype=torch.long),
        loss_mask=mask,
        advantages=torch.tensor([1.0, -1.0, 0.5]),
        generation_logprobs=old + gap,
        old_logprobs=old if old_logprobs else None,
        policy_versions=torch.tensor(versions),
    )


def test_mismatch_and_staleness_hand_worked():
    from posttrain.algorithms.metrics import mismatch_and_staleness

    b = _gap_batch()
    out = mismatch_and_staleness(b.old_logprobs, b.generation_logprobs, b.loss_mask, b.policy_versions, 5)
    assert out == {
        "fresh_token_fraction": pytest.approx(4 / 7, rel=1e-12),
        "token_mult_prob_error": pytest.approx(1.5, rel=1e-12),
        "gen_kl": pytest.approx(0.125, rel=1e-12),
        # policy_kl_error: k3 with log r = gen - old, the same two tokens mirrored -> 0.5 / 4
        "policy_kl_error": pytest.approx(0.125, rel=1e-12),
        # js: a token with π_gen = 2 π_train has m = 1.5 π_train: ½ f(ln 2/3) + ½ f(ln 4/3) = ½ ln 9/8
        # (f(u) = e^u - u - 1); two such tokens (either way round) of 4 -> ln(9/8) / 4
        "js_divergence_error": pytest.approx(math.log(9 / 8) / 4, rel=1e-12),
        "staleness_mult_prob_error": pytest.approx(3.0, rel=1e-12),
        "staleness_kl": pytest.approx(0.75, rel=1e-12),
    }
    # all rows stale (the trainer moved on): no engine-mismatch figure, the staleness over all 7 tokens
    out = mismatch_and_staleness(b.old_logprobs, b.generation_logprobs, b.loss_mask, b.policy_versions, 6)
    assert set(out) == {"fresh_token_fraction", "staleness_mult_prob_error", "staleness_kl"}
    assert out["staleness_mult_prob_error"] == pytest.approx(15 / 7, rel=1e-12)
    assert out["fresh_token_fraction"] == 0.0


def test_async_step_reports_engine_mismatch_on_fresh_rows_and_staleness_apart():
    from posttrain.algorithms.rl_loss import grpo_loss
    from posttrain.trainers.rl.asynchronous import logprob_gap_metrics

    b = _gap_batch()
    current = torch.nan_to_num(b.old_logprobs).requires_grad_(True)  # the policy's forward
    _, loss_metrics = grpo_loss(current, b, 7.0, token_normalizer=7.0)
    assert loss_metrics["token_mult_prob_error"] == pytest.approx(15 / 7, rel=1e-6)  # mixed with staleness
    metrics = logprob_gap_metrics({**loss_metrics, "async/is_weight_mean": 0.9}, b, version=5)
    assert metrics["token_mult_prob_error"] == pytest.approx(1.5, rel=1e-12)
    assert metrics["gen_kl"] == pytest.approx(0.125, rel=1e-12)
    assert metrics["async/staleness_mult_prob_error"] == pytest.approx(3.0, rel=1e-12)
    assert metrics["async/staleness_kl"] == pytest.approx(0.75, rel=1e-12)
    assert metrics["async/fresh_token_fraction"] == pytest.approx(4 / 7, rel=1e-12)
    assert metrics["pg_loss"] == loss_metrics["pg_loss"] and metrics["async/is_weight_mean"] == 0.9
    # no fresh row: the engine mismatch is not reported at all (rather than a figure that is staleness)
    stale = logprob_gap_metrics(loss_metrics, b, version=6)
    assert "token_mult_prob_error" not in stale and "gen_kl" not in stale
    assert stale["async/staleness_mult_prob_error"] == pytest.approx(15 / 7, rel=1e-12)
    # exactly on-policy (π_old skipped: the loss compared with the current = behaviour weights)
    on_policy = _gap_batch(versions=(5, 5, 5), old_logprobs=False)
    assert logprob_gap_metrics(loss_metrics, on_policy, version=5) == {
        **loss_metrics,
        "async/fresh_token_fraction": 1.0,
    }
