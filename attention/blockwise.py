"""Chunk-by-chunk attention for block-structured patterns, at a cost linear in the sequence length.

In a ``block_causal`` or ``sliding_window`` pattern every query of a chunk sees the same keys
(a few contiguous ranges: sinks, window, the chunk itself). So instead of one attention call
with a ``(q_len, kv_len)`` mask that is mostly False, a backend can attend each chunk to just
the keys it sees. The result is the same softmax over the same keys, and backward works
through plain slicing, gathering and concatenation.

Two things keep the number of kernel calls small, which matters on a busy CPU where every
call pays for waking its threads:

* tiny chunks are merged into *steps* of at least ``min_query_tokens`` queries; a merged step
  attends to the union of its chunks' keys with a small boolean mask (only the union is
  materialised, never the full row);
* consecutive steps of the same shape (a sliding window away from the edges: same number of
  queries, same number of keys, same mask) form one *call*: their keys are gathered into the
  batch axis and one kernel call runs them all, in slices bounded by :data:`GATHER_BUDGET`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vidgen.attention.cache import LRUCache
from vidgen.attention.patterns import AttentionPattern

# kernel(q, k, v, mask) on (B', S, H, D) tensors; mask is None or bool (S_q, S_k), True = visible,
# shared by every batch element.
StepKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]

GATHER_BUDGET = 1 << 25
"""Most key elements (B * steps * keys * H * D) gathered for one batched kernel call."""


@dataclass(frozen=True)
class BlockwiseStep:
    """Queries ``[query_start, query_end)`` attending to the concatenated ``key_ranges``."""

    query_start: int
    query_end: int
    key_ranges: tuple[tuple[int, int], ...]
    mask: torch.Tensor | None
    """None when every query of the step sees every gathered key; else bool (S_q, S_k)."""

    @property
    def num_queries(self) -> int:
        return self.query_end - self.query_start

    @property
    def num_keys(self) -> int:
        return sum(end - start for start, end in self.key_ranges)


@dataclass(frozen=True)
class BlockwiseCall:
    """Consecutive steps of one shape, run as a single batched kernel call."""

    steps: tuple[BlockwiseStep, ...]
    key_index: torch.Tensor | None
    """(steps, keys) key positions for gathering; None for a single step (sliced, no copy)."""

    @property
    def query_start(self) -> int:
        return self.steps[0].query_start

    @property
    def step_queries(self) -> int:
        return self.steps[0].num_queries


def _union(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return tuple((start, end) for start, end in merged)


def _positions(ranges: tuple[tuple[int, int], ...], device: torch.device | str | None) -> torch.Tensor:
    return torch.cat([torch.arange(start, end, device=device) for start, end in ranges])


def plan_steps(
    pattern: AttentionPattern,
    q_len: int,
    kv_len: int,
    device: torch.device | str | None = None,
    min_query_tokens: int = 0,
) -> list[BlockwiseStep]:
    """Split attention under ``pattern`` into steps over query chunks (merged up to ``min_query_tokens``).

    With ``min_query_tokens=0`` every step is one chunk and carries no mask, which is what
    kernels without mask support (flash-attn) need.
    """
    chunks = pattern.chunk_key_ranges(q_len, kv_len)
    offset = kv_len - q_len
    steps = []
    i = 0
    while i < len(chunks):
        group = [chunks[i]]
        i += 1
        while i < len(chunks) and group[-1].query_end - group[0].query_start < min_query_tokens:
            group.append(chunks[i])
            i += 1
        q_start, q_end = group[0].query_start, group[-1].query_end
        if all(c.key_ranges == group[0].key_ranges for c in group):
            steps.append(BlockwiseStep(q_start, q_end, group[0].key_ranges, None))
            continue
        key_ranges = _union([r for c in group for r in c.key_ranges])
        q_pos = torch.arange(q_start + offset, q_end + offset, device=device)
        mask = pattern.visible(q_pos[:, None], _positions(key_ranges, device)[None, :])  # (S_q, S_k)
        steps.append(BlockwiseStep(q_start, q_end, key_ranges, mask))
    return steps


def _same_shape(a: BlockwiseStep, b: BlockwiseStep) -> bool:
    if (a.num_queries, a.num_keys) != (b.num_queries, b.num_keys) or (a.mask is None) != (b.mask is None):
        return False
    return a.mask is None or (b.mask is not None and torch.equal(a.mask, b.mask))


def plan_blockwise(
    pattern: AttentionPattern,
    q_len: int,
    kv_len: int,
    device: torch.device | str | None = None,
    min_query_tokens: int = 0,
) -> tuple[BlockwiseCall, ...]:
    """:func:`plan_steps`, with runs of same-shaped steps grouped into batched calls."""
    runs: list[list[BlockwiseStep]] = []
    for step in plan_steps(pattern, q_len, kv_len, device, min_query_tokens):
        if runs and _same_shape(runs[-1][-1], step):
            runs[-1].append(step)
        else:
            runs.append([step])
    calls = []
    for run in runs:
        key_index = None
        if len(run) > 1:
            key_index = torch.stack([_positions(s.key_ranges, device) for s in run])  # (steps, keys)
        calls.append(BlockwiseCall(tuple(run), key_index))
    return tuple(calls)


_PLANS: LRUCache[tuple[BlockwiseCall, ...]] = LRUCache(maxsize=32)


def cached_plan(
    pattern: AttentionPattern, q_len: int, kv_len: int, device: torch.device, min_query_tokens: int = 0
) -> tuple[BlockwiseCall, ...]:
    """:func:`plan_blockwise`, cached by pattern, lengths, device and step size."""
    key = (pattern, q_len, kv_len, str(device), min_query_tokens)
    return _PLANS.get_or_create(key, lambda: plan_blockwise(pattern, q_len, kv_len, device, min_query_tokens))


def _gather(x: torch.Tensor, ranges: tuple[tuple[int, int], ...]) -> torch.Tensor:
    if len(ranges) == 1:  # a view, no copy
        start, end = ranges[0]
        return x[:, start:end]
    return torch.cat([x[:, start:end] for start, end in ranges], dim=1)


def _run_call(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: BlockwiseCall, kernel: StepKernel
) -> list[torch.Tensor]:
    mask = call.steps[0].mask
    if call.key_index is None:
        step = call.steps[0]
        q_step = q[:, step.query_start : step.query_end]
        return [kernel(q_step, _gather(k, step.key_ranges), _gather(v, step.key_ranges), mask)]
    batch, _, heads, dim = q.shape
    n_steps, n_keys = call.key_index.shape
    per_call = max(1, GATHER_BUDGET // (batch * n_keys * heads * dim))
    size = call.step_queries
    outputs = []
    for first in range(0, n_steps, per_call):
        index = call.key_index[first : first + per_call]
        m = index.shape[0]
        start = call.query_start + first * size
        q_steps = q[:, start : start + m * size].reshape(batch * m, size, heads, dim)  # (B * m, S_q, H, D)
        # index_select rather than k[:, index]: the same gather, several times faster on CPU
        flat = index.flatten()
        k_steps = k.index_select(1, flat).reshape(batch * m, n_keys, heads, dim)  # (B * m, S_k, H, D)
        v_steps = v.index_select(1, flat).reshape(batch * m, n_keys, heads, dim)
        out = kernel(q_steps, k_steps, v_steps, mask)
        outputs.append(out.reshape(batch, m * size, heads, dim))  # (B, m * S_q, H, D)
    return outputs


def run_blockwise(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, calls: tuple[BlockwiseCall, ...], kernel: StepKernel
) -> torch.Tensor:
    """Run ``kernel`` for every call on (B, S, H, D) tensors and stitch the outputs along S."""
    outputs = [out for call in calls for out in _run_call(q, k, v, call, kernel)]
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)  # (B, S_q, H, D)


# ----------------------------------------------------------------------------- rectangles
# A second way to run a key-ranged pattern, without gathering keys: cover the visible pairs with
# rectangles (a run of consecutive query groups x one contiguous key range they all see), attend
# each rectangle over views of q/k/v, and merge the partial results per query with their
# log-sum-exp. A key range shared by many query groups (a whole nearby frame) becomes one call
# with many queries, which CPU kernels run more efficiently than many calls with few queries.


def plan_rectangles(
    pattern: AttentionPattern, q_len: int, kv_len: int
) -> tuple[tuple[int, int, int, int], ...]:
    """``(q_start, q_end, k_start, k_end)`` rectangles covering exactly the pairs ``pattern`` shows.

    Key ranges are cut at frame boundaries first, so that a whole frame seen by every group of
    queries is one rectangle even where some groups' ranges run on into the next frame.
    """
    ft = pattern.frame_tokens
    rects: list[tuple[int, int, int, int]] = []
    open_runs: dict[tuple[int, int], tuple[int, int]] = {}  # key piece -> (q_start, q_end)
    for group in pattern.chunk_key_ranges(q_len, kv_len):
        pieces = set()
        for start, end in group.key_ranges:
            while start < end:
                cut = min(end, (start // ft + 1) * ft)
                pieces.add((start, cut))
                start = cut
        for piece in [p for p in open_runs if p not in pieces]:
            rects.append((*open_runs.pop(piece), *piece))
        for piece in sorted(pieces):
            run = open_runs.get(piece)
            if run is not None and run[1] == group.query_start:
                open_runs[piece] = (run[0], group.query_end)
            else:
                if run is not None:
                    rects.append((*run, *piece))
                open_runs[piece] = (group.query_start, group.query_end)
    rects.extend((*run, *piece) for piece, run in open_runs.items())
    # join rectangles over the same queries whose keys are adjacent (fewer, larger calls)
    rects.sort()
    joined: list[tuple[int, int, int, int]] = []
    for rect in rects:
        last = joined[-1] if joined else None
        if last is not None and last[:2] == rect[:2] and last[3] == rect[2]:
            joined[-1] = (last[0], last[1], last[2], rect[3])
        else:
            joined.append(rect)
    return tuple(joined)


_RECTANGLES: LRUCache[tuple[tuple[int, int, int, int], ...]] = LRUCache(maxsize=32)


def cached_rectangles(
    pattern: AttentionPattern, q_len: int, kv_len: int
) -> tuple[tuple[int, int, int, int], ...]:
    """:func:`plan_rectangles`, cached by pattern and lengths."""
    key = (pattern, q_len, kv_len)
    return _RECTANGLES.get_or_create(key, lambda: plan_rectangles(pattern, q_len, kv_len))


def run_rectangles(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rects: tuple[tuple[int, int, int, int], ...],
    scale: float | None = None,
) -> torch.Tensor:
    """Attention over ``rects`` on (B, S, H, D) CPU tensors, no grad; (B, S_q, H, D) out.

    Each rectangle runs torch's CPU flash kernel, which also returns the log-sum-exp of its
    scores; partial outputs are merged per query in float32 as in flash-decoding.
    """
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    batch, q_len, heads, dim = q.shape
    out = q.new_zeros(batch, q_len, heads, dim, dtype=torch.float32)
    lse = q.new_full((batch, q_len, heads), float("-inf"), dtype=torch.float32)
    for q_start, q_end, k_start, k_end in rects:
        part, part_lse = kernel(
            q[:, q_start:q_end].transpose(1, 2),  # (B, H, S, D) views
            k[:, k_start:k_end].transpose(1, 2),
            v[:, k_start:k_end].transpose(1, 2),
            scale=scale,
        )
        part_lse = part_lse.transpose(1, 2)  # (B, S_q, H)
        old = lse[:, q_start:q_end]
        new = torch.logaddexp(old, part_lse)
        rows = out[:, q_start:q_end]
        rows.mul_((old - new).exp_().unsqueeze(-1))
        rows.add_(part.transpose(1, 2).float() * (part_lse - new).exp_().unsqueeze(-1))
        lse[:, q_start:q_end] = new
    return out.to(q.dtype)
