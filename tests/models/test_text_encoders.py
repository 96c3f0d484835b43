"""MiniLM text encoder: offline, padded with zeros, cached without changing results."""

import torch

from tests.tiny import text_encoder


def test_embeddings_are_zero_padded_and_batch_independent():
    encoder = text_encoder()
    one = encoder.encode_uncached(["a red ball"])
    two = encoder.encode_uncached(["a red ball", "a much longer prompt about a blue square moving up"])
    assert one.shape == (1, encoder.max_length, 384)
    assert torch.allclose(one[0], two[0], atol=1e-5)
    length = int((one[0].abs().sum(dim=1) > 0).sum())
    assert 3 <= length < encoder.max_length and one[0, length:].abs().max() == 0


def test_cache_gives_the_same_embeddings_even_while_evicting():
    encoder = text_encoder()
    saved = encoder._cache.maxsize
    try:
        encoder._cache.clear()
        encoder._cache.maxsize = 2
        prompts = ["", "a", "b", "c", "", "a"]
        expected = encoder.encode_uncached(prompts)
        got = encoder(prompts)  # more distinct prompts than the cache holds, repeated ones included
        assert torch.allclose(got, expected, atol=1e-5)
        assert len(encoder._cache) <= 2
    finally:
        encoder._cache.maxsize = saved
        encoder._cache.clear()
