"""Ring attention's pieces on one process: attention with log-sum-exp, the merge, the shard patterns."""

import pytest
import torch

from vidgen.attention import AttentionPattern
from vidgen.distributed import ring
from vidgen.distributed.ring import ShardLayout, attend_block, attention_with_lse, merge_attention

TOL = 1e-6  # fp32 against a float64 reference, scores of O(1)


def _reference(q, k, v, mask=None):
    """Float64 softmax attention and log-sum-exp: (B, S_q, H, D), (B, S_q, H)."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v.double())
    return out, torch.logsumexp(scores, -1).transpose(1, 2)


def _qkv(q_len=12, kv_len=30, batch=2, heads=3, dim=8):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(batch, n, heads, dim, generator=g) for n in (q_len, kv_len, kv_len)]


def test_attention_with_lse_matches_float64():
    q, k, v = _qkv()
    mask = torch.rand(12, 30, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True
    for m in (None, mask):
        out, lse = attention_with_lse(q, k, v, m)
        ref_out, ref_lse = _reference(q, k, v, m)
        assert out.dtype == lse.dtype == torch.float32
        assert (out.double() - ref_out).abs().max() <= TOL
        assert (lse.double() - ref_lse).abs().max() <= TOL


def test_query_tiling_changes_nothing_but_rounding(monkeypatch):
    q, k, v = _qkv()
    whole = attention_with_lse(q, k, v)
    monkeypatch.setattr(ring, "MAX_SCORES", 2 * 3 * 30 * 5)  # 5 query rows at a time
    tiled = attention_with_lse(q, k, v)
    assert (whole[0] - tiled[0]).abs().max() <= TOL and (whole[1] - tiled[1]).abs().max() <= TOL


def test_merging_blocks_equals_attention_over_all_keys():
    """Keys in three uneven blocks, one of which some queries cannot see at all."""
    q, k, v = _qkv()
    blocks = [slice(0, 7), slice(7, 19), slice(19, 30)]
    hidden = torch.ones(12, 11, dtype=torch.bool)
    hidden[:4] = False  # the first 4 queries see nothing in the last block
    merged = None
    for block in blocks:
        mask = hidden if block.start == 19 else None
        partial = attention_with_lse(q, k[:, block], v[:, block], mask)
        merged = partial if merged is None else merge_attention(merged, partial)
    full_mask = torch.ones(12, 30, dtype=torch.bool)
    full_mask[:, 19:] = hidden
    ref_out, ref_lse = _reference(q, k, v, full_mask)
    assert (merged[0].double() - ref_out).abs().max() <= TOL
    assert (merged[1].double() - ref_lse).abs().max() <= TOL


def test_merge_of_rows_that_saw_nothing_stays_empty():
    """A query that sees no key in either block keeps output 0 and lse -inf (no NaN)."""
    q, k, v = _qkv(q_len=2, kv_len=4)
    nothing = torch.zeros(2, 4, dtype=torch.bool)
    a = attention_with_lse(q, k, v, nothing)
    out, lse = merge_attention(a, attention_with_lse(q, k, v, nothing))
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    out, lse = merge_attention(a, attention_with_lse(q, k, v))  # then a block it does see
    ref_out, ref_lse = _reference(q, k, v)
    assert (out.double() - ref_out).abs().max() <= TOL and (lse.double() - ref_lse).abs().max() <= TOL


@pytest.mark.parametrize(
    "pattern",
    [
        AttentionPattern.block_causal(frame_tokens=8, chunk_frames=1),
        AttentionPattern.sliding_window(frame_tokens=8, chunk_frames=1, window_frames=2, sink_frames=1),
        # radial, one-row query tiles, no band: another frame's other row is never seen
        AttentionPattern.radial(
            (2, 4), range(6), chunk_frames=1, query_frames=2, dense_frames=0, band_rows=0, tile_rows=1
        ),
    ],
)
@pytest.mark.parametrize("q_rank, k_rank", [(0, 0), (0, 1), (1, 0)])
def test_block_under_a_pattern_equals_the_whole_sequence_mask(pattern, q_rank, k_rank):
    """A shard (its 4 of every frame's 8 tokens, 6 frames, the last 2 the queries) attending to
    a rank's shard sees exactly the keys the whole-sequence pattern shows it; a block it cannot see
    at all is skipped."""
    layout = ShardLayout(frame_tokens=8, size=2)  # 2 x 4 tokens per frame: rank r holds row r
    q, k, v = _qkv(q_len=2 * 4, kv_len=6 * 4)
    got = attend_block(q, k, v, pattern, layout, q_rank, k_rank)
    q_pos = layout.positions(4 * 4, 2 * 4, q_rank, q.device)
    k_pos = layout.positions(0, 6 * 4, k_rank, q.device)
    mask = pattern.visible(q_pos[:, None], k_pos[None, :])
    assert not mask.all()  # the pattern hides part of the block
    if not mask.any():  # a block the pattern hides entirely is skipped
        assert got is None
        return
    expected = attention_with_lse(q, k, v, mask)
    assert (got[0] - expected[0]).abs().max() <= TOL
    assert (got[1] - expected[1]).abs().max() <= TOL


def test_shard_layout_positions():
    layout = ShardLayout(frame_tokens=6, size=3)  # 2 tokens of every frame per rank
    assert layout.positions(0, 6, 1, torch.device("cpu")).tolist() == [2, 3, 8, 9, 14, 15]
