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
    streaming_decoder,
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


def _tiny_lite():
    return AutoencoderKLLite(
        z_dim=4,
        hidden_channels=16,
        encoder_blocks=1,
        decoder_blocks=1,
        refine_channels=8,
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ).eval()


@pytest.mark.parametrize("make", [_tiny_wan, _tiny_lite])
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


def test_wan_decoder_state_survives_save_and_load():
    vae = _tiny_wan()
    z = torch.randn(1, 4, 5, 4, 4)
    mean, std = latent_stats(vae)
    with torch.no_grad():
        whole = vae.decode(z * std + mean).sample
        first = streaming_decoder(vae)
        head = first.decode(z[:, :, :2], 0)
        state = first.state()
        second = streaming_decoder(_tiny_wan().requires_grad_(False))
        second.vae.load_state_dict(vae.state_dict())
        second.load_state(state)
        tail = second.decode(z[:, :, 2:], 2)
    assert torch.equal(torch.cat([head, tail], dim=2), whole)


def test_encode_normalises_with_config_stats():
    vae = _tiny_lite()
    video = torch.rand(1, 3, 9, 32, 32) * 2 - 1
    z = encode_video(vae, video)
    raw = vae.encode(video).latent_dist.mode()
    assert torch.allclose(z, raw)  # mean 0, std 1 here
    assert z.shape == (1, 4, 3, 8, 8)


def test_frame_arithmetic():
    assert frames_of_latents(0, 2, 4) == (0, 5)
    assert frames_of_latents(2, 2, 4) == (5, 13)
    assert latents_for_frames(1, 4) == 1 and latents_for_frames(5, 4) == 2 and latents_for_frames(6, 4) == 3
