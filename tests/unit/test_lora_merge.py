"""LoRA's pure pieces on a hand-sized module (float64): the merged weight W + (alpha/r)·B@A, the base
model's names of the adapted model's parameters, peft's adapter-file names, and switching adapters off."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from posttrain.config.common import LoraConfig  # noqa: E402
from posttrain.models.lora import (  # noqa: E402
    adapted_layers,
    adapter_fingerprint,
    adapter_specs,
    adapter_weights,
    adapters_disabled,
    apply_lora,
    base_name,
    file_name,
    merged_specs,
    merged_weights,
)


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(2, 2, bias=True, dtype=torch.float64)
        self.head = torch.nn.Linear(2, 1, bias=False, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(x))


def _adapted(alpha: float = 2.0, rslora: bool = False) -> Tiny:
    model = Tiny()
    with torch.no_grad():
        model.proj.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        model.proj.bias.copy_(torch.tensor([0.5, -0.5]))
        model.head.weight.copy_(torch.tensor([[1.0, -1.0]]))
    apply_lora(model, LoraConfig(rank=1, alpha=alpha, target_modules=["proj"], rslora=rslora))
    layer = adapted_layers(model)["proj"]
    with torch.no_grad():
        layer.lora_A["default"].weight.copy_(torch.tensor([[1.0, 0.0]]).double())  # A [r=1, in=2]
        layer.lora_B["default"].weight.copy_(torch.tensor([[1.0], [2.0]]).double())  # B [out=2, r=1]
    return model


def test_merged_weight_is_w_plus_scale_b_a():
    model = _adapted(alpha=2.0)  # scale alpha / r = 2: B@A = [[1, 0], [2, 0]]
    merged = dict(merged_weights(model))
    assert set(merged) == {"proj.weight", "proj.bias", "head.weight"}
    assert torch.equal(merged["proj.weight"], torch.tensor([[3.0, 2.0], [7.0, 4.0]], dtype=torch.float64))
    assert torch.equal(merged["proj.bias"], torch.tensor([0.5, -0.5], dtype=torch.float64))
    # the trained tensors are untouched
    assert torch.equal(model.proj.base_layer.weight, torch.tensor([[1.0, 2.0], [3.0, 4.0]]).double())
    assert [(n, s) for n, s, _ in merged_specs(model)] == [(n, tuple(t.shape)) for n, t in merged.items()]
    # alpha 3: the delta scaled by 3
    merged3 = dict(merged_weights(_adapted(alpha=3.0)))
    assert torch.equal(merged3["proj.weight"], torch.tensor([[4.0, 2.0], [9.0, 4.0]], dtype=torch.float64))


def test_adapter_refit_sends_a_and_b_under_peft_names_and_fingerprints_a_and_scaled_b():
    model = _adapted(alpha=3.0)  # A = [1, 0], B = [1, 2]^T, scale 3: s·B = [3, 6]^T
    sent = dict(adapter_weights(model))
    assert set(sent) == {"base_model.model.proj.lora_A.weight", "base_model.model.proj.lora_B.weight"}
    assert [(n, s) for n, s, _ in adapter_specs(model)] == [(n, tuple(t.shape)) for n, t in sent.items()]
    assert adapter_fingerprint(model) == (1.0 + 0.0 + 3.0 + 6.0, 1.0 + 0.0 + 9.0 + 36.0)


def test_the_adapted_model_computes_the_merged_weights_and_the_base_with_adapters_off():
    model = _adapted()
    x = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    # merged proj: [[3, 2], [7, 4]] x + b = [5.5, 10.5]; head: 5.5 - 10.5 = -5
    assert model(x).item() == -5.0
    with adapters_disabled(model):  # base proj: [3.5, 6.5]; head: -3
        assert model(x).item() == -3.0
    assert model(x).item() == -5.0
    assert all(p.requires_grad == ("lora_" in n) for n, p in model.named_parameters())


def test_names():
    assert (
        base_name("model.layers.0.self_attn.q_proj.base_layer.weight")
        == "model.layers.0.self_attn.q_proj.weight"
    )
    assert base_name("model.layers.0.self_attn.q_proj.lora_A.default.weight") is None
    assert base_name("score.modules_to_save.default.weight") == "score.weight"
    assert base_name("score.original_module.weight") is None
    assert base_name("model.embed_tokens.weight") == "model.embed_tokens.weight"
    assert (
        file_name("model.layers.0.mlp.up_proj.lora_B.default.weight")
        == "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"
    )
    assert file_name("score.modules_to_save.default.weight") == "base_model.model.score.weight"


def test_a_target_that_matches_nothing_is_refused():
    with pytest.raises(ValueError):
        apply_lora(Tiny(), LoraConfig(rank=1, target_modules=["q_proj"]))


class TiedTiny(torch.nn.Module):
    """An embedding and an output projection that share one [3, 2] matrix (tie_word_embeddings)."""

    def __init__(self, tied: bool = True) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(3, 2, dtype=torch.float64)
        self.head = torch.nn.Linear(2, 3, bias=False, dtype=torch.float64)
        with torch.no_grad():
            self.embed.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
            self.head.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 2.0]]))
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


def test_an_adapter_on_a_tied_output_layer_is_refused():
    # issue #29 item 9: named_parameters() lists the tied matrix once (as embed.weight), so the merged
    # refit dropped head's adapter; folding it into the shared matrix would change the embedding too
    with pytest.raises(ValueError, match=r"head, whose weight is tied to embed\.weight.*Remove head"):
        apply_lora(TiedTiny(), LoraConfig(rank=1, target_modules=["head"]))


def test_merged_weights_refuse_to_drop_an_adapter():
    # the same tied model adapted behind apply_lora's back (peft directly): the merge, and with it the
    # policy's refit checksum, fails instead of yielding the embedding without the adapter
    from peft import inject_adapter_in_model

    from posttrain.modeling.peft import peft_lora_config

    model = TiedTiny()
    inject_adapter_in_model(peft_lora_config(LoraConfig(rank=1, target_modules=["head"])), model)
    assert [n for n, _, _ in merged_specs(model)] == ["embed.weight"]  # the adapter has no entry
    with pytest.raises(RuntimeError, match=r"lack the LoRA adapters of \['head'\]"):
        dict(merged_weights(model))


def test_an_untied_output_layer_merges_its_adapter():
    model = TiedTiny(tied=False)
    apply_lora(model, LoraConfig(rank=1, alpha=1.0, target_modules=["head"]))
    layer = adapted_layers(model)["head"]
    with torch.no_grad():
        layer.lora_A["default"].weight.copy_(torch.tensor([[1.0, 1.0]]).double())  # A [1, 2]
        layer.lora_B["default"].weight.copy_(torch.tensor([[1.0], [0.0], [-1.0]]).double())  # B [3, 1]
    merged = dict(merged_weights(model))
    # scale 1: B@A = [[1, 1], [0, 0], [-1, -1]]; the embedding is untouched
    assert torch.equal(merged["head.weight"], torch.tensor([[3.0, 1.0], [0.0, 2.0], [1.0, 1.0]]).double())
    assert torch.equal(merged["embed.weight"], torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]).double())
    ids = torch.tensor([2])  # embedding [1, 1] -> merged head [4, 2, 2]
    assert model(ids)[0].tolist() == [4.0, 2.0, 2.0]
