"""``flex``: PyTorch FlexAttention with a block-sparse ``BlockMask`` compiled from the pattern.

FlexAttention skips the (128 x 128) blocks a pattern never touches, so a sliding window costs
time linear in the sequence length. It is only fast when compiled: eager FlexAttention
materialises the whole score matrix (on CPU it measured ~10x slower than dense SDPA), while
compiled block-sparse FlexAttention measured ~6x faster than dense SDPA at 4k tokens and ~25x
at 16k with a 512-token window. So ``flex_attention`` is wrapped in ``torch.compile`` lazily,
on first use (the first compile takes ~10 s, each new length recompiles in a few seconds,
and past torch's recompile limit new lengths run eagerly); set ``VIDGEN_FLEX_COMPILE=0`` to run it eagerly
(fast to start, for tests). If compiling fails, it warns once and falls back to eager.

On CPU FlexAttention has no backward: inputs that require grad are refused with a message
pointing at ``sdpa``.

Block masks are built here rather than with ``create_block_mask``, which evaluates the mask at
every (query, key) pair (at 64k tokens, a 4G-entry tensor): every sparse pattern (block-causal,
sliding-window, radial) becomes per-row key intervals reduced to blocks, cached by pattern,
lengths and device.
"""

from __future__ import annotations

import os
import threading
import warnings

import torch

from vidgen.attention.cache import LRUCache
from vidgen.attention.patterns import AttentionPattern, PatternKind
from vidgen.attention.registry import AttentionBackend

BLOCK = 128
"""FlexAttention's block size (queries and keys)."""

COMPILE_ENV = "VIDGEN_FLEX_COMPILE"

_BLOCK_MASKS: LRUCache = LRUCache(maxsize=32)
_compiled_lock = threading.Lock()
_compiled_fn = None
_compile_failed = False


def _probe() -> str | None:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no FlexAttention (needs torch >= 2.5)"
    return None


def compile_enabled() -> bool:
    """False when ``VIDGEN_FLEX_COMPILE`` is set to 0/false/no/off (read on every call)."""
    return os.environ.get(COMPILE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


# ------------------------------------------------------------------------- block masks
def _blocks_from_row_intervals(
    lo: torch.Tensor, hi: torch.Tensor, kv_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(any, full) bool (QB, KB) from per-row visible key intervals ``[lo, hi)``, shape (q_len, R)."""
    q_len = lo.shape[0]
    n_qb, n_kb = -(-q_len // BLOCK), -(-kv_len // BLOCK)
    pad = n_qb * BLOCK - q_len  # repeat the last row: any/all over a block are unchanged
    lo = torch.cat([lo, lo[-1:].expand(pad, -1)])[:, :, None]  # (Q, R, 1)
    hi = torch.cat([hi, hi[-1:].expand(pad, -1)])[:, :, None]
    k_start = torch.arange(n_kb, device=lo.device) * BLOCK
    k_end = (k_start + BLOCK).clamp(max=kv_len)
    touches = ((lo < k_end) & (hi > k_start) & (lo < hi)).any(1)  # (Q, KB)
    # a partial last key block is never "full", so FlexAttention applies the mask there
    covers = ((lo <= k_start) & (hi >= k_end) & (k_end - k_start == BLOCK)).any(1)
    touches = touches.view(n_qb, BLOCK, n_kb).any(1)
    covers = covers.view(n_qb, BLOCK, n_kb).all(1)
    return touches, covers


def _block_structured_blocks(
    pattern: AttentionPattern, q_len: int, kv_len: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    chunks = pattern.chunk_key_ranges(q_len, kv_len)
    n_ranges = max(len(c.key_ranges) for c in chunks)
    bounds = torch.zeros(len(chunks), n_ranges, 2, dtype=torch.long)  # empty ranges stay (0, 0)
    for i, c in enumerate(chunks):
        bounds[i, : len(c.key_ranges)] = torch.tensor(c.key_ranges)
    rows_per_chunk = torch.tensor([c.query_end - c.query_start for c in chunks])
    bounds = bounds.repeat_interleave(rows_per_chunk, dim=0).to(device)  # (q_len, R, 2)
    return _blocks_from_row_intervals(bounds[..., 0], bounds[..., 1], kv_len)


def _to_indices(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(QB, KB) bool -> FlexAttention's (1, 1, QB) counts and (1, 1, QB, KB) indices (True blocks first)."""
    counts = blocks.sum(-1, dtype=torch.int32)
    indices = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return counts[None, None], indices[None, None]


def build_block_mask(pattern: AttentionPattern, q_len: int, kv_len: int, device: torch.device | str):
    """The FlexAttention ``BlockMask`` for ``pattern`` (suffix-aligned), without a dense mask."""
    from torch.nn.attention.flex_attention import BlockMask

    device = torch.device(device)
    pattern.check_lengths(q_len, kv_len)
    if not pattern.has_key_ranges:
        raise ValueError(f"a {pattern.kind.value} pattern needs no block mask: pass block_mask=None")
    touches, covers = _block_structured_blocks(pattern, q_len, kv_len, device)
    partial_counts, partial_indices = _to_indices(touches & ~covers)
    full_counts, full_indices = _to_indices(covers)
    return BlockMask.from_kv_blocks(
        partial_counts,
        partial_indices,
        full_counts,
        full_indices,
        BLOCK_SIZE=BLOCK,
        mask_mod=pattern.mask_mod_for(q_len, kv_len, device),
        seq_lengths=(q_len, kv_len),
    )


def block_mask(pattern: AttentionPattern, q_len: int, kv_len: int, device: torch.device):
    """:func:`build_block_mask`, cached by pattern, lengths and device."""
    key = (pattern, q_len, kv_len, str(device))
    return _BLOCK_MASKS.get_or_create(key, lambda: build_block_mask(pattern, q_len, kv_len, device))


# ------------------------------------------------------------------------- running
def _flex_function():
    """Compiled ``flex_attention`` (built on first use), or eager when compiling is off or failed."""
    global _compiled_fn
    from torch.nn.attention.flex_attention import flex_attention

    if not compile_enabled() or _compile_failed:
        return flex_attention
    with _compiled_lock:
        if _compiled_fn is None:
            # static shapes: torch 2.13's dynamic-shape CPU flex template fails to build for some
            # length changes, while a static recompile per new length costs a few seconds
            _compiled_fn = torch.compile(flex_attention, dynamic=False)
        return _compiled_fn


def flex_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: AttentionPattern, scale: float | None = None
) -> torch.Tensor:
    """Attention under ``pattern`` with FlexAttention; (B, S, H, D) in, (B, S_q, H, D) out."""
    global _compile_failed
    from torch.nn.attention.flex_attention import flex_attention as eager_flex

    if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError(
            "flex attention has no backward on CPU; use backend 'sdpa' for training "
            "(its blockwise path is linear in length), or run under torch.no_grad()"
        )
    if q.device.type == "cpu":  # FlexAttention refuses CPU tensors that require grad, even under no_grad
        q, k, v = q.detach(), k.detach(), v.detach()
    mask = None if pattern.kind is PatternKind.FULL else block_mask(pattern, q.shape[1], k.shape[1], q.device)
    args = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (B, H, S, D)
    fn = _flex_function()
    try:
        out = fn(*args, block_mask=mask, scale=scale)
    except Exception as err:
        if fn is eager_flex:
            raise
        _compile_failed = True
        warnings.warn(
            f"compiling flex attention failed ({type(err).__name__}: {err}); running it eagerly from now on, "
            "which is slow on CPU: prefer backend 'sdpa'",
            RuntimeWarning,
            stacklevel=2,
        )
        out = eager_flex(*args, block_mask=mask, scale=scale)
    return out.transpose(1, 2)  # (B, S_q, H, D)


BACKEND = AttentionBackend(
    name="flex",
    run=flex_attention,
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}),
    kinds=frozenset(PatternKind),
    grad_devices=frozenset({"cuda"}),
    probe=_probe,
    description="torch FlexAttention with a block-sparse mask; compiled on first use (VIDGEN_FLEX_COMPILE=0: eager)",
)
