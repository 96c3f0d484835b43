"""``sdpa``: PyTorch's ``scaled_dot_product_attention``, on any device, with autograd.

Two ways to run a pattern, chosen by size:

* dense: one SDPA call with the pattern's boolean ``(q_len, kv_len)`` mask (none for ``full``).
  Simple and exact, but quadratic in time and memory.
* blockwise (``block_causal``, ``sliding_window``, ``radial``): each query chunk (radial: query
  tile) attends to just the keys it sees, with same-shaped chunks batched into one SDPA call (see
  :mod:`vidgen.attention.blockwise`); linear in the sequence length. This is what CPU
  training uses, so it must and does support backward.

* rectangles (``radial`` inference on CPU): the visible pairs are covered by rectangles (a run
  of query tiles x one key range they all see), each attended over views of q/k/v by torch's
  CPU flash kernel, and merged per query by log-sum-exp: no key gathering, and a frame every
  tile sees is one call with many queries (see :func:`~vidgen.attention.blockwise.plan_rectangles`).

The rule: blockwise once ``q_len * kv_len`` reaches :data:`BLOCKWISE_MIN_PAIRS` (a 1k x 1k
score matrix) and the queries span more than one chunk; dense otherwise. Both give the same
softmax over the same keys, to float rounding.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from vidgen.attention.blockwise import cached_plan, cached_rectangles, run_blockwise, run_rectangles
from vidgen.attention.cache import LRUCache
from vidgen.attention.patterns import AttentionPattern, PatternKind
from vidgen.attention.registry import AttentionBackend

BLOCKWISE_MIN_PAIRS = 1024 * 1024
"""Score-matrix size (q_len * kv_len) from which block-structured patterns run blockwise."""

MIN_STEP_TOKENS = 256
"""Blockwise: merge consecutive small chunks until a call has this many queries (fewer, larger calls)."""

_MASKS: LRUCache[torch.Tensor] = LRUCache(maxsize=16)


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float | None
) -> torch.Tensor:
    # SDPA wants (B, H, S, D); ours is (B, S, H, D)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale
    )
    return out.transpose(1, 2)  # (B, S_q, H, D)


def dense_mask(pattern: AttentionPattern, q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """The pattern's boolean (q_len, kv_len) mask, cached by pattern, lengths and device."""
    key = (pattern, q_len, kv_len, str(device))
    return _MASKS.get_or_create(key, lambda: pattern.dense_mask(q_len, kv_len, device))


def uses_blockwise(pattern: AttentionPattern, q_len: int, kv_len: int) -> bool:
    """The size rule: blockwise for block-structured patterns with a large score matrix over several chunks."""
    if not pattern.has_key_ranges or q_len * kv_len < BLOCKWISE_MIN_PAIRS:
        return False
    if pattern.kind is PatternKind.RADIAL:  # many query tiles per chunk
        return True
    first_chunk = (kv_len - q_len) // pattern.chunk_tokens
    last_chunk = (kv_len - 1) // pattern.chunk_tokens
    return last_chunk > first_chunk


def uses_rectangles(pattern: AttentionPattern, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Radial inference on CPU at blockwise sizes: rectangles merged by log-sum-exp (no key gathers,
    whole shared frames as one call; measured faster than blockwise at the Wan-1.3B chunk geometry)."""
    return (
        pattern.kind is PatternKind.RADIAL
        and q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.bfloat16)
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))
        and uses_blockwise(pattern, q.shape[1], k.shape[1])
    )


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pattern: AttentionPattern,
    scale: float | None = None,
    mode: Literal["auto", "dense", "blockwise", "rectangles"] = "auto",
) -> torch.Tensor:
    """Attention under ``pattern`` with SDPA; (B, S, H, D) in, (B, S_q, H, D) out.

    ``mode`` forces the dense or blockwise path (the latter for block-structured patterns only);
    ``"auto"`` applies :func:`uses_blockwise`.
    """
    q_len, kv_len = q.shape[1], k.shape[1]
    if pattern.kind is PatternKind.FULL:
        return _sdpa(q, k, v, None, scale)
    if mode == "rectangles" or (mode == "auto" and uses_rectangles(pattern, q, k, v)):
        return run_rectangles(q, k, v, cached_rectangles(pattern, q_len, kv_len), scale)
    if mode == "blockwise" or (mode == "auto" and uses_blockwise(pattern, q_len, kv_len)):
        steps = cached_plan(pattern, q_len, kv_len, q.device, MIN_STEP_TOKENS)
        return run_blockwise(q, k, v, steps, lambda qs, ks, vs, mask: _sdpa(qs, ks, vs, mask, scale))
    if mode not in ("auto", "dense"):
        raise ValueError(f"mode must be 'auto', 'dense', 'blockwise' or 'rectangles', got {mode!r}")
    return _sdpa(q, k, v, dense_mask(pattern, q_len, kv_len, q.device), scale)


BACKEND = AttentionBackend(
    name="sdpa",
    run=sdpa_attention,
    devices=frozenset({"cpu", "cuda", "mps", "xpu"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}),
    kinds=frozenset(PatternKind),
    grad_devices=frozenset({"cpu", "cuda", "mps", "xpu"}),
    description="torch scaled_dot_product_attention; dense mask, or chunk by chunk for long causal patterns",
)
