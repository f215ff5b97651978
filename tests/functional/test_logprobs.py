"""token_logprobs: only target positions are projected, chunk by chunk, and agree with the full-logits path."""

import torch
from transformers import AutoModelForCausalLM

from posttrain.models.logprobs import lean_logits_transform, token_logprobs


def test_chunked_target_only_logprobs_equal_full_log_softmax(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (3, 10))
    attention = torch.ones_like(ids)
    attention[2, 7:] = 0
    target = torch.zeros(3, 10)
    target[0, 1:] = 1
    target[1, 4:8] = 1
    target[2, 5:7] = 1
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits.float(), -1)
        expected = torch.zeros(3, 10)
        expected[:, 1:] = full[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1) * target[:, 1:]
        for chunk in (1, 3, 4096):
            got = token_logprobs(model, ids, attention, target, chunk_size=chunk)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            assert torch.all(got[target == 0] == 0)


def test_projection_runs_only_on_target_positions(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert lean_logits_transform(model) is not None  # the once-per-model probe, before counting
    rows = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    target = torch.zeros(2, 12)
    target[:, 9:] = 1
    with torch.no_grad():
        token_logprobs(
            model, torch.randint(0, 1000, (2, 12)), torch.ones(2, 12, dtype=torch.long), target, chunk_size=4
        )
    handle.remove()
    assert rows == [4, 2]  # 6 target positions (2 rows x 3) in chunks of 4, not 2 x 12 positions
