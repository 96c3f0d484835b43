"""Tiny Wan configs used across the model tests (2 layers, 2 heads, CPU, fp32)."""

import pytest
import torch

TINY = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=4,
    out_channels=4,
    text_dim=16,
    freq_dim=32,
    ffn_dim=32,
    num_layers=2,
    rope_max_seq_len=64,
)


@pytest.fixture
def tiny_config():
    return dict(TINY)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())
