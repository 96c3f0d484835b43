"""A tiny random pipeline (2-layer transformer, small autoencoder, MiniLM) for fast tests."""

from __future__ import annotations

from pathlib import Path

import torch

from vidgen.config import load_config
from vidgen.models import CausalWanTransformer
from vidgen.models.autoencoder import AutoencoderKLLite
from vidgen.models.text_encoders import MiniLMTextEncoder

TINY_TRANSFORMER = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=384,
    freq_dim=32,
    ffn_dim=64,
    num_layers=2,
    rope_max_seq_len=64,
)

_TEXT_ENCODER = None


def text_encoder() -> MiniLMTextEncoder:
    global _TEXT_ENCODER
    if _TEXT_ENCODER is None:
        _TEXT_ENCODER = MiniLMTextEncoder.load()
    return _TEXT_ENCODER


def tiny_components(seed: int = 0, **config_overrides):
    from vidgen.pipelines import LongVideoPipeline

    torch.manual_seed(seed)
    transformer = CausalWanTransformer(**TINY_TRANSFORMER).eval()
    vae = AutoencoderKLLite(
        z_dim=4,
        hidden_channels=16,
        encoder_blocks=1,
        decoder_blocks=1,
        refine_channels=8,
        latents_mean=[0.0, 0.1, -0.1, 0.0],
        latents_std=[1.0, 0.5, 2.0, 1.0],
    ).eval()
    overrides = {"runtime.device": "cpu", **config_overrides}
    config = load_config("default").replace(**overrides)
    return LongVideoPipeline(transformer, vae, text_encoder(), config)


def save_tiny_pipeline(folder: str | Path, seed: int = 0, **config_overrides) -> Path:
    pipe = tiny_components(seed, **config_overrides)
    pipe.save_pretrained(folder)
    return Path(folder)
