"""policy.compile=true (regional torch.compile of the decoder layers) changes speed, not results."""

import torch

from posttrain.config.common import OptimizerConfig, PolicyConfig, SchedulerConfig
from posttrain.data.batching import TokenBatch
from posttrain.models.policy import Policy
from posttrain.trainers.sft import sft_loss


def _padded_batch(rows: int, length: int, seed: int) -> TokenBatch:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 2, length + 1, (rows,), generator=gen)
    lengths[0] = length
    attention = (torch.arange(length)[None] < lengths[:, None]).long()
    ids = torch.randint(0, 1000, (rows, length), generator=gen) * attention
    loss_mask = ((torch.arange(length)[None] >= 3) & attention.bool()).float()
    return TokenBatch(ids, attention, loss_mask)


def test_compiled_policy_takes_the_same_steps(tiny_model_dir):
    cfg = PolicyConfig(
        train_micro_batch_size=2,
        optimizer=OptimizerConfig(lr=1e-3),
        scheduler=SchedulerConfig(name="constant"),
    )
    eager = Policy(cfg, model_path=str(tiny_model_dir), total_steps=3)
    compiled = Policy(cfg.model_copy(update={"compile": True}), model_path=str(tiny_model_dir), total_steps=3)
    assert compiled.state_dict_cpu().keys() == eager.state_dict_cpu().keys()  # checkpoints stay compatible
    for step, length in enumerate((12, 17)):  # a new length: the compiled layers handle other shapes
        batch = _padded_batch(4, length, seed=step)
        ref = eager.train(batch, sft_loss, batch.num_target_tokens)
        out = compiled.train(batch, sft_loss, batch.num_target_tokens)
        assert abs(out.loss_metrics["loss"] - ref.loss_metrics["loss"]) <= 1e-5 * ref.loss_metrics["loss"]
        assert abs(out.grad_norm - ref.grad_norm) <= 1e-4 * ref.grad_norm
        torch.testing.assert_close(compiled.logprobs(batch), eager.logprobs(batch), rtol=1e-5, atol=1e-5)
    ref_params, params = eager.state_dict_cpu(), compiled.state_dict_cpu()
    for name, value in ref_params.items():
        assert (params[name] - value).norm() <= 1e-5 * value.norm(), name
