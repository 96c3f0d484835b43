"""Chunk-by-chunk decoding equals decoding the whole latent video at once."""

import pytest
import torch
from diffusers import AutoencoderKLWan

from vidgen.models.autoencoder import AutoencoderKLLite
from vidgen.pipelines.vae_stream import (
    encode_video,
    frames_of_latents,
    latent_stats,
    latents_for_frames,
    spatial_factor,
    streaming_decoder,
    temporal_factor,
    video_to_uint8,
)

CHUNKS = [(0, 2), (2, 3), (3, 6), (6, 7)]


def _tiny_wan():
    return AutoencoderKLWan(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.1, 0.2, 0.0, -0.1],
        latents_std=[1.0, 2.0, 0.5, 1.5],
    ).eval()


def _tiny_lite(mean=(0.0,) * 4, std=(1.0,) * 4, decoder_context=0):
    torch.manual_seed(0)
    return AutoencoderKLLite(
        z_dim=4,
        hidden_channels=16,
        encoder_blocks=1,
        decoder_blocks=1,
        refine_channels=8,
        latents_mean=list(mean) if mean is not None else None,
        latents_std=list(std) if std is not None else None,
        decoder_context=decoder_context,
    ).eval()


def _tiny_lite_with_context():
    return _tiny_lite(mean=(0.1, 0.2, 0.0, -0.1), std=(1.0, 2.0, 0.5, 1.5), decoder_context=1)


@pytest.mark.parametrize("make", [_tiny_wan, _tiny_lite, _tiny_lite_with_context])
def test_chunkwise_decode_equals_whole_decode(make):
    vae = make()
    z = torch.randn(1, 4, 7, 4, 6)
    mean, std = latent_stats(vae)
    with torch.no_grad():
        whole = vae.decode(z * std + mean).sample
        decoder = streaming_decoder(vae)
        decoder.reset()
        parts = torch.cat([decoder.decode(z[:, :, a:b], a) for a, b in CHUNKS], dim=2)
    assert (
        parts.shape
        == whole.shape
        == (
            1,
            3,
            25,
            z.shape[3] * (8 if make is _tiny_wan else 4),
            z.shape[4] * (8 if make is _tiny_wan else 4),
        )
    )
    assert (parts - whole).abs().max() <= 1e-5  # batch-size-dependent conv kernels differ in rounding only


def _decoded_through_saved_state(vae, z, split, resumed_vae=None):
    """``(whole, head, tail, state)``: ``z`` decoded whole, and as two chunks split at latent
    frame ``split`` by two streaming decoders, the second (over ``resumed_vae``, default ``vae``)
    resumed from the state the first saved."""
    mean, std = latent_stats(vae)
    with torch.no_grad():
        whole = vae.decode(z * std + mean).sample
        first = streaming_decoder(vae)
        head = first.decode(z[:, :, :split], 0)
        state = first.state()
        second = streaming_decoder(resumed_vae if resumed_vae is not None else vae)
        second.load_state(state)
        tail = second.decode(z[:, :, split:], split)
    return whole, head, tail, state


def test_wan_decoder_state_survives_save_and_load():
    vae = _tiny_wan()
    resumed = _tiny_wan().requires_grad_(False)
    resumed.load_state_dict(vae.state_dict())
    whole, head, tail, _ = _decoded_through_saved_state(vae, torch.randn(1, 4, 5, 4, 4), 2, resumed)
    assert torch.equal(torch.cat([head, tail], dim=2), whole)


def test_a_decoder_with_context_reads_the_latent_frame_before_each_one():
    """With ``decoder_context=1`` a group's frames change when only the latent frame before it
    changes, and no others do; without it, nothing else changes. Latent frame 0 reads itself."""
    z = torch.randn(1, 4, 4, 4, 4, generator=torch.Generator().manual_seed(3))
    moved = z.clone()
    moved[:, :, 1] += 1.0  # latent frame 1: video frames 1-4
    for context in (0, 1):
        vae = _tiny_lite(decoder_context=context)
        with torch.no_grad():
            a, b = vae.decode(z).sample, vae.decode(moved).sample
        changed = (a - b).abs().amax(dim=(0, 1, 3, 4)) > 1e-4  # per video frame
        expected = [False] + [True] * 4 + [bool(context)] * 4 + [False] * 4
        assert changed.tolist() == expected
    vae = _tiny_lite(decoder_context=1)
    with torch.no_grad():
        alone = vae.decode(z[:, :, :1]).sample
        after = vae.decode(z[:, :, 2:], first_latent_index=2, previous=z[:, :, 1:2]).sample
    torch.testing.assert_close(alone, vae.decode(z).sample[:, :, :1])
    torch.testing.assert_close(after, vae.decode(z).sample[:, :, 5:], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="previous="):
        vae.decode(z[:, :, 2:], first_latent_index=2)


def test_lite_decoder_with_context_carries_the_last_latent_frame_through_save_and_load():
    vae = _tiny_lite_with_context()
    z = torch.randn(1, 4, 5, 4, 4, generator=torch.Generator().manual_seed(4))
    whole, head, tail, state = _decoded_through_saved_state(vae, z, 2)
    assert set(state) == {"lite_previous"} and state["lite_previous"].shape == (1, 4, 1, 4, 4)
    torch.testing.assert_close(torch.cat([head, tail], dim=2), whole, atol=1e-5, rtol=0)
    with torch.no_grad(), pytest.raises(RuntimeError, match="needs the frame before it"):
        streaming_decoder(vae).decode(z[:, :, 2:], 2)  # no state loaded
    assert streaming_decoder(_tiny_lite()).state() == {}  # without context: stateless


def test_encode_normalises_with_config_stats():
    vae = _tiny_lite()
    video = torch.rand(1, 3, 9, 32, 32) * 2 - 1
    z = encode_video(vae, video)
    with torch.no_grad():  # as encode_video runs it (the inference convolution)
        raw = vae.encode(video).latent_dist.mode()
    assert torch.allclose(z, raw)  # mean 0, std 1 here
    assert z.shape == (1, 4, 3, 8, 8)


def test_frame_arithmetic():
    assert frames_of_latents(0, 2, 4) == (0, 5)
    assert frames_of_latents(2, 2, 4) == (5, 13)
    assert latents_for_frames(1, 4) == 1 and latents_for_frames(5, 4) == 2 and latents_for_frames(6, 4) == 3


def test_encode_subtracts_the_mean_and_divides_by_the_std():
    vae = _tiny_lite(mean=(0.1, 0.2, 0.0, -0.1), std=(1.0, 2.0, 0.5, 1.5))
    video = torch.rand(1, 3, 5, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    raw = vae.encode(video).latent_dist.mode()
    expected = (raw - torch.tensor([0.1, 0.2, 0.0, -0.1]).view(1, 4, 1, 1, 1)) / torch.tensor(
        [1.0, 2.0, 0.5, 1.5]
    ).view(1, 4, 1, 1, 1)
    torch.testing.assert_close(encode_video(vae, video), expected, atol=1e-6, rtol=0)


def test_stats_and_factors_default_when_the_config_lacks_them():
    mean, std = latent_stats(_tiny_lite(mean=None, std=None))
    assert torch.equal(mean, torch.zeros(1, 4, 1, 1, 1)) and torch.equal(std, torch.ones(1, 4, 1, 1, 1))
    assert (temporal_factor(_tiny_wan()), spatial_factor(_tiny_wan())) == (4, 8)
    assert (temporal_factor(_tiny_lite()), spatial_factor(_tiny_lite())) == (4, 4)
    bare = type("Vae", (), {"config": type("Config", (), {})()})()
    assert (temporal_factor(bare), spatial_factor(bare)) == (4, 8)  # Wan's


def test_video_to_uint8_maps_minus_one_to_zero_and_one_to_255():
    video = torch.tensor([-1.0, 0.0, 1.0, 1.5, -3.0, 0.5]).view(1, 1, 6, 1, 1).repeat(1, 3, 1, 1, 1)
    video[:, 1] = 1.0  # green channel full
    frames = video_to_uint8(video)
    assert frames.shape == (6, 1, 1, 3) and frames.dtype == torch.uint8
    assert frames[:, 0, 0, 0].tolist() == [0, 128, 255, 255, 0, 191]  # 127.5 rounds to even, clamped
    assert frames[:, 0, 0, 1].tolist() == [255] * 6


def test_wan_decoder_state_right_after_the_first_latent():
    """After latent 0 diffusers' cache holds "repeat the first frame" markers: they must survive."""
    vae = _tiny_wan()
    z = torch.randn(1, 4, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    whole, head, tail, state = _decoded_through_saved_state(vae, z, 1)
    assert any(name.startswith("wan_cache_rep.") for name in state)
    assert torch.equal(torch.cat([head, tail], dim=2), whole)


def test_a_wan_decoder_starts_a_new_video_afresh():
    vae = _tiny_wan()
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(1, 4, 3, 4, 4, generator=g), torch.randn(1, 4, 3, 4, 4, generator=g)
    with torch.no_grad():
        vae.decoder.conv_out.weight.mul_(20)  # outputs well past [-1, 1]: the clamp is seen
        decoder = streaming_decoder(vae)
        decoder.decode(a, 0)
        again = torch.cat([decoder.decode(b[:, :, :2], 0), decoder.decode(b[:, :, 2:], 2)], dim=2)
        assert any(name.startswith("wan_cache.") for name in decoder.state())
        decoder.reset()  # (before diffusers' own decode below, which clears the cache it shares)
        assert not any(name.startswith("wan_cache.") for name in decoder.state())
        mean, std = latent_stats(vae)
        whole = vae.decode(b * std + mean).sample
    assert torch.equal(again, whole)
    assert again.abs().max() == 1.0  # clamped to [-1, 1] as diffusers' decode does
