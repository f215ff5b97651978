"""PPO on a tiny random model: the critic's value head learns (non-zero gradients), its checkpoint
resumes bit-exactly, and `posttrain ppo` runs end to end, single-turn with one sample per prompt and
multi-turn with masked observation tokens."""

from __future__ import annotations

import functools

import pytest
import torch

from posttrain.config.common import OptimizerConfig, PolicyConfig, SchedulerConfig
from posttrain.data.trajectory import Trajectory
from posttrain.models.critic import Critic
from posttrain.rollout.rollout import build_rl_batch
from posttrain.trainers.ppo import PPOBatch, value_loss_fn


def ppo_test_config(model_dir, run_dir, **extra):
    """A 2-step PPO config on a tiny model: 4 prompts x 1 sample, 12 new tokens, local backend."""
    from posttrain.config import load_config
    from posttrain.config.ppo import PPOConfig

    overrides = {
        "policy.model_name": str(model_dir),
        "policy.max_seq_len": 96,
        "data.example_turns": "[]",  # the quickstart's worked example does not fit in 96 tokens
        "data.train.reasoning_gym.size": 32,
        "data.validation.reasoning_gym.size": 4,
        "ppo.max_steps": 2,
        "ppo.prompts_per_step": 4,
        "ppo.val_every": 2,
        "ppo.critic_warmup_steps": 1,
        "generation.max_new_tokens": 12,
        "cluster.backend": "local",
        "logging.run_dir": str(run_dir),
        "logging.tensorboard": False,
        "logging.plots": False,
        "environment.name": "constant_env:ConstantEnvironment",  # 0.1 each: the critic has targets
        **extra,
    }
    return load_config(PPOConfig, None, [f"{k}={v}" for k, v in overrides.items()])


def _critic(model_dir, lr=1e-3) -> Critic:
    cfg = PolicyConfig(
        model_name=str(model_dir),
        optimizer=OptimizerConfig(lr=lr),
        scheduler=SchedulerConfig(name="constant"),
        train_micro_batch_size=2,
    )
    return Critic(cfg, model_path=str(model_dir), total_steps=10)


def _batch(tokenizer, seed: int) -> PPOBatch:
    g = torch.Generator().manual_seed(seed)
    trajectories = []
    for n in (9, 6, 11):
        ids = torch.randint(5, 500, (n,), generator=g).tolist()
        mask = [0] * 4 + [1] * (n - 4)
        trajectories.append(Trajectory(ids, mask, [0.0] * n, [], {}, group_id=0))
    rl = build_rl_batch(trajectories, torch.zeros(3), tokenizer.pad_token_id)
    batch = PPOBatch(**vars(rl))
    batch.values = torch.zeros(rl.loss_mask.shape)
    batch.returns = torch.randn(rl.loss_mask.shape, generator=g) * rl.loss_mask
    return batch


LOSS = functools.partial(value_loss_fn, clip=0.5)


def test_value_head_starts_at_zero_and_gets_gradients(tiny_model_dir, tokenizer):
    critic = _critic(tiny_model_dir)
    batch = _batch(tokenizer, 0)
    assert torch.count_nonzero(critic.values(batch)) == 0  # zero-initialised head: V = 0 everywhere
    critic.model.train()
    values = critic.loss_inputs(batch)
    loss, _ = LOSS(values, batch, float(batch.loss_mask.sum()))
    loss.backward()
    head = critic.model.value_head
    assert head.weight.grad.abs().sum() > 0 and head.bias.grad.abs() > 0
    # the backbone gets no gradient through a zero head yet; after one step it does
    critic.optimizer.zero_grad(set_to_none=True)
    critic.train(batch, LOSS, float(batch.loss_mask.sum()))
    assert torch.count_nonzero(critic.values(batch) * batch.loss_mask) > 0
    critic.model.train()
    loss, _ = LOSS(critic.loss_inputs(batch), batch, float(batch.loss_mask.sum()))
    loss.backward()
    layer = critic.model.layers[-1].mlp.down_proj.weight
    assert layer.grad is not None and layer.grad.abs().sum() > 0


def test_critic_checkpoint_resumes_bit_exactly(tiny_model_dir, tokenizer, tmp_path):
    first, second = _batch(tokenizer, 1), _batch(tokenizer, 2)
    critic = _critic(tiny_model_dir)
    critic.train(first, LOSS, float(first.loss_mask.sum()))
    critic.save_checkpoint(str(tmp_path / "ckpt"))
    critic.train(second, LOSS, float(second.loss_mask.sum()))
    resumed = _critic(tiny_model_dir)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    resumed.train(second, LOSS, float(second.loss_mask.sum()))
    for (name, a), (_, b) in zip(
        critic.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    a_state, b_state = critic.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert a_state.keys() == b_state.keys()
    for key in a_state:
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a_state[key][field], b_state[key][field])
    assert torch.equal(critic.values(second), resumed.values(second))


def test_trained_critic_loads_from_its_checkpoint(tiny_model_dir, tokenizer, tmp_path):
    """`load_trained_value_model` (benchmarks/critic_ceiling.py) reads back the trained critic: the
    same values as the live one, and a clear error for a folder without its weights."""
    from posttrain.modeling.loading import CheckpointMismatchError
    from posttrain.models.critic import load_trained_value_model, token_values

    batch = _batch(tokenizer, 3)
    critic = _critic(tiny_model_dir)
    critic.train(batch, LOSS, float(batch.loss_mask.sum()))
    critic.save_checkpoint(str(tmp_path / "ckpt"))
    loaded = load_trained_value_model(tmp_path / "ckpt")
    with torch.no_grad():
        values = token_values(loaded, batch.input_ids, batch.attention_mask)
    assert torch.count_nonzero(values * batch.loss_mask) > 0  # trained, not the zero-initialised head
    assert torch.allclose(values * batch.loss_mask, critic.values(batch) * batch.loss_mask, atol=1e-6)
    with pytest.raises(CheckpointMismatchError, match="no critic weights"):
        load_trained_value_model(tmp_path)


def _train_rows(result):
    return [h for h in result.history if "critic/value_loss" in h]


@pytest.mark.parametrize("placement", ["colocated", "split"])
def test_ppo_two_steps_with_warmup_epochs_and_resume(tiny_model_dir, tmp_path, placement):
    from posttrain.trainers.ppo import run_ppo

    cfg = ppo_test_config(
        tiny_model_dir,
        tmp_path / placement,
        **{"critic.placement": placement, "ppo.ppo_epochs": 2, "ppo.updates_per_batch": 2},
    )
    first = run_ppo(cfg, stop_after=1)
    assert first.step == 1
    second = run_ppo(cfg)
    assert second.step == 2
    rows = _train_rows(first) + _train_rows(second)
    assert [r["critic/warmup"] for r in rows] == [1.0, 0.0]  # step 1 trains only the critic
    assert "pg_loss" not in rows[0] and "pg_loss" in rows[1]
    for row in rows:
        assert row["critic/grad_norm"] > 0 and row["critic/value_loss"] > 0
        for key in (
            "critic/explained_variance",
            "critic/value_clip_fraction",
            "returns/mean",
            "advantages/mean",
        ):
            assert key in row
    assert rows[1]["grad_norm"] > 0
    checkpoint = second.last_checkpoint
    assert (checkpoint / "critic" / "model").is_dir() and (checkpoint / "critic" / "optimizer.pt").is_file()
    assert any("val/accuracy" in h for h in second.history)


def test_ppo_cli_runs_two_steps_with_kl_reward_and_adaptive_lambda(tiny_model_dir, tmp_path):
    from posttrain.cli import main

    cfg = ppo_test_config(tiny_model_dir, tmp_path / "cli")
    overrides = [
        f"policy.model_name={tiny_model_dir}", "policy.max_seq_len=96", "data.example_turns=[]", "data.train.reasoning_gym.size=32",
        "data.validation=null", "ppo.max_steps=2", "ppo.prompts_per_step=2", "ppo.critic_warmup_steps=0",
        "generation.max_new_tokens=8", "cluster.backend=local", f"logging.run_dir={tmp_path / 'cli'}",
        "logging.tensorboard=false", "logging.plots=false", "checkpoint.enabled=false",
        # the KL to the reference as a per-token reward, VAPO's length-adaptive λ and positive NLL
        "loss.kl_beta=0.1", "loss.kl_in_reward=true", "advantage.lam_actor_alpha=0.05",
        "loss.positive_example_nll_weight=0.1",
    ]  # fmt: skip
    assert cfg.ppo.generations_per_prompt == 1
    assert main(["ppo", *overrides]) == 0
    import json

    rows = [json.loads(line) for line in open(tmp_path / "cli" / "metrics.jsonl")]
    assert sum("critic/value_loss" in r for r in rows) == 2 and sum("pg_loss" in r for r in rows) == 2
    train = [r for r in rows if "critic/value_loss" in r]
    assert all(
        "reward/kl_penalty" in r and "kl" in r and 0 <= r["advantages/lam_actor_mean"] <= 1 for r in train
    )
    assert all(r["positive_nll"] >= 0 for r in train)  # the VAPO term reaches PPO's policy loss
    assert train[0]["reward/kl_penalty"] == pytest.approx(0.0, abs=1e-6)  # π_old = π_ref at first


def test_ppo_multi_turn_observation_tokens_masked(tiny_model_dir, tmp_path):
    """Two-turn episodes (a user observation between the turns, masked): two steps run, each turn's
    reward reaches the critic's targets on the right turn's tokens."""
    from posttrain.trainers.ppo import PPOTrainer

    cfg = ppo_test_config(
        tiny_model_dir,
        tmp_path / "turns",
        **{
            "policy.max_seq_len": 160,
            "environment.name": "ppo_env:TwoTurnEnvironment",
            "environment.max_turns": 2,
            "data.validation": "null",
            "checkpoint.enabled": False,
        },
    )
    trainer = PPOTrainer(cfg)
    try:
        rollouts, _ = trainer.collect(0)
        batch, _ = trainer.make_batch(rollouts)
        # the value head starts at 0 and λ_critic = γ = 1: each assistant token's target is exactly the
        # reward still to come, 0.25 + 0.5 on the first turn's tokens, 0.5 on the second's; the
        # observation between them is no action (no target, no advantage)
        for t, returns, advantages, mask in zip(
            rollouts.trajectories, batch.returns, batch.advantages, batch.loss_mask, strict=True
        ):
            (s1, e1), (s2, e2) = t.turn_spans
            assert bool((returns[s1:e1] == 0.75).all()) and bool((returns[s2:e2] == 0.5).all())
            assert e1 < s2 and mask[e1:s2].sum() == 0
            assert returns[e1:s2].abs().sum() == 0 and advantages[e1:s2].abs().sum() == 0
        rows = _train_rows(trainer.runtime.fit())
    finally:
        trainer.runtime.shutdown()
    assert len(rows) == 2
    assert all(r["episode/turns_mean"] == 2 and r["reward/mean"] == 0.75 for r in rows)
    assert all(r["critic/grad_norm"] > 0 for r in rows)


@pytest.mark.ray
@pytest.mark.parametrize(
    "placement, extra",
    [("colocated", {"cluster.num_workers": 2}), ("split", {"critic.num_workers": 2})],
    ids=["colocated_dp2", "split_critic_dp2"],
)
def test_ppo_two_steps_on_ray(ray_cluster, tiny_model_dir, tmp_path, placement, extra):
    """Ray actors: the critic held in 2 data-parallel policy workers, or 2 critic workers of its own
    next to 1 policy worker (each rank's gradients all-reduced)."""
    from posttrain.trainers.ppo import run_ppo

    cfg = ppo_test_config(
        tiny_model_dir,
        tmp_path / placement,
        **{
            "cluster.backend": "ray",
            "cluster.cpus_per_worker": 1,
            "critic.placement": placement,
            "data.validation": "null",
            "checkpoint.enabled": False,
            # Ray workers cannot import the tests' environments: the math environment, its rewards (0
            # for a random model) mapped from [0, 1] onto [0.5, 1.5], so that the critic has targets
            "environment.name": "math",
            "advantage.reward_scaling.enabled": True,
            "advantage.reward_scaling.target_min": 0.5,
            "advantage.reward_scaling.target_max": 1.5,
            **extra,
        },
    )
    rows = _train_rows(run_ppo(cfg))
    assert len(rows) == 2 and all(r["critic/grad_norm"] > 0 and r["returns/mean"] >= 0.5 for r in rows)
    assert "pg_loss" in rows[1]


def _checkpoint_tensors(directory) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(directory.glob("model/*.safetensors")):
        out.update(load_file(f))
    state = torch.load(directory / "optimizer.pt", weights_only=False)["optimizer"]["state"]
    for key, tensors in state.items():
        out.update({f"adam.{key}.{name}": t for name, t in tensors.items()})
    return out


def test_ppo_resumed_run_equals_the_uninterrupted_one(tiny_model_dir, tmp_path):
    """2 steps in one go and 1 + 1 with a resume between give the same critic and policy, bit for bit
    (weights and AdamW state): the checkpoint holds everything the critic's next step depends on,
    its value replay included."""
    from posttrain.trainers.ppo import run_ppo

    extra = {
        "data.validation": "null",
        "ppo.critic_warmup_steps": 1,
        "ppo.updates_per_batch": 2,  # 2 minibatches, reshuffled in the second epoch
        "ppo.critic_replay_batches": 1,  # step 2's critic replays step 1's batch: saved and restored
        "checkpoint.save_every": 1,
    }
    straight = run_ppo(ppo_test_config(tiny_model_dir, tmp_path / "straight", **extra))
    cfg = ppo_test_config(tiny_model_dir, tmp_path / "resumed", **extra)
    run_ppo(cfg, stop_after=1)
    resumed = run_ppo(cfg)
    for sub in ("critic", ""):
        a = _checkpoint_tensors(straight.last_checkpoint / sub)
        b = _checkpoint_tensors(resumed.last_checkpoint / sub)
        assert a.keys() == b.keys()
        assert [k for k in a if not torch.equal(a[k], b[k])] == [], sub or "policy"


def test_epochs_after_the_first_reshuffle_the_minibatches_reproducibly(tokenizer):
    """Epoch 0 cuts the batch in order; epoch 1 permutes its rows first, the same way for the same
    (seed, step, epoch): a resumed run trains on the same minibatches."""
    from types import SimpleNamespace

    from posttrain.trainers.ppo import PPOTrainer

    batch = _batch(tokenizer, seed=0)
    trainer = SimpleNamespace(
        cfg=SimpleNamespace(ppo=SimpleNamespace(updates_per_batch=3, seed=0)), current_step=4
    )
    rows = {tuple(batch.input_ids[i][batch.attention_mask[i].bool()].tolist()): i for i in range(3)}

    def order(epoch):
        mbs = PPOTrainer.epoch_minibatches(trainer, batch, epoch)
        return [rows[tuple(mb.input_ids[0][mb.attention_mask[0].bool()].tolist())] for mb in mbs]

    assert order(0) == [0, 1, 2]
    assert sorted(order(1)) == [0, 1, 2] and order(1) == order(1)
    shuffled = {tuple(order(e)) for e in range(1, 8)}
    assert len(shuffled) > 1  # the permutation depends on the epoch


def test_critic_epochs_train_the_critic_more_often_than_the_policy(tiny_model_dir, tmp_path):
    """`ppo.critic_epochs=3` with `ppo_epochs=1` and 2 minibatches: 6 critic updates a step, 2 policy
    updates once the warm-up is over; the critic's scheduler counts its own updates."""
    from posttrain.trainers.ppo import PPOTrainer

    cfg = ppo_test_config(
        tiny_model_dir,
        tmp_path / "run",
        **{"ppo.critic_epochs": 3, "ppo.ppo_epochs": 1, "ppo.updates_per_batch": 2},
    )
    trainer = PPOTrainer(cfg)
    calls = {"critic": 0, "policy": 0}

    def counted(name, train):
        def run(*args, **kwargs):
            calls[name] += 1
            return train(*args, **kwargs)

        return run

    trainer.critic.train = counted("critic", trainer.critic.train)
    trainer.runtime.policy.train = counted("policy", trainer.runtime.policy.train)
    try:
        assert trainer.critic_kwargs()["total_steps"] == 2 * 3 * 2
        trainer.runtime.fit(stop_after=1)
        assert calls == {"critic": 6, "policy": 0}  # step 1: the critic's warm-up
        trainer.runtime.fit(stop_after=2)
        assert calls == {"critic": 12, "policy": 2}
    finally:
        trainer.runtime.shutdown()


def test_value_replay_trains_the_critic_on_the_last_batch_too(tiny_model_dir, tmp_path):
    """`ppo.critic_replay_batches=1`, one epoch of 2 minibatches a batch: step 1's critic trains on its
    own 4 rows (2 updates), step 2's on its 4 and step 1's 4 shuffled together (4 updates). The
    replayed rows keep step 1's returns as targets; their V_old is the critic's after step 1."""
    from posttrain.trainers.ppo import PPOTrainer

    cfg = ppo_test_config(
        tiny_model_dir,
        tmp_path / "run",
        **{"ppo.critic_replay_batches": 1, "ppo.ppo_epochs": 1, "ppo.updates_per_batch": 2},
    )
    trainer = PPOTrainer(cfg)
    seen: list[PPOBatch] = []
    train = trainer.critic.train

    def recorded(mb, *args, **kwargs):
        seen.append(mb)
        return train(mb, *args, **kwargs)

    trainer.critic.train = recorded

    def rows(batch):
        return {
            tuple(batch.input_ids[i][batch.attention_mask[i].bool()].tolist()): i for i in range(len(batch))
        }

    try:
        assert trainer.critic_kwargs()["total_steps"] == 2 * 1 * 2 * 2
        trainer.runtime.fit(stop_after=1)
        assert len(seen) == 2 and len(trainer.value_replay) == 1
        stored = trainer.value_replay[0]
        assert stored.values is None and stored.returns is not None
        v_old = trainer.critic.values(stored)  # the critic after step 1
        trainer.runtime.fit(stop_after=2)
        assert len(seen) == 2 + 4 and all(len(mb) == 2 for mb in seen[2:])
        replayed = rows(stored)
        matched = 0
        for mb in seen[2:]:
            for key, i in rows(mb).items():
                if key in replayed:
                    j, n = replayed[key], len(key)
                    assert torch.equal(mb.returns[i, :n], stored.returns[j, :n])
                    torch.testing.assert_close(mb.values[i, :n], v_old[j, :n], atol=1e-5, rtol=1e-5)
                    matched += 1
        assert matched == len(stored) == 4
        assert len(trainer.value_replay) == 1 and not rows(trainer.value_replay[0]).keys() & replayed.keys()
    finally:
        trainer.runtime.shutdown()


def test_ppo_recipe_file_runs_two_steps(tiny_model_dir, tmp_path):
    """examples/configs/ppo_math.yaml itself through `posttrain ppo`, shortened (tiny model, 4 prompts,
    2 steps with a 1-step critic warm-up): step 1 trains only the critic, step 2 both."""
    import json

    from posttrain.cli import main

    run_dir = tmp_path / "run"
    args = [
        "ppo",
        "--config",
        "examples/configs/ppo_math.yaml",
        f"policy.model_name={tiny_model_dir}",
        "data.train.reasoning_gym.size=16",
        "data.validation.reasoning_gym.size=2",
        "ppo.max_steps=2",
        "ppo.prompts_per_step=4",
        "ppo.critic_warmup_steps=1",
        "ppo.val_every=2",
        "generation.max_new_tokens=6",
        "cluster.backend=local",
        "logging.tensorboard=false",
        "logging.plots=false",
        f"logging.run_dir={run_dir}",
    ]
    assert main(args) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "critic/warmup" in r]
    assert [(r["step"], r["critic/warmup"]) for r in steps] == [(1, 1.0), (2, 0.0)]
    assert "pg_loss" not in steps[0] and "pg_loss" in steps[1]
    assert all("critic/explained_variance" in r and "critic/value_loss" in r for r in steps)
    assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 2]
