"""Top-k / top-p filtering and token choice of the sampling loop, on hand-worked 4-token vocabularies."""

import math

import torch

from posttrain.generation.sampler import choose_tokens, filter_top_k_top_p

INF = float("-inf")


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert filter_top_k_top_p(logits, 2, 1.0).tolist() == [[INF, 3.0, 2.0, INF]]


def test_top_p_keeps_the_smallest_nucleus():
    # probabilities 0.5, 0.3, 0.15, 0.05 (in this order); mass before each: 0, 0.5, 0.8, 0.95
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    # top_p = 0.6: keep tokens whose mass before is < 0.6 -> the first two
    kept = filter_top_k_top_p(logits, None, 0.6)
    assert torch.isinf(kept).tolist() == [[False, False, True, True]]
    # top_p = 0.5: mass before the second token is exactly 0.5 -> only the first survives
    kept = filter_top_k_top_p(logits, None, 0.5)
    assert torch.isinf(kept).tolist() == [[False, True, True, True]]
    # the order of the vocabulary does not matter
    shuffled = logits[:, [2, 0, 3, 1]]
    kept = filter_top_k_top_p(shuffled, None, 0.6)
    assert torch.isinf(kept).tolist() == [[True, False, True, False]]


def test_greedy_logprob_is_at_temperature_one():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # probabilities 1/4, 3/4
    tokens, logprobs = choose_tokens(logits, temperature=0.0, top_k=None, top_p=1.0, generator=None)
    assert tokens.tolist() == [1]
    assert abs(logprobs.item() - math.log(0.75)) < 1e-6


def test_sampled_logprob_is_before_truncation_and_at_temperature():
    # top_k=1 forces token 1; its logprob is under softmax(z / T) over the full vocabulary:
    # z / T = [0, 2 ln 3] -> probabilities 1/10, 9/10
    logits = torch.tensor([[0.0, math.log(3.0)]])
    generator = torch.Generator().manual_seed(0)
    tokens, logprobs = choose_tokens(logits, temperature=0.5, top_k=1, top_p=1.0, generator=generator)
    assert tokens.tolist() == [1]
    assert abs(logprobs.item() - math.log(0.9)) < 1e-6


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(8, 50)
    draws = [
        choose_tokens(
            logits, temperature=1.0, top_k=None, top_p=1.0, generator=torch.Generator().manual_seed(7)
        )[0]
        for _ in range(2)
    ]
    assert torch.equal(draws[0], draws[1])


def test_sampled_frequencies_follow_the_filtered_distribution():
    # p = [0.5, 0.3, 0.15, 0.05]; top_p = 0.9 keeps the first three (mass before the last is 0.95),
    # renormalised: [0.5, 0.3, 0.15] / 0.95
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().expand(20000, 4).contiguous()
    generator = torch.Generator().manual_seed(0)
    tokens, logprobs = choose_tokens(logits, temperature=1.0, top_k=None, top_p=0.9, generator=generator)
    counts = torch.bincount(tokens, minlength=4).float() / len(tokens)
    expected = torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95
    assert counts[3] == 0
    assert torch.allclose(counts, expected, atol=0.015)  # 3 sigma of a 20000-sample frequency ~ 0.011
    # logprobs are of the unfiltered distribution
    assert torch.allclose(logprobs, torch.tensor([0.5, 0.3, 0.15, 0.05]).log()[tokens], atol=1e-6)
