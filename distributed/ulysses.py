"""Ulysses attention: trade the token shards for head shards, attend, trade back.

Each of ``P`` ranks holds its slice of every latent frame with all ``H`` heads (see
:mod:`vidgen.distributed.sequence_parallel` for the layout). One all-to-all gives every rank all the
tokens of ``H / P`` heads, in the model's frame-major order; the model's own :func:`attend` then runs
on them -- RoPE over the whole sequence, the KV cache (this rank's heads, every token), the attention
pattern and the chosen backend -- and a second all-to-all returns each rank its tokens with all heads.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from vidgen.models.transformer import SelfAttentionContext, attend

if TYPE_CHECKING:
    from vidgen.distributed.sequence_parallel import SequenceParallelGroup


def tokens_to_heads(
    group: SequenceParallelGroup, shard: torch.Tensor, shard_frame_tokens: int
) -> torch.Tensor:
    """(B, F * T/P, N, H, D) with every head -> (B, F * T, N, H/P, D) with this rank's heads.

    ``N`` packs tensors that travel together (q, k, v). Head group ``j`` (heads ``j * H/P ..``) goes to
    rank ``j``; the slices received from the ranks are interleaved back into frame-major order.
    """
    p, heads = group.size, shard.shape[3]
    send = shard.unflatten(3, (p, heads // p)).permute(3, 0, 1, 2, 4, 5)  # (P, B, S/P, N, H/P, D)
    received = group.all_to_all(send)  # slice i: rank i's tokens, this rank's heads
    received = received.unflatten(2, (-1, shard_frame_tokens))  # (P, B, F, T/P, N, H/P, D)
    return received.permute(1, 2, 0, 3, 4, 5, 6).flatten(1, 3)  # (B, F * P * T/P, N, H/P, D)


def heads_to_tokens(
    group: SequenceParallelGroup, full: torch.Tensor, shard_frame_tokens: int
) -> torch.Tensor:
    """The inverse of :func:`tokens_to_heads` for one tensor: (B, F * T, H/P, D) -> (B, F * T/P, H, D)."""
    p = group.size
    send = full.unflatten(1, (-1, p, shard_frame_tokens)).permute(2, 0, 1, 3, 4, 5)  # (P, B, F, T/P, H/P, D)
    received = group.all_to_all(send)  # slice i: this rank's tokens, rank i's heads
    return received.permute(1, 2, 3, 0, 4, 5).flatten(1, 2).flatten(2, 3)  # (B, F * T/P, H, D)


def ulysses_attention(
    group: SequenceParallelGroup,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    ctx: SelfAttentionContext,
    layer: int,
) -> torch.Tensor:
    """Self-attention of this rank's un-rotated (B, F * T/P, H, D) q/k/v; returns (B, F * T/P, H, D)."""
    shard_frame_tokens = ctx.frame_tokens
    packed = torch.stack([query, key, value], dim=2)  # (B, S/P, 3, H, D): one all-to-all for the three
    full_query, full_key, full_value = tokens_to_heads(group, packed, shard_frame_tokens).unbind(2)
    # the whole sequence now, so the model's own attention applies as it is (ctx.kv_cache: our heads)
    transform = ctx.qk_transform
    if transform is not None:  # a model variant's own rotation, per head: this rank's heads
        share = full_query.shape[2]
        transform = transform.heads(group.rank * share, (group.rank + 1) * share)
    out = attend(full_query, full_key, full_value, replace(ctx, parallel=None, qk_transform=transform), layer)
    return heads_to_tokens(group, out, shard_frame_tokens)
