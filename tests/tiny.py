"""A tiny random pipeline (2-layer transformer, small autoencoder, MiniLM) for fast tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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

# Float32 throughout, for tests that compare one video made in two ways: bf16 autocast (on CPUs with
# avx512_bf16) turns a 1e-7 difference into a whole bf16 step now and then.
FP32 = {"runtime.autocast": "off"}

_TEXT_ENCODER = None


def text_encoder() -> MiniLMTextEncoder:
    global _TEXT_ENCODER
    if _TEXT_ENCODER is None:
        _TEXT_ENCODER = MiniLMTextEncoder.load()
    return _TEXT_ENCODER


def tiny_components(seed: int = 0, heads: int = 2, text=None, **config_overrides):
    """``heads``: attention heads of the transformer (3, as the default model's, for sequence
    parallelism over 2 ranks that Ulysses cannot split); ``text``: a text encoder instead of MiniLM."""
    from vidgen.pipelines import LongVideoPipeline

    torch.manual_seed(seed)
    transformer = CausalWanTransformer(**{**TINY_TRANSFORMER, "num_attention_heads": heads}).eval()
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
    return LongVideoPipeline(transformer, vae, text if text is not None else text_encoder(), config)


def save_tiny_pipeline(folder: str | Path, seed: int = 0, heads: int = 2, **config_overrides) -> Path:
    pipe = tiny_components(seed, heads, **config_overrides)
    pipe.save_pretrained(folder)
    return Path(folder)


def assert_frames_match(got: np.ndarray, expected: np.ndarray, *, fraction: float = 1e-3) -> None:
    """The same video made another way (other processes, other thread counts, split sequences):
    uint8 frames equal but for values one step off, in at most ``fraction`` of them. Float32 sums
    that BLAS kernels block differently for other shapes or thread counts round ~1e-7 apart, and a
    value on a rounding boundary may land one step off; a wrong chunk, seed, prompt or cache
    differs in most values by far more."""
    assert got.shape == expected.shape, (got.shape, expected.shape)
    off = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    assert off.max() <= 1, f"largest difference {off.max()}"
    assert np.count_nonzero(off) <= off.size * fraction, (
        f"{np.count_nonzero(off)} of {off.size} values differ"
    )


def assert_decoded_match(got: np.ndarray, expected: np.ndarray) -> None:
    """Two H.264 files of the same video made another way, decoded. x264 does not promise the same
    bytes for the same frames on a loaded machine (a clean-clone CI run saw 916 of 73,728 values
    more than one step off, mean difference under 0.1, for identical input frames): a block coded
    another way differs by a few steps near edges. A wrong video differs everywhere (mean
    difference in the tens for the tiny random model's frames)."""
    assert got.shape == expected.shape, (got.shape, expected.shape)
    off = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    assert off.mean() <= 0.25, f"mean difference {off.mean():.3f}"
    assert np.count_nonzero(off > 8) <= off.size * 0.01, (
        f"{np.count_nonzero(off > 8)} of {off.size} values >8 off"
    )
