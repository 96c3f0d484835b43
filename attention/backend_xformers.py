"""``xformers``: ``xformers.ops.memory_efficient_attention`` on CUDA, layout (B, S, H, D) natively.

Masks become an additive attention bias (0 where visible, -inf elsewhere), built once per
(pattern, lengths, device, dtype) and cached. Long ``block_causal`` / ``sliding_window``
patterns run chunk by chunk without a bias instead (:mod:`vidgen.attention.blockwise`), by
the same size rule as ``sdpa``.

xformers is an optional dependency (``pip install 'vidgen[gpu]'``), imported only when a call
runs; the probe checks for it without importing it.
"""

from __future__ import annotations

import importlib.util

import torch

from vidgen.attention.backend_sdpa import uses_blockwise
from vidgen.attention.blockwise import cached_plan, run_blockwise
from vidgen.attention.cache import LRUCache
from vidgen.attention.patterns import AttentionPattern, PatternKind
from vidgen.attention.registry import AttentionBackend

_BIASES: LRUCache[torch.Tensor] = LRUCache(maxsize=16)


def _probe() -> str | None:
    reasons = []
    if importlib.util.find_spec("xformers") is None:
        reasons.append("xformers is not installed (pip install 'vidgen[gpu]')")
    if not torch.cuda.is_available():
        reasons.append("xformers needs CUDA tensors; this machine has no CUDA")
    return "; ".join(reasons) or None


def attention_bias(
    pattern: AttentionPattern, q_len: int, kv_len: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Additive (q_len, kv_len) bias: 0 where visible, -inf elsewhere; cached.

    The storage is padded to a multiple of 8 keys and sliced back, because xformers wants the
    bias rows aligned.
    """

    def build() -> torch.Tensor:
        padded = -(-kv_len // 8) * 8
        bias = torch.zeros(q_len, padded, device=device, dtype=dtype)
        bias[:, :kv_len].masked_fill_(~pattern.dense_mask(q_len, kv_len, device), float("-inf"))
        return bias[:, :kv_len]

    return _BIASES.get_or_create((pattern, q_len, kv_len, str(device), dtype), build)


def xformers_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: AttentionPattern, scale: float | None = None
) -> torch.Tensor:
    """Attention under ``pattern`` with xformers; (B, S, H, D) in, (B, S_q, H, D) out."""
    from xformers.ops import memory_efficient_attention

    batch, q_len, heads, _ = q.shape
    kv_len = k.shape[1]
    if pattern.kind is PatternKind.FULL:
        return memory_efficient_attention(q, k, v, scale=scale)
    if uses_blockwise(pattern, q_len, kv_len):
        steps = cached_plan(
            pattern, q_len, kv_len, q.device, min_query_tokens=0
        )  # one chunk per step: no bias
        return run_blockwise(
            q, k, v, steps, lambda qs, ks, vs, _mask: memory_efficient_attention(qs, ks, vs, scale=scale)
        )
    bias = attention_bias(pattern, q_len, kv_len, q.device, q.dtype)
    bias = bias[None, None].expand(batch, heads, q_len, kv_len)  # (B, H, S_q, S_kv)
    return memory_efficient_attention(q, k, v, attn_bias=bias, scale=scale)


BACKEND = AttentionBackend(
    name="xformers",
    run=xformers_attention,
    devices=frozenset({"cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    kinds=frozenset(PatternKind),
    grad_devices=frozenset({"cuda"}),
    probe=_probe,
    description="xformers memory_efficient_attention (CUDA) with an additive bias for masks",
)
