"""Shared pieces for the attention tests: a float64 reference and a clean environment."""

from __future__ import annotations

import math

import pytest
import torch

from vidgen.attention import ENV_VAR, AttentionPattern


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: AttentionPattern, scale: float | None = None
) -> torch.Tensor:
    """softmax(Q K^T * scale + mask) V in float64, on (B, S, H, D) tensors, suffix-aligned."""
    q, k, v = (t.double() for t in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    visible = pattern.dense_mask(q.shape[1], k.shape[1], q.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)  # (B, S_q, H, D)


@pytest.fixture
def reference():
    return reference_attention


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """No backend forced from outside, and eager flex (fast to start) unless a test asks otherwise."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("VIDGEN_FLEX_COMPILE", "0")


def random_qkv(batch: int, q_len: int, kv_len: int, heads: int = 2, dim: int = 8, seed: int = 0):
    """Seeded random float32 q (B, S_q, H, D) and k, v (B, S_kv, H, D)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_len, heads, dim, generator=gen)
    k = torch.randn(batch, kv_len, heads, dim, generator=gen)
    v = torch.randn(batch, kv_len, heads, dim, generator=gen)
    return q, k, v


@pytest.fixture
def make_qkv():
    return random_qkv
