"""``flash``: flash-attn 2 kernels on CUDA (fp16/bf16), in our (B, S, H, D) layout natively.

* ``full``: one ``flash_attn_func`` call.
* ``block_causal`` / ``sliding_window`` with one-token chunks and no sinks: flash-attn's own
  ``causal`` and ``window_size`` express them exactly (its causal mask is aligned to the
  bottom-right corner, our suffix alignment).
* other ``block_causal`` / ``sliding_window`` patterns and ``radial``: one unmasked
  ``flash_attn_func`` call per query chunk (radial: query tile) over the keys it sees (:mod:`vidgen.attention.blockwise`).

:func:`flash_attention_with_kvcache` wraps ``flash_attn_with_kvcache`` for the cached decode
step: a whole chunk of queries attending to a pre-allocated KV cache.

flash-attn is an optional dependency (``pip install 'vidgen[gpu]'``) and is imported only when
a call runs; the probe checks for it without importing it.
"""

from __future__ import annotations

import importlib.util

import torch

from vidgen.attention.blockwise import cached_plan, run_blockwise
from vidgen.attention.patterns import AttentionPattern, PatternKind
from vidgen.attention.registry import AttentionBackend


def _probe() -> str | None:
    reasons = []
    if importlib.util.find_spec("flash_attn") is None:
        reasons.append("flash-attn is not installed (pip install 'vidgen[gpu]')")
    if not torch.cuda.is_available():
        reasons.append("flash-attn needs a CUDA GPU; this machine has no CUDA")
    return "; ".join(reasons) or None


def native_window(pattern: AttentionPattern) -> tuple[bool, tuple[int, int]] | None:
    """``(causal, window_size)`` for flash-attn when it expresses ``pattern`` exactly, else None."""
    if pattern.kind is PatternKind.FULL:
        return False, (-1, -1)
    if pattern.chunk_tokens != 1:  # flash-attn windows are per token, our chunks see whole chunks
        return None
    if pattern.kind is PatternKind.BLOCK_CAUSAL:
        return True, (-1, 0)
    if pattern.kind is PatternKind.SLIDING_WINDOW and pattern.sink_frames == 0:
        return True, (pattern.window_frames, 0)
    return None


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: AttentionPattern, scale: float | None = None
) -> torch.Tensor:
    """Attention under ``pattern`` with flash-attn 2; (B, S, H, D) in, (B, S_q, H, D) out."""
    from flash_attn import flash_attn_func

    window = native_window(pattern)
    if window is not None:
        causal, window_size = window
        return flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window_size)
    # min_query_tokens=0: one chunk per step, so no step needs a mask (flash-attn takes none)
    steps = cached_plan(pattern, q.shape[1], k.shape[1], q.device, min_query_tokens=0)
    return run_blockwise(
        q, k, v, steps, lambda qs, ks, vs, _mask: flash_attn_func(qs, ks, vs, softmax_scale=scale)
    )


def flash_attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor | int,
    *,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    pattern: AttentionPattern | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """One cached step: queries for a new chunk attend to a pre-allocated KV cache.

    Args:
        q: (B, S_q, H, D) queries of the new chunk.
        k_cache, v_cache: (B, S_max, H, D) pre-allocated cache; if ``k_new``/``v_new`` are given
            they are written in place at ``cache_seqlens`` (flash-attn does this in the kernel).
        cache_seqlens: valid cache length per batch element, before the new keys, (B,) int32 or an int.
        k_new, v_new: (B, S_new, H, D) keys and values of the new chunk, or None if already cached.
        pattern: ``full`` or ``block_causal`` (None means full). For ``block_causal`` the
            queries must be one whole chunk at the end of the cache, so that they see every
            valid key and no causal mask is needed; this is the autoregressive chunk step.
            Windows with sinks do not map onto flash-attn's per-token windows: attend with
            :func:`flash_attention` over the cache slice instead.
        scale: softmax scale; None means ``1 / sqrt(D)``.

    Returns:
        (B, S_q, H, D).
    """
    from flash_attn import flash_attn_with_kvcache

    pattern = pattern or AttentionPattern.full()
    if pattern.kind not in (PatternKind.FULL, PatternKind.BLOCK_CAUSAL):
        raise ValueError(
            f"flash_attention_with_kvcache supports full and block_causal patterns, not {pattern.kind.value}"
        )
    if pattern.kind is PatternKind.BLOCK_CAUSAL and q.shape[1] != pattern.chunk_tokens:
        raise ValueError(
            f"for block_causal the queries must be one whole chunk ({pattern.chunk_tokens} tokens), got {q.shape[1]}"
        )
    return flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=cache_seqlens, softmax_scale=scale, causal=False
    )


BACKEND = AttentionBackend(
    name="flash",
    run=flash_attention,
    devices=frozenset({"cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16}),
    kinds=frozenset(PatternKind),
    grad_devices=frozenset({"cuda"}),
    probe=_probe,
    description="flash-attn 2 (CUDA, fp16/bf16); per-chunk calls for chunked causal patterns",
)
