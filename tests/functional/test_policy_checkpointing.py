"""policy.activation_checkpointing=true (recompute each decoder layer in backward) changes memory,
not results: with the default packed sequences and with padded batches. It once could not train
a single step with packed sequences (the recomputation ran the model's own attention)."""

import pytest
import torch
from test_policy_compile import _padded_batch

from posttrain.config.common import OptimizerConfig, PolicyConfig, SchedulerConfig
from posttrain.models.policy import Policy
from posttrain.trainers.sft import sft_loss


@pytest.mark.parametrize("packed", [True, False])
def test_checkpointed_policy_takes_the_same_steps(tiny_model_dir, packed):
    cfg = PolicyConfig(
        train_micro_batch_size=2,
        packed_sequences=packed,
        optimizer=OptimizerConfig(lr=1e-3),
        scheduler=SchedulerConfig(name="constant"),
    )
    plain = Policy(cfg, model_path=str(tiny_model_dir), total_steps=2)
    checkpointed = Policy(
        cfg.model_copy(update={"activation_checkpointing": True}),
        model_path=str(tiny_model_dir),
        total_steps=2,
    )
    for step in range(2):
        batch = _padded_batch(4, 14, seed=step)
        ref = plain.train(batch, sft_loss, batch.num_target_tokens)
        out = checkpointed.train(batch, sft_loss, batch.num_target_tokens)
        # the recomputation repeats the forward's own operations on the same inputs: equal up to
        # summation order at most (fp32)
        assert out.loss_metrics["loss"] == pytest.approx(ref.loss_metrics["loss"], rel=1e-6)
        assert out.grad_norm == pytest.approx(ref.grad_norm, rel=1e-5)
    for name, value in plain.state_dict_cpu().items():
        torch.testing.assert_close(checkpointed.state_dict_cpu()[name], value, rtol=1e-5, atol=1e-6, msg=name)
