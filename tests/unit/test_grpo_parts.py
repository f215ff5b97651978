"""The GRPO trainer's algorithm glue as pure functions: dynamic sampling's group selection, the
loss normalisers, the loss knobs, the engine-mismatch metrics and the KL-in-reward advantages."""

from types import SimpleNamespace

import pytest
import torch

from posttrain.algorithms.estimators import AdvantageInputs, estimate_advantages
from posttrain.algorithms.rl_loss import grpo_loss, loss_knobs
from posttrain.config.loss import AdvantageConfig, LossConfig
from posttrain.config.rl import GRPOConfig
from posttrain.data.trajectory import Trajectory
from posttrain.errors import UserError
from posttrain.rollout.rollout import RLBatch, Rollouts
from posttrain.trainers.grpo import GRPOTrainer
from posttrain.trainers.rl.batch import gradient_rows, loss_normalizers, rows_with_gradient
from posttrain.trainers.rl.collect import collect_groups


def _rollouts(rewards_per_group: list[list[float]], first_group: int = 0) -> Rollouts:
    trajectories = [
        Trajectory([1, 2], [0, 1], [0.0, -1.0], [], {}, group_id=first_group + g, reward=r)
        for g, rewards in enumerate(rewards_per_group)
        for r in rewards
    ]
    return Rollouts(trajectories, {"env/accuracy": 0.5})


def _draws(*rounds: list[list[float]]):
    calls = []

    def draw(round_: int) -> Rollouts:
        calls.append(round_)
        return _rollouts(rounds[round_ - 1], first_group=10 * round_)

    return draw, calls


def _groups(rollouts: Rollouts) -> list[int]:
    return sorted({t.group_id for t in rollouts.trajectories})


def test_collect_without_dynamic_sampling_takes_one_round():
    draw, calls = _draws([[1, 1], [0, 1]])
    out, stats = collect_groups(draw, groups=2, group_size=2, dynamic_sampling=False, max_rounds=4)
    assert calls == [1] and len(out.trajectories) == 4
    assert stats == {"dapo/generation_rounds": 1.0, "reward/zero_variance_fraction": 0.5}


def test_dynamic_sampling_refills_and_truncates_to_whole_groups():
    # round 1 keeps group 11 (group 10 has equal rewards), round 2 keeps 20 and 22: 3 >= 2 groups,
    # truncated to the first two kept
    draw, calls = _draws([[0.1, 0.1], [0, 1]], [[1, 0], [1, 1], [0, 0.5]])
    out, stats = collect_groups(draw, groups=2, group_size=2, dynamic_sampling=True, max_rounds=4)
    assert calls == [1, 2]
    assert _groups(out) == [11, 20]
    assert stats["dapo/kept_groups"] == 2 and stats["dapo/short_batch"] == 0
    assert stats["dapo/skipped_update"] == 0 and stats["dapo/generation_rounds"] == 2
    assert stats["reward/zero_variance_fraction"] == pytest.approx((0.5 + 1 / 3) / 2)
    assert out.env_metrics == {"env/accuracy": 0.5}


def test_dynamic_sampling_short_batch_trains_on_what_was_kept():
    # 4 groups wanted; after max_rounds = 2 only 3 have rewards that differ: no exception, a short
    # batch of those 3 groups, flagged
    draw, calls = _draws([[0, 1], [1, 1], [0, 0]], [[1, 0], [0, 0], [0.2, 0.1]])
    out, stats = collect_groups(draw, groups=4, group_size=2, dynamic_sampling=True, max_rounds=2)
    assert calls == [1, 2]
    assert _groups(out) == [10, 20, 22] and len(out.trajectories) == 6
    assert stats["dapo/kept_groups"] == 3 and stats["dapo/short_batch"] == 1
    assert stats["dapo/skipped_update"] == 0
    # the batch must split over updates x workers = 4 sequences: whole groups, 2 of the 3
    draw, _ = _draws([[0, 1], [1, 1], [0, 0]], [[1, 0], [0, 0], [0.2, 0.1]])
    out, stats = collect_groups(draw, groups=4, group_size=2, dynamic_sampling=True, max_rounds=2, unit=4)
    assert _groups(out) == [10, 20] and stats["dapo/kept_groups"] == 2


def test_dynamic_sampling_with_nothing_kept_skips_the_update():
    draw, calls = _draws([[1, 1], [0, 0]], [[0.1, 0.1], [0.7, 0.7]], [[1, 1], [1, 1]])
    out, stats = collect_groups(draw, groups=2, group_size=2, dynamic_sampling=True, max_rounds=3)
    assert calls == [1, 2, 3] and out.trajectories == []
    assert stats["dapo/kept_groups"] == 0 and stats["dapo/short_batch"] == 1
    assert stats["dapo/skipped_update"] == 1 and stats["reward/zero_variance_fraction"] == 1.0
    # one kept group that cannot split over 4 sequences: nothing left to train on either
    draw, _ = _draws([[1, 0], [0, 0]])
    out, stats = collect_groups(draw, groups=2, group_size=2, dynamic_sampling=True, max_rounds=1, unit=4)
    assert out.trajectories == [] and stats["dapo/skipped_update"] == 1


# --- normalisers --------------------------------------------------------------------------------


def _batch(loss_mask: list[list[float]], **extra) -> RLBatch:
    mask = torch.tensor(loss_mask)
    return RLBatch(
        torch.ones_like(mask, dtype=torch.long), torch.ones_like(mask, dtype=torch.long), mask, **extra
    )


@pytest.mark.parametrize(
    "aggregation, expected",
    [("token", (4.0, 4.0)), ("sequence", (2.0, 4.0)), ("seq_mean_token_sum", (2.0 * 12, 4.0))],
)
def test_normalizers_count_only_sequences_in_the_loss(aggregation, expected):
    # 3 sequences; the 2nd was taken out by the overlong filter (all-zero loss mask): the sequence
    # count is 2, not 3 (a filtered sample must not dilute the per-sequence mean)
    from conftest import grpo_test_config

    cfg = grpo_test_config("m", "r", **{"loss.aggregation": aggregation, "dapo.overlong_filter": True})
    batch = _batch([[0, 1, 1, 0], [0, 0, 0, 0], [0, 1, 1, 0]])
    assert loss_normalizers(cfg, batch) == expected


# --- rows with a gradient -------------------------------------------------------------------------


def _rows_batch(advantages: torch.Tensor, **extra) -> RLBatch:
    # 5 rows; row 3 has no loss token (an unscored sample, the overlong filter)
    batch = _batch([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 0]])
    batch.advantages = advantages
    batch.input_ids = torch.arange(5)[:, None].expand(5, 4).clone()  # row i holds i: see the order
    for name, value in extra.items():
        setattr(batch, name, value)
    return batch


def _loss_cfg(**loss) -> SimpleNamespace:
    return SimpleNamespace(loss=LossConfig(**loss))


@pytest.mark.parametrize(
    "loss, reference, expected",
    [
        ({}, False, [True, False, True, False, False]),  # rows 1 and 4: advantage 0; row 3: no token
        ({"skip_zero_advantage_rows": False}, False, [True] * 5),
        ({"kl_beta": 0.1}, True, [True, True, True, False, True]),  # the KL term has a gradient there
        ({"kl_beta": 0.1, "kl_in_reward": True}, False, [True, False, True, False, False]),
        ({}, True, [True, True, True, False, True]),  # reference logprobs: the kl metric covers them
        ({"positive_example_nll_weight": 0.1}, False, [True, True, True, False, True]),
    ],
)
def test_rows_with_gradient(loss, reference, expected):
    extra = {"reference_logprobs": torch.zeros(5, 4)} if reference else {}
    batch = _rows_batch(torch.tensor([1.0, 0.0, -0.5, 2.0, 0.0]), **extra)
    assert rows_with_gradient(_loss_cfg(**loss), batch).tolist() == expected


def test_rows_with_gradient_per_token_advantages_count_loss_tokens_only():
    advantages = torch.zeros(5, 4)
    advantages[0, 0] = 3.0  # a prompt position: not a loss token, so row 0 has no gradient
    advantages[2, 1] = -1.0
    advantages[4, 2] = 0.5
    batch = _rows_batch(advantages)
    assert rows_with_gradient(_loss_cfg(), batch).tolist() == [False, False, True, False, True]


@pytest.mark.parametrize(
    "advantages, world_size, rows",
    [
        ([1.0, 0.0, -0.5, 2.0, 0.0], 1, [0, 2]),
        ([1.0, 0.0, -0.5, 2.0, 0.0], 4, [0, 2, 1, 3]),  # topped up with dropped rows, in order
        ([0.0, 0.0, 0.0, 0.0, 0.0], 1, [0]),  # none has a gradient: the optimizer still steps
        ([0.0, 0.0, 0.0, 0.0, 0.0], 2, [0, 1]),
        ([1.0, 1.0, 1.0, 1.0, 1.0], 2, [0, 1, 2, 4]),  # row 3 has no loss token
    ],
)
def test_gradient_rows_keep_order_and_fill_the_workers(advantages, world_size, rows):
    batch = _rows_batch(torch.tensor(advantages))
    kept = gradient_rows(_loss_cfg(), batch, world_size)
    assert kept.input_ids[:, 0].tolist() == rows
    assert kept.advantages.tolist() == [advantages[i] for i in rows]
    assert kept.loss_mask.tolist() == [batch.loss_mask[i, : kept.loss_mask.shape[1]].tolist() for i in rows]


# --- loss knobs and the engine-mismatch metrics ---------------------------------------------------


def test_loss_knobs_leave_trainer_fields_out():
    knobs = loss_knobs(LossConfig(kl_beta=0.1, kl_in_reward=True))
    assert "kl_in_reward" not in knobs and knobs["kl_beta"] == 0.0
    assert loss_knobs(LossConfig(kl_beta=0.1))["kl_beta"] == 0.1
    cispo = loss_knobs(LossConfig(policy_loss="cispo", clip_low=1.0, clip_high=0.28))
    assert "dual_clip" not in cispo and "ratio_level" not in cispo and "disable_ppo_ratio" not in cispo
    trainer_only = {"kl_in_reward", "seq_logprob_error_threshold", "skip_zero_advantage_rows"}
    assert loss_knobs(GRPOConfig().loss) == {**GRPOConfig().loss.model_dump(exclude=trainer_only)}


@pytest.mark.parametrize("policy_loss", ["clipped_pg", "cispo"])
def test_grpo_loss_takes_every_knob(policy_loss):
    cfg = LossConfig(
        policy_loss=policy_loss,
        kl_beta=0.1,
        importance_correction="icepop",
        importance_min=0.5,
        on_policy_kl_approximation=True,
        disable_ppo_ratio=policy_loss == "clipped_pg",
    )
    batch = _batch([[0, 1, 1]], advantages=torch.tensor([1.0]))
    batch.generation_logprobs = torch.tensor([[0.0, -1.0, -2.0]])
    batch.reference_logprobs = torch.tensor([[0.0, -1.5, -1.0]])
    lp = torch.tensor([[0.0, -1.1, -1.9]], requires_grad=True)
    loss, metrics = grpo_loss(lp, batch, 2.0, token_normalizer=2.0, **loss_knobs(cfg))
    loss.backward()
    mismatch = {"token_mult_prob_error", "gen_kl", "policy_kl_error", "js_divergence_error"}
    assert {
        "pg_loss",
        "kl",
        "is_oob_ratio",
        "probs_ratio_min",
        "probs_ratio_max",
    } | mismatch <= metrics.keys()


def test_engine_mismatch_metrics_use_pi_old_not_the_drifted_policy():
    # a later minibatch: the policy has moved since the batch was sampled. The metrics compare
    # the engine (π_gen) with π_old, so they must not see the drift:
    #   log π_gen = [-1, -2], log π_old = [-1.1, -1.8]: |Δ| = [0.1, 0.2]
    #   token_mult_prob_error = (e^0.1 + e^0.2) / 2; gen_kl = mean(e^-Δ - 1 + Δ) with Δ = gen - old
    gen = torch.tensor([[0.0, -1.0, -2.0]])
    old = torch.tensor([[0.0, -1.1, -1.8]])
    batch = _batch([[0, 1, 1]], advantages=torch.tensor([1.0]), generation_logprobs=gen, old_logprobs=old)
    delta = torch.tensor([0.1, -0.2])
    error = float(torch.exp(delta.abs()).mean())
    gen_kl = float((torch.exp(-delta) - 1 + delta).mean())
    for drift in (0.0, 0.5, -3.0):
        lp = (old + drift * torch.tensor([[0.0, 1.0, -1.0]])).requires_grad_(True)
        _, metrics = grpo_loss(lp, batch, 2.0, token_normalizer=2.0)
        assert metrics["token_mult_prob_error"] == pytest.approx(error, rel=1e-6)
        assert metrics["gen_kl"] == pytest.approx(gen_kl, rel=1e-5)
    # one update per batch (no old_logprobs): π_old is the current policy
    batch.old_logprobs = None
    _, metrics = grpo_loss(old.clone().requires_grad_(True), batch, 2.0, token_normalizer=2.0)
    assert metrics["token_mult_prob_error"] == pytest.approx(error, rel=1e-6)


# --- advantages with the KL in the reward --------------------------------------------------------


def test_advantages_kl_in_reward():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    kl = torch.tensor([[0.5, 0.5], [0.2, 7.0], [0.0, 0.0], [1.0, 1.0]])
    # group estimators: r' = r - 0.1 Σ_t KL = [0.9, 0.98, 0, -0.2] -> Dr.GRPO: r' - group mean
    with_kl = AdvantageInputs(rewards, groups, kl=kl, mask=mask, kl_beta=0.1)
    out = estimate_advantages(AdvantageConfig(estimator="dr_grpo"), with_kl)
    assert out.tolist() == pytest.approx([-0.04, 0.04, 0.1, -0.1])
    # equal task rewards, but the KL spreads them: no longer a zero-variance group
    plain = AdvantageInputs(rewards, groups)
    assert estimate_advantages(AdvantageConfig(estimator="dr_grpo"), plain).tolist() == [0.0] * 4
    # reinforce_pp: per-token [N, T], token-normalised, 0 on padding
    pp = estimate_advantages(AdvantageConfig(estimator="reinforce_pp", minus_baseline=False), with_kl)
    assert pp.shape == (4, 2) and pp[1, 1] == 0.0
    assert float(pp[mask.bool()].mean()) == pytest.approx(0.0, abs=1e-6)
    # advantage clipping applies last
    pair = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    clipped = estimate_advantages(AdvantageConfig(estimator="grpo", clip=0.5), pair)
    assert clipped.tolist() == pytest.approx([0.5, -0.5])


# --- unscored samples: out of the baseline, dynamic sampling and reward metrics (#29, item 2) ------


def _scored_rollouts(rewards: list[float], scored: list[bool], group_size: int = 4) -> Rollouts:
    trajectories = [
        Trajectory(
            [1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], [], {}, group_id=i // group_size, reward=r, scored=s
        )
        for i, (r, s) in enumerate(zip(rewards, scored, strict=True))
    ]
    return Rollouts(trajectories, {})


def _trainer(**overrides) -> GRPOTrainer:
    """A GRPOTrainer with only what make_batch reads (config, pad id, no teacher)."""
    from conftest import grpo_test_config

    trainer = object.__new__(GRPOTrainer)
    trainer.cfg = grpo_test_config("m", "r", **overrides)
    trainer.tokenizer, trainer.teacher = SimpleNamespace(pad_token_id=0), None
    return trainer


STD_089 = 0.005**0.5


@pytest.mark.parametrize(
    "overrides, first",
    [
        ({}, -0.05 / (STD_089 + 1e-6)),
        ({"advantage.estimator": "rloo"}, -0.1),
        ({"advantage.estimator": "dr_grpo", "loss.aggregation": "seq_mean_token_sum"}, -0.05),
        (
            {"advantage.estimator": "reinforce_pp", "advantage.minus_baseline": False},
            -0.05 / (STD_089 + 1e-6),
        ),
    ],
)
def test_make_batch_leaves_unscored_samples_out_of_baselines_and_reward_metrics(overrides, first):
    # group 0: judged 0.8 / 0.9 beside two judge failures; group 1: one scored sample of four.
    # Over the scored 0.8 / 0.9: mean 0.85, Bessel std sqrt(0.005): GRPO -/+0.7071, not +0.76 / +0.96.
    rewards = [0.8, 0.9, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    scored = [True, True, False, False, True, False, False, False]
    batch, metrics = _trainer(**overrides).make_batch(_scored_rollouts(rewards, scored))
    assert batch.advantages.tolist() == pytest.approx([first, -first] + [0.0] * 6, abs=1e-6)
    # the lone scored sample of group 1 trains on nothing either
    assert batch.loss_mask.sum(-1).tolist() == [2.0, 2.0] + [0.0] * 6
    # reward metrics over the three scored samples 0.8, 0.9, 1.0: mean 0.9, Bessel std 0.1
    assert metrics["reward/mean"] == pytest.approx(0.9, abs=1e-6)
    assert metrics["reward/std"] == pytest.approx(0.1, abs=1e-6)


def test_make_batch_with_everything_scored_is_unchanged():
    batch, metrics = _trainer().make_batch(_scored_rollouts([1.0, 0.0, 0.0, 0.0], [True] * 4))
    # mean 0.25, Bessel std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5: A = [1.5, -0.5, -0.5, -0.5]
    assert batch.advantages.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert batch.loss_mask.sum().item() == 8.0 and metrics["reward/mean"] == 0.25


def test_dynamic_sampling_compares_scored_samples_only():
    # round 1: group 0 = scored 0.8, 0.8 + two unscored zeros (no spread among the scored: dropped),
    # group 1 = one scored sample (dropped); round 2: group 0 has a scored spread (kept, whole)
    rounds = [
        _scored_rollouts(
            [0.8, 0.8, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], [True, True, False, False, True] + [False] * 3
        ),
        _scored_rollouts([0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0], [True, True, False, True] + [True] * 4),
    ]
    out, stats = collect_groups(
        lambda r: rounds[r - 1], groups=1, group_size=4, dynamic_sampling=True, max_rounds=2
    )
    assert [t.reward for t in out.trajectories] == [0.0, 1.0, 0.0, 0.0]
    assert stats["dapo/generation_rounds"] == 2 and stats["dapo/kept_groups"] == 1
    # zero-variance fraction per round: 1 (both groups), then 0.5 (group 1 is all 1.0)
    assert stats["reward/zero_variance_fraction"] == 0.75


# --- episodes of several token sequences (an environment that restarts the conversation) -----------


def _split_episode(reward: float, sequences: int, group: int) -> Trajectory:
    """An episode of `sequences` token sequences of 3 tokens (prompt, 2 generated) each."""
    from posttrain.data.trajectory import ClosedContext

    closed = [ClosedContext([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], [(1, 3)]) for _ in range(sequences - 1)]
    spans = [(1, 3)] * sequences
    return Trajectory(
        [1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], [], {}, group_id=group, reward=reward,
        turn_spans=spans, contexts=closed,
    )  # fmt: skip


def test_make_batch_gives_each_sequence_of_an_episode_the_episode_s_advantage():
    # group 0: episode A (reward 1, one sequence), B (reward 0, three sequences). Over episodes: mean
    # 0.5, Bessel std sqrt(0.5): A = +0.5/0.7071 = +0.7071, B = -0.7071 on each of its three rows. Over
    # rows the baseline would be (1 + 0 + 0 + 0) / 4 = 0.25: not what the episodes earned.
    rollouts = Rollouts([_split_episode(1.0, 1, 0), _split_episode(0.0, 3, 0)], {})
    batch, metrics = _trainer().make_batch(rollouts)
    a = 0.5 / (0.5**0.5 + 1e-6)
    assert batch.advantages.tolist() == pytest.approx([a, -a, -a, -a], abs=1e-6)
    assert batch.input_ids.shape == (4, 3) and batch.loss_mask.sum().item() == 8.0
    assert metrics["reward/mean"] == 0.5 and metrics["response_length"] == 4.0  # (2 + 6) / 2 episodes


def test_split_episodes_refuse_what_needs_one_sequence_per_episode():
    rollouts = Rollouts([_split_episode(1.0, 2, 0), _split_episode(0.0, 1, 0)], {})
    with pytest.raises(UserError, match="raw_reward"):
        _trainer(**{"advantage.estimator": "raw_reward"}).make_batch(rollouts)
    with pytest.raises(UserError, match="kl_in_reward"):
        _trainer(**{"loss.kl_in_reward": True, "loss.kl_beta": 0.1}).make_batch(rollouts)
