"""Ring attention: queries stay on their rank, keys/values travel around the ring, and the partial
attentions are merged by log-sum-exp.

Each rank holds its slice of every latent frame (see :mod:`vidgen.distributed.sequence_parallel`).
In ``P`` steps a rank attends its queries to every rank's keys -- its shard of the KV cache and its
new tokens, rotated by RoPE at their positions before they leave -- while the next block is in
flight. A step gives, per query, the softmax-weighted values over that block and the log-sum-exp
``lse`` of the block's scores; :func:`merge_attention` combines two such partials exactly:

    lse = log(exp(lse_a) + exp(lse_b)),  out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)

Patterns. Block-causal and sliding-window visibility depends only on the frames of query and key,
and every shard holds the same frames in the same order, so the pattern with ``frame_tokens / P``
tokens per frame describes a shard exactly: each query chunk attends to just the key ranges it sees
(:meth:`AttentionPattern.chunk_key_ranges`), skipping the rest of every block. Other patterns (tile)
use a mask over the tokens' positions in the whole sequence; a block no query sees is skipped.

The block attention here is plain PyTorch in float32 (it must return the log-sum-exp, which the
registered backends do not); attention patterns apply, backend choices do not.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from vidgen.attention import AttentionPattern, PatternKind
from vidgen.models.rope import apply_rope
from vidgen.models.transformer import SelfAttentionContext

if TYPE_CHECKING:
    from vidgen.distributed.sequence_parallel import SequenceParallelGroup

MAX_SCORES = 1 << 25
"""Score-matrix elements computed at once by :func:`attention_with_lse` (queries are tiled to fit)."""

Partial = tuple[torch.Tensor, torch.Tensor]
"""(out (B, S_q, H, D), lse (B, S_q, H)), both float32."""


def attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> Partial:
    """Softmax attention of (B, S_q, H, D) queries over (B, S_k, H, D) keys/values, in float32.

    ``mask``: bool (S_q, S_k), True where the query sees the key. Returns the output and each query's
    log-sum-exp of its visible scores; a query that sees no key gets output 0 and lse -inf.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    batch, q_len, heads, _ = q.shape
    rows = max(1, MAX_SCORES // max(1, batch * heads * k.shape[1]))
    k, v = k.float(), v.float()
    outs, lses = [], []
    for start in range(0, q_len, rows):
        scores = torch.einsum("bqhd,bkhd->bhqk", q[:, start : start + rows].float(), k) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask[start : start + rows], float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # (B, H, rows)
        probs = torch.exp(scores - _finite(lse)[..., None])
        outs.append(torch.einsum("bhqk,bkhd->bqhd", probs, v))
        lses.append(lse.transpose(1, 2))
    return torch.cat(outs, dim=1), torch.cat(lses, dim=1)


def merge_attention(a: Partial, b: Partial) -> Partial:
    """Attention over the union of two disjoint key sets, from the attention over each."""
    out_a, lse_a = a
    out_b, lse_b = b
    lse = torch.logaddexp(lse_a, lse_b)
    reference = _finite(lse)  # rows that have seen no key yet keep out 0, lse -inf
    weight_a = torch.exp(lse_a - reference)[..., None]
    weight_b = torch.exp(lse_b - reference)[..., None]
    return out_a * weight_a + out_b * weight_b, lse


def _finite(lse: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


class ShardLayout:
    """Where a shard's tokens sit in the whole sequence: ``size`` ranks, ``frame_tokens`` per frame,
    rank ``r`` holding tokens ``r * T/P .. (r + 1) * T/P - 1`` of every frame."""

    def __init__(self, frame_tokens: int, size: int) -> None:
        self.frame_tokens = frame_tokens
        self.size = size
        self.shard_frame_tokens = frame_tokens // size

    def positions(self, start: int, count: int, rank: int, device: torch.device) -> torch.Tensor:
        """Whole-sequence positions of shard indices ``start .. start + count - 1`` on ``rank``."""
        index = torch.arange(start, start + count, device=device)
        frame, within = index // self.shard_frame_tokens, index % self.shard_frame_tokens
        return frame * self.frame_tokens + rank * self.shard_frame_tokens + within


def attend_block(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pattern: AttentionPattern | None,
    layout: ShardLayout,
    q_rank: int,
    k_rank: int,
) -> Partial | None:
    """Rank ``q_rank``'s queries over rank ``k_rank``'s keys under ``pattern`` (queries are the last
    positions of the key sequence, as in ``dispatch_attention``); None when no query sees any key."""
    q_len, kv_len = q.shape[1], k.shape[1]
    if pattern is None or pattern.kind is PatternKind.FULL:
        return attention_with_lse(q, k, v)
    if pattern.is_block_structured:
        shard_pattern = replace(pattern, frame_tokens=layout.shard_frame_tokens)
        out = q.new_zeros(q.shape, dtype=torch.float32)
        lse = q.new_full(q.shape[:3], float("-inf"), dtype=torch.float32)
        for chunk in shard_pattern.chunk_key_ranges(q_len, kv_len):
            seen = slice(chunk.query_start, chunk.query_end)
            keys = torch.cat([k[:, a:b] for a, b in chunk.key_ranges], dim=1)
            values = torch.cat([v[:, a:b] for a, b in chunk.key_ranges], dim=1)
            out[:, seen], lse[:, seen] = attention_with_lse(q[:, seen], keys, values)
        return out, lse
    q_pos = layout.positions(kv_len - q_len, q_len, q_rank, q.device)
    k_pos = layout.positions(0, kv_len, k_rank, q.device)
    mask = pattern.visible(q_pos[:, None], k_pos[None, :])
    if not bool(mask.any()):
        return None
    return attention_with_lse(q, k, v, mask)


def ring_attention(
    group: SequenceParallelGroup,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    ctx: SelfAttentionContext,
    layer: int,
) -> torch.Tensor:
    """Self-attention of this rank's un-rotated (B, F * T/P, H, D) q/k/v; returns (B, F * T/P, H, D).

    ``ctx.kv_cache`` is this rank's shard (its tokens of every cached frame, every head);
    ``ctx.rope`` and ``ctx.cache_rope`` cover the whole sequence and are cut to this rank's tokens.
    """
    layout = ShardLayout(ctx.frame_tokens * group.size, group.size)
    rope = group.shard(ctx.rope, layout.frame_tokens)
    q = apply_rope(query, rope)
    k, v = apply_rope(key, rope), value
    cache = ctx.kv_cache
    if cache is not None:
        cached_key, cached_value = cache.view(layer)  # (B, held * T/P, H, D)
        if cached_key.shape[1]:
            cache_rope = group.shard(ctx.cache_rope, layout.frame_tokens)
            k = torch.cat([apply_rope(cached_key.to(key.dtype), cache_rope), k], dim=1)
            v = torch.cat([cached_value.to(value.dtype), v], dim=1)
    if ctx.qk_transform is not None:  # a model variant's own rotation, on this rank's tokens
        transform = ctx.qk_transform.sharded(lambda t: group.shard(t, layout.frame_tokens))
        q, k = transform.apply(q, k, layer)
    block = torch.stack([k, v])  # (2, B, S_kv, H, D): what travels, already rotated

    result: Partial | None = None
    for step in range(group.size):
        in_flight = group.ring_pass(block) if step < group.size - 1 else None
        source = (group.rank - step) % group.size
        partial = attend_block(q, block[0], block[1], ctx.pattern, layout, group.rank, source)
        if partial is not None:
            result = partial if result is None else merge_attention(result, partial)
        if in_flight is not None:
            block = in_flight.wait()

    if cache is not None and ctx.write_frame is not None:  # after the reads: it may overwrite them
        cache.write(layer, key, value, ctx.write_frame)
    if result is None:  # no query sees any key (cannot happen for the model's patterns)
        return torch.zeros_like(query)
    return result[0].to(query.dtype)
