"""CopyPlan: the destinations of a vLLM-style loader learned once, then plain copies; refused when the
loader transforms its inputs. The loaders here are small stand-ins with vLLM's shape: HF names in,
fused parameters narrowed and copied into."""

from __future__ import annotations

import pytest
import torch

from posttrain.generation.vllm_engine import CopyPlan


class FusedModel(torch.nn.Module):
    """q and k fused into one [4, 2] parameter, an embedding, and a tied lm_head it never loads."""

    def __init__(self, transform_k=lambda k: k) -> None:
        super().__init__()
        self.qk = torch.nn.Parameter(torch.zeros(4, 2), requires_grad=False)
        self.embed = torch.nn.Parameter(torch.zeros(3, 2), requires_grad=False)
        self.transform_k = transform_k

    def load_weights(self, weights) -> None:
        for name, tensor in weights:
            if name == "q":
                self.qk.data.narrow(0, 0, 2).copy_(tensor)
            elif name == "k":
                self.qk.data.narrow(0, 2, 2).copy_(self.transform_k(tensor))
            elif name == "embed":
                self.embed.data.copy_(tensor)
            # "lm_head": tied to embed, skipped


def _weights(scale: float) -> list[tuple[str, torch.Tensor]]:
    embed = torch.arange(6.0).view(3, 2) * scale
    return [
        ("q", torch.tensor([[1.0, 2.0], [3.0, 4.0]]) * scale),
        ("k", torch.tensor([[5.0, 6.0], [7.0, 8.0]]) * scale),
        ("embed", embed),
        ("lm_head", embed.clone()),
    ]


def test_plan_records_the_fused_destinations_and_later_copies_match_the_loader():
    model, reference = FusedModel(), FusedModel()
    plan = CopyPlan.record(model, _weights(1.0), torch.device("cpu"))
    assert plan is not None and sorted(plan.destinations) == ["embed", "k", "q"]
    assert torch.equal(model.qk, torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]))

    new = _weights(-2.0)
    assert plan.fits(model, new)
    plan.copy(new)
    reference.load_weights(new)
    assert torch.equal(model.qk, reference.qk) and torch.equal(model.embed, reference.embed)
    assert model.qk[3, 1] == -16.0


@pytest.mark.parametrize(
    "transform, loaded_k",
    [
        (lambda k: k.t(), [[5.0, 7.0], [6.0, 8.0]]),  # a view with the source's pointer and shape
        (lambda k: k.to(torch.float64) * 2, [[10.0, 12.0], [14.0, 16.0]]),  # a new tensor
    ],
)
def test_no_plan_when_the_loader_transforms_a_tensor(transform, loaded_k):
    model = FusedModel(transform)
    assert CopyPlan.record(model, _weights(1.0), torch.device("cpu")) is None
    assert torch.equal(model.qk[2:], torch.tensor(loaded_k))  # loaded all the same


def test_no_plan_when_a_skipped_tensor_is_not_a_tied_twin():
    weights = _weights(1.0)
    weights[3] = ("lm_head", torch.ones(3, 2))  # untied, yet the loader ignores it
    assert CopyPlan.record(FusedModel(), weights, torch.device("cpu")) is None


def test_plan_no_longer_fits_after_the_parameters_are_reallocated_or_shapes_change():
    model = FusedModel()
    plan = CopyPlan.record(model, _weights(1.0), torch.device("cpu"))
    assert not plan.fits(model, [("q", torch.zeros(3, 2))])
    model.qk.data = torch.zeros(4, 2)  # new storage: the recorded views point at the old one
    assert not plan.fits(model, _weights(1.0))
