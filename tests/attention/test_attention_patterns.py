"""Mask semantics of AttentionPattern on tiny cases written out by hand, and its validation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vidgen.attention import AttentionPattern, ChunkKeyRanges, PatternKind


def as_bool(rows: list[str]) -> torch.Tensor:
    """'x' = visible, '.' = hidden; one string per query row."""
    return torch.tensor([[c == "x" for c in row] for row in rows])


def test_block_causal_three_chunks_by_hand():
    # 3 chunks of 2 tokens (1 token per frame, 2 frames per chunk): each sees itself and earlier chunks
    pattern = AttentionPattern.block_causal(frame_tokens=1, chunk_frames=2)
    expected = as_bool(
        [
            "xx....",
            "xx....",
            "xxxx..",
            "xxxx..",
            "xxxxxx",
            "xxxxxx",
        ]
    )
    assert torch.equal(pattern.dense_mask(6, 6), expected)


def test_block_causal_partial_last_chunk():
    # 5 tokens, chunks of 2: the last chunk holds one token and still sees everything before it
    pattern = AttentionPattern.block_causal(frame_tokens=2, chunk_frames=1)
    expected = as_bool(["xx...", "xx...", "xxxx.", "xxxx.", "xxxxx"])
    assert torch.equal(pattern.dense_mask(5, 5), expected)


def test_sliding_window_with_one_sink_frame():
    # one-token frames and chunks, one frame of window, frame 0 is a sink
    pattern = AttentionPattern.sliding_window(frame_tokens=1, chunk_frames=1, window_frames=1, sink_frames=1)
    expected = as_bool(
        [
            "x....",
            "xx...",
            "xxx..",  # window {1} + own {2} + sink {0}
            "x.xx.",
            "x..xx",
        ]
    )
    assert torch.equal(pattern.dense_mask(5, 5), expected)


def test_sliding_window_chunks_without_sinks_and_odd_length():
    # chunks of 2 frames, window of 2 frames, 7 one-token frames: last chunk is partial
    pattern = AttentionPattern.sliding_window(frame_tokens=1, chunk_frames=2, window_frames=2)
    expected = as_bool(
        [
            "xx.....",
            "xx.....",
            "xxxx...",  # window longer than the history: sees everything before it
            "xxxx...",
            "..xxxx.",
            "..xxxx.",
            "....xxx",
        ]
    )
    assert torch.equal(pattern.dense_mask(7, 7), expected)


def test_sliding_window_zero_window_is_own_chunk_plus_sinks():
    pattern = AttentionPattern.sliding_window(frame_tokens=2, chunk_frames=1, window_frames=0, sink_frames=1)
    expected = as_bool(["xx....", "xx....", "xxxx..", "xxxx..", "xx..xx", "xx..xx"])
    assert torch.equal(pattern.dense_mask(6, 6), expected)


def test_full_sees_everything_even_with_more_queries_than_keys():
    assert AttentionPattern.full().dense_mask(5, 3).all()


def test_suffix_alignment_takes_the_last_rows():
    pattern = AttentionPattern.sliding_window(frame_tokens=3, chunk_frames=1, window_frames=1, sink_frames=1)
    full = pattern.dense_mask(13, 13)
    for q_len in (1, 4, 7, 13):
        assert torch.equal(pattern.dense_mask(q_len, 13), full[13 - q_len :])


def test_mask_mod_for_matches_dense_mask():
    pattern = AttentionPattern.block_causal(frame_tokens=3, chunk_frames=2)
    q_idx, kv_idx = torch.arange(5)[:, None], torch.arange(17)[None, :]
    mask_mod = pattern.mask_mod_for(5, 17)
    assert torch.equal(mask_mod(0, 0, q_idx, kv_idx), pattern.dense_mask(5, 17))
    assert torch.equal(pattern.mask_mod(0, 0, kv_idx.T, kv_idx), pattern.dense_mask(17, 17))


def test_mask_mod_is_accepted_by_flex_create_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    pattern = AttentionPattern.sliding_window(frame_tokens=16, chunk_frames=2, window_frames=2, sink_frames=2)
    block_mask = create_block_mask(pattern.mask_mod, None, None, 300, 300, device="cpu")
    assert torch.equal(block_mask.to_dense()[0, 0].bool(), _block_any(pattern.dense_mask(300, 300)))


def _block_any(mask: torch.Tensor, block: int = 128) -> torch.Tensor:
    q_blocks, kv_blocks = -(-mask.shape[0] // block), -(-mask.shape[1] // block)
    padded = torch.zeros(q_blocks * block, kv_blocks * block, dtype=torch.bool)
    padded[: mask.shape[0], : mask.shape[1]] = mask
    return padded.view(q_blocks, block, kv_blocks, block).any(3).any(1)


def test_chunk_key_ranges_by_hand():
    pattern = AttentionPattern.sliding_window(frame_tokens=2, chunk_frames=1, window_frames=1, sink_frames=1)
    # 4 frames of 2 tokens, queries are the last 5 tokens (suffix alignment: positions 3..7)
    assert pattern.chunk_key_ranges(5, 8) == [
        ChunkKeyRanges(0, 1, ((0, 4),)),  # position 3 is in chunk 1: sink 0 touches window 0
        ChunkKeyRanges(1, 3, ((0, 6),)),  # chunk 2: sink frame 0, window frame 1, itself
        ChunkKeyRanges(3, 5, ((0, 2), (4, 8))),  # chunk 3: sink, then frames 2-3
    ]


@pytest.mark.parametrize(
    "pattern",
    [
        AttentionPattern.block_causal(frame_tokens=3, chunk_frames=2),
        AttentionPattern.sliding_window(frame_tokens=2, chunk_frames=2, window_frames=4, sink_frames=2),
        AttentionPattern.sliding_window(frame_tokens=5, chunk_frames=1, window_frames=1),
    ],
)
@pytest.mark.parametrize(("q_len", "kv_len"), [(1, 1), (7, 7), (30, 30), (4, 31), (13, 29)])
def test_chunk_key_ranges_cover_exactly_the_dense_mask(pattern, q_len, kv_len):
    assert torch.equal(_mask_from_ranges(pattern, q_len, kv_len), pattern.dense_mask(q_len, kv_len))


def _mask_from_ranges(pattern: AttentionPattern, q_len: int, kv_len: int) -> torch.Tensor:
    mask = torch.zeros(q_len, kv_len, dtype=torch.bool)
    rows = 0
    for chunk in pattern.chunk_key_ranges(q_len, kv_len):
        assert chunk.query_start == rows  # chunks tile the queries in order
        rows = chunk.query_end
        for start, end in chunk.key_ranges:
            mask[chunk.query_start : chunk.query_end, start:end] = True
    assert rows == q_len
    return mask


@settings(max_examples=60, deadline=None)
@given(
    frame_tokens=st.integers(1, 4),
    chunk_frames=st.integers(1, 3),
    window_chunks=st.integers(0, 3),
    sink_chunks=st.integers(0, 2),
    kv_len=st.integers(1, 40),
    q_frac=st.floats(0.0, 1.0),
)
def test_chunk_key_ranges_property(frame_tokens, chunk_frames, window_chunks, sink_chunks, kv_len, q_frac):
    pattern = AttentionPattern.sliding_window(
        frame_tokens, chunk_frames, window_chunks * chunk_frames, sink_chunks * chunk_frames
    )
    q_len = max(1, round(q_frac * kv_len))
    assert torch.equal(_mask_from_ranges(pattern, q_len, kv_len), pattern.dense_mask(q_len, kv_len))
    density = pattern.density(q_len, kv_len)
    assert density == pytest.approx(pattern.dense_mask(q_len, kv_len).float().mean().item())


def test_patterns_are_hashable_values():
    a = AttentionPattern.sliding_window(frame_tokens=4, chunk_frames=2, window_frames=4)
    b = AttentionPattern(kind="sliding_window", frame_tokens=4, chunk_frames=2, window_frames=4)
    assert a == b and hash(a) == hash(b) and b.kind is PatternKind.SLIDING_WINDOW


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: AttentionPattern.sliding_window(4, 2, window_frames=3), "multiple of chunk_frames=2"),
        (lambda: AttentionPattern.sliding_window(4, 2, window_frames=2, sink_frames=1), "sink_frames=1"),
        (lambda: AttentionPattern.sliding_window(4, 1, window_frames=-1), "non-negative"),
        (lambda: AttentionPattern.block_causal(0), "frame_tokens must be >= 1"),
        (lambda: AttentionPattern.block_causal(4, 0), "chunk_frames must be >= 1"),
        (lambda: AttentionPattern(kind="block_causal", window_frames=2), "only to sliding_window"),
        (lambda: AttentionPattern(kind="diagonal"), "unknown pattern kind 'diagonal'"),
        (lambda: AttentionPattern(kind="tile"), "unknown pattern kind 'tile'"),
        (lambda: AttentionPattern(kind="full", frame_size=(2, 2)), "only to radial patterns, not full"),
        (lambda: AttentionPattern(kind="radial", frame_size=(2, 2)), "needs frame_size and frame_times"),
    ],
)
def test_invalid_patterns_say_what_to_change(build, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()


def test_more_queries_than_keys_only_for_full():
    with pytest.raises(ValueError, match="q_len <= kv_len"):
        AttentionPattern.block_causal(2).dense_mask(5, 4)
    with pytest.raises(ValueError, match="block_causal, sliding_window or radial"):
        AttentionPattern.full().chunk_key_ranges(4, 4)


# --------------------------------------------------------------------------- radial
def test_radial_by_hand():
    # frames of 3 rows x 1 column; key frames: sink 0, window 3, 2 (ring order), then the chunk 4-5;
    # chunks of 2 frames, query tiles of 1 row, dense within 1 frame, a band of 1 row at distance 2
    pattern = AttentionPattern.radial(
        (3, 1), [0, 3, 2, 4, 5], chunk_frames=2, sink_frames=1, dense_frames=1, band_rows=1, tile_rows=1
    )
    assert pattern.frame_times == (-5, -2, -3, -1, 0) and pattern.sink_frames == 1
    # columns: sink 0 (band 1 always) | frame 3 | frame 2 | frame 4 | frame 5
    rows = [
        # frame 4: frame 3 is 1 away (dense), frame 2 is 2 away (radius 1 * 2 // 2 = 1)
        "xx. xxx xx. xxx xxx",
        "xxx xxx xxx xxx xxx",
        ".xx xxx .xx xxx xxx",
        # frame 5: frame 3 is 2 away (radius 1), frame 2 is 3 away (radius 2 // 3 = 0: own row)
        "xx. xx. x.. xxx xxx",
        "xxx xxx .x. xxx xxx",
        ".xx .xx ..x xxx xxx",
    ]
    expected = as_bool([r.replace(" ", "") for r in rows])
    assert torch.equal(pattern.dense_mask(6, 15), expected)
    assert pattern.density(6, 15) == pytest.approx(expected.float().mean().item())


@pytest.mark.parametrize(
    ("keys", "query_frames", "chunk"),
    [
        ([0, 1, 2, 9, 10, 11, 3, 4, 5, 6, 7, 8, 12, 13, 14], 3, 3),  # Wan-like ring, wrapped
        ([0, 1, 2], 3, 3),  # the first chunk: no cache
        ([0, 1, 2, 3, 4, 5, 6, 7], 4, 2),  # two chunks in flight: block-causal between them
    ],
    ids=["ring", "first-chunk", "two-chunks"],
)
def test_radial_key_ranges_are_its_mask(keys, query_frames, chunk):
    # the tile-by-tile ranges (sdpa, flash, block masks) and the predicate (mask_mod) must agree
    pattern = AttentionPattern.radial(
        (7, 3), keys, chunk_frames=chunk, query_frames=query_frames, sink_frames=3, band_rows=2, tile_rows=3
    )
    q_len, kv_len = query_frames * 21, len(keys) * 21
    from_ranges = torch.zeros(q_len, kv_len, dtype=torch.bool)
    for tile in pattern.chunk_key_ranges(q_len, kv_len):
        for start, end in tile.key_ranges:
            from_ranges[tile.query_start : tile.query_end, start:end] = True
    mask = pattern.dense_mask(q_len, kv_len)
    assert torch.equal(from_ranges, mask)
    if query_frames > chunk:  # the first chunk in flight never sees the second
        assert not mask[: chunk * 21, -chunk * 21 :].any()


def test_radial_density_at_wan_geometry():
    # 3 sinks, 9 window frames, a 3-frame chunk of 30x52 tokens, default knobs: under the 40 % budget
    keys = [0, 1, 2, *range(12, 21), 21, 22, 23]
    pattern = AttentionPattern.radial((30, 52), keys, chunk_frames=3, sink_frames=3)
    assert (pattern.dense_frames, pattern.band_rows, pattern.tile_rows) == (1, 3, 5)
    density = pattern.density(4680, 23400)
    assert 0.30 < density <= 0.40
    assert pattern.dense_mask(4680, 23400).float().mean().item() == pytest.approx(density)
    wider = AttentionPattern.radial((30, 52), keys, chunk_frames=3, sink_frames=3, band_rows=6)
    assert wider.density(4680, 23400) > density


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: AttentionPattern.radial((2, 2), [0, 1], chunk_frames=1, tile_rows=3), "1 <= tile_rows <= 2"),
        (lambda: AttentionPattern.radial((2, 2), [0], chunk_frames=1, query_frames=2), "query_frames=2"),
        (lambda: AttentionPattern(kind="block_causal", band_rows=1), "only to radial patterns"),
        (
            lambda: AttentionPattern(kind="radial", frame_size=(2, 2), frame_tokens=4),
            "needs frame_size and frame_times",
        ),
        (
            lambda: AttentionPattern.radial((2, 2), [0, 1], chunk_frames=1).dense_mask(4, 12),
            "describes 2 key frames of 4 tokens",
        ),
    ],
)
def test_invalid_radial_patterns_say_what_to_change(build, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()
