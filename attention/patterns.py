"""Attention patterns: which keys each query may see, as data that every backend compiles.

A pattern is a frozen, hashable description (kind, chunk size, window, sinks, frame layout). It does
not run attention; it answers "may query ``q`` see key ``k``?" in three forms that backends
turn into their own kernels:

* :meth:`AttentionPattern.visible` / :meth:`AttentionPattern.mask_mod`: a vectorised
  predicate built from torch ops (FlexAttention's ``mask_mod`` signature);
* :meth:`AttentionPattern.dense_mask`: a boolean ``(q_len, kv_len)`` matrix for SDPA and
  attention biases;
* :meth:`AttentionPattern.chunk_key_ranges`: for the block-structured kinds
  (``block_causal``, ``sliding_window``), the contiguous key ranges each query chunk sees, so
  that a backend can run attention chunk by chunk at a cost linear in the sequence length;
  for ``radial``, the ranges each query tile (a few rows of one frame) sees.

``radial`` is the pattern generation uses for a chunk over its KV cache
(``generation.attention = "radial"``): it carries the frame layout of the keys (which frame of
the video each key frame is, which are sinks, the (h, w) grid), because the cache's ring holds
the window out of time order.

Positions. Tokens are indexed along the sequence axis ``S`` of the ``(B, S, H, D)`` layout.
A token's frame is ``index // frame_tokens`` and its chunk is ``frame // chunk_frames``;
sequences need not hold whole frames or chunks (the last one may be partial).

Suffix alignment. When there are fewer queries than keys (``q_len < kv_len``, e.g. a new chunk
attending to a KV cache), the queries are the *last* ``q_len`` positions of the key sequence:
query ``i`` sits at position ``kv_len - q_len + i``. This is flash-attn's convention for
causal attention with a KV cache. Only the ``full`` kind allows ``q_len > kv_len``
(cross-attention to text, say).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

import torch


class PatternKind(str, Enum):
    """The families of attention patterns; each backend declares which it supports."""

    FULL = "full"
    """Every query sees every key."""
    BLOCK_CAUSAL = "block_causal"
    """A chunk sees itself (bidirectionally) and every earlier chunk."""
    SLIDING_WINDOW = "sliding_window"
    """Block-causal, limited to a window of frames before the query's chunk, plus sink frames."""
    RADIAL = "radial"
    """A chunk against a KV cache: dense for the nearest frames, a band of rows around the query's
    tile in farther frames that narrows with temporal distance (radial attention)."""


BLOCK_STRUCTURED = frozenset({PatternKind.BLOCK_CAUSAL, PatternKind.SLIDING_WINDOW})
"""Kinds whose visibility depends only on the query's chunk: every query of a chunk sees the
same keys, so attention can be run chunk by chunk without a mask."""


KEY_RANGED = BLOCK_STRUCTURED | {PatternKind.RADIAL}
"""Kinds whose queries fall into groups (a chunk; radial: a tile of rows in one frame) that see the
same contiguous key ranges, so that attention runs group by group without a mask
(:meth:`AttentionPattern.chunk_key_ranges`)."""


class ChunkKeyRanges(NamedTuple):
    """The keys one query chunk sees.

    ``query_start``/``query_end`` index the query tensor (``0 <= start < end <= q_len``);
    ``key_ranges`` are sorted, disjoint, non-adjacent half-open ``(start, end)`` ranges of key
    indices, every key of which is visible to every query of the chunk.
    """

    query_start: int
    query_end: int
    key_ranges: tuple[tuple[int, int], ...]


@functools.lru_cache(maxsize=64)
def _frame_times_on(frame_times: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``frame_times`` as a tensor on ``device``, made once (FlexAttention's mask_mod captures it)."""
    return torch.tensor(frame_times, dtype=torch.long, device=device)


@dataclass(frozen=True)
class AttentionPattern:
    """Which keys each query sees. Build one with the classmethods, e.g.
    ``AttentionPattern.sliding_window(frame_tokens=1560, chunk_frames=3, window_frames=9)``.
    """

    kind: PatternKind = PatternKind.FULL
    """The pattern family."""
    frame_tokens: int = 1
    """Tokens per latent frame (``h * w`` after patchifying)."""
    chunk_frames: int = 1
    """Latent frames per causal chunk (block_causal, sliding_window)."""
    window_frames: int = 0
    """sliding_window: frames of history visible before the query's chunk; a multiple of chunk_frames."""
    sink_frames: int = 0
    """sliding_window: the first frames of the video, always visible; a multiple of chunk_frames."""
    frame_size: tuple[int, int] | None = None
    """radial: the (h, w) of one frame, in tokens. Tokens are laid out frame-major, (t, y, x)."""
    frame_times: tuple[int, ...] | None = None
    """radial: the latent frame index of every key frame, in sequence order, relative to the newest
    (0); the KV cache's ring keeps frames out of time order. The first ``sink_frames`` are sinks."""
    dense_frames: int = 0
    """radial: key frames at most this many frames from the query's frame are seen whole."""
    band_rows: int = 0
    """radial: rows seen above and below the query's tile in the nearest sparse frame and in the
    sinks; at temporal distance ``d`` it is ``band_rows * (dense_frames + 1) // d``."""
    tile_rows: int = 0
    """radial: queries are grouped in tiles of this many rows of one frame; a tile sees the same keys."""

    # the fields a radial pattern must have (checked in __post_init__), not Optional
    @property
    def _hw(self) -> tuple[int, int]:
        assert self.frame_size is not None
        return self.frame_size

    @property
    def _times(self) -> tuple[int, ...]:
        assert self.frame_times is not None
        return self.frame_times

    # ----------------------------------------------------------------- constructors
    @classmethod
    def full(cls) -> AttentionPattern:
        """Every query sees every key."""
        return cls(PatternKind.FULL)

    @classmethod
    def block_causal(cls, frame_tokens: int, chunk_frames: int = 1) -> AttentionPattern:
        """Chunks of ``chunk_frames`` frames see themselves and all earlier chunks."""
        return cls(PatternKind.BLOCK_CAUSAL, frame_tokens=frame_tokens, chunk_frames=chunk_frames)

    @classmethod
    def sliding_window(
        cls, frame_tokens: int, chunk_frames: int, window_frames: int, sink_frames: int = 0
    ) -> AttentionPattern:
        """Block-causal, but a chunk sees only ``window_frames`` frames before it plus the first
        ``sink_frames`` frames of the video."""
        return cls(
            PatternKind.SLIDING_WINDOW,
            frame_tokens=frame_tokens,
            chunk_frames=chunk_frames,
            window_frames=window_frames,
            sink_frames=sink_frames,
        )

    @classmethod
    def radial(
        cls,
        frame_size: tuple[int, int],
        key_frames: Sequence[int],
        *,
        chunk_frames: int,
        query_frames: int | None = None,
        sink_frames: int = 0,
        dense_frames: int = 1,
        band_rows: int | None = None,
        tile_rows: int | None = None,
    ) -> AttentionPattern:
        """Radial attention of a chunk over a KV cache (keys = cached frames, then the queries' frames).

        ``key_frames`` are the absolute latent frame indices of the key sequence frame by frame
        (the cache's ``cached_frames`` followed by the chunk's); the queries are the last
        ``query_frames`` (default ``chunk_frames``) of them. Cached frames with an index below
        ``sink_frames`` are sinks. Defaults scale with the frame: query tiles of ``ceil(h / 6)``
        rows, ``band_rows = ceil(h / 10)`` (at Wan-1.3B's 30x52 tokens, 3 sinks, 9 window frames and a
        3-frame chunk: 38 % of the keys).
        """
        h, w = (int(v) for v in frame_size)
        frames = [int(f) for f in key_frames]
        query_frames = chunk_frames if query_frames is None else query_frames
        if not 0 < query_frames <= len(frames):
            raise ValueError(f"query_frames={query_frames} must be in 1..len(key_frames)={len(frames)}")
        cached = frames[: len(frames) - query_frames]
        sinks = next((i for i, f in enumerate(cached) if f >= sink_frames), len(cached))
        newest = max(frames)
        return cls(
            PatternKind.RADIAL,
            frame_tokens=h * w,
            chunk_frames=chunk_frames,
            sink_frames=sinks,
            frame_size=(h, w),
            frame_times=tuple(f - newest for f in frames),
            dense_frames=dense_frames,
            band_rows=-(-h // 10) if band_rows is None else band_rows,
            tile_rows=-(-h // 6) if tile_rows is None else tile_rows,
        )

    # ----------------------------------------------------------------- validation
    def __post_init__(self) -> None:
        try:
            kind = PatternKind(self.kind)
        except ValueError:
            choices = ", ".join(k.value for k in PatternKind)
            raise ValueError(f"unknown pattern kind {self.kind!r}; choose one of: {choices}") from None
        object.__setattr__(self, "kind", kind)
        if self.frame_tokens < 1:
            raise ValueError(f"frame_tokens must be >= 1 (tokens per latent frame), got {self.frame_tokens}")
        if self.chunk_frames < 1:
            raise ValueError(f"chunk_frames must be >= 1 (frames per causal chunk), got {self.chunk_frames}")

        self._check_window(kind)
        self._check_radial(kind)

    def _check_window(self, kind: PatternKind) -> None:
        if kind is PatternKind.RADIAL:
            return
        if kind is not PatternKind.SLIDING_WINDOW:
            if self.window_frames or self.sink_frames:
                raise ValueError(
                    f"window_frames and sink_frames apply only to sliding_window, not {kind.value}; "
                    "use AttentionPattern.sliding_window(...) or leave them at 0"
                )
            return
        for name in ("window_frames", "sink_frames"):
            value = getattr(self, name)
            if value < 0 or value % self.chunk_frames:
                raise ValueError(
                    f"{name}={value} must be a non-negative multiple of chunk_frames={self.chunk_frames}, "
                    "so that every query of a chunk sees the same keys; round it to a whole number of chunks"
                )

    def _check_radial(self, kind: PatternKind) -> None:
        radial = (self.frame_size, self.frame_times, self.dense_frames, self.band_rows, self.tile_rows)
        if kind is not PatternKind.RADIAL:
            if radial != (None, None, 0, 0, 0):
                raise ValueError(
                    "frame_size, frame_times, dense_frames, band_rows and tile_rows apply only to radial "
                    f"patterns, not {kind.value}"
                )
            return
        if self.frame_times is None or self.frame_size is None:
            raise ValueError(
                "a radial pattern needs frame_size and frame_times; use AttentionPattern.radial(...)"
            )
        object.__setattr__(self, "frame_size", tuple(int(v) for v in self.frame_size))
        object.__setattr__(self, "frame_times", tuple(int(t) for t in self.frame_times))
        h, w = self._hw
        if self.frame_tokens != h * w:
            raise ValueError(f"frame_tokens={self.frame_tokens} disagrees with frame_size={self.frame_size}")
        if not self._times:
            raise ValueError("frame_times is empty: a radial pattern needs at least one key frame")
        if not 0 <= self.sink_frames <= len(self._times):
            raise ValueError(
                f"sink_frames={self.sink_frames} must be in 0..{len(self._times)} (the key frames)"
            )
        if self.dense_frames < 0 or self.band_rows < 0 or not 1 <= self.tile_rows <= h:
            raise ValueError(
                f"radial needs dense_frames >= 0, band_rows >= 0 and 1 <= tile_rows <= {h} (the frame's rows); "
                f"got {self.dense_frames}, {self.band_rows}, {self.tile_rows}"
            )

    # ----------------------------------------------------------------- properties
    @property
    def chunk_tokens(self) -> int:
        """Tokens per causal chunk (``frame_tokens * chunk_frames``)."""
        return self.frame_tokens * self.chunk_frames

    @property
    def is_block_structured(self) -> bool:
        """True when every query of a chunk sees the same keys (see :data:`BLOCK_STRUCTURED`)."""
        return self.kind in BLOCK_STRUCTURED

    @property
    def has_key_ranges(self) -> bool:
        """True when :meth:`chunk_key_ranges` applies (see :data:`KEY_RANGED`)."""
        return self.kind in KEY_RANGED

    def check_lengths(self, q_len: int, kv_len: int) -> None:
        """Raise ``ValueError`` if this pattern cannot place ``q_len`` queries over ``kv_len`` keys."""
        if q_len < 1 or kv_len < 1:
            raise ValueError(
                f"attention needs at least one query and one key, got q_len={q_len}, kv_len={kv_len}"
            )
        if self.kind is PatternKind.RADIAL:
            frames = len(self._times)
            if kv_len != frames * self.frame_tokens or q_len % self.frame_tokens:
                raise ValueError(
                    f"this radial pattern describes {frames} key frames of {self.frame_tokens} tokens "
                    f"({frames * self.frame_tokens} keys) and whole query frames; got q_len={q_len}, kv_len={kv_len}"
                )
        if q_len > kv_len and self.kind is not PatternKind.FULL:
            raise ValueError(
                f"a {self.kind.value} pattern needs q_len <= kv_len (queries are the last q_len positions "
                f"of the key sequence), got q_len={q_len} > kv_len={kv_len}"
            )

    # ----------------------------------------------------------------- the predicate
    def visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Whether the query at absolute position ``q_pos`` sees the key at ``k_pos``.

        Integer tensors that broadcast against each other; only torch ops, so the predicate can
        be vmapped and compiled (FlexAttention). Positions are absolute: apply the suffix offset
        first when ``q_len < kv_len`` (see :meth:`mask_mod_for`).
        """
        if self.kind is PatternKind.FULL:
            return (q_pos >= 0) & (k_pos >= 0)
        if self.kind is PatternKind.RADIAL:
            return self._radial_visible(q_pos, k_pos, _frame_times_on(self._times, q_pos.device))
        q_chunk = q_pos // self.chunk_tokens
        causal = k_pos // self.chunk_tokens <= q_chunk
        if self.kind is PatternKind.BLOCK_CAUSAL:
            return causal
        k_frame = k_pos // self.frame_tokens
        in_window = k_frame >= q_chunk * self.chunk_frames - self.window_frames
        is_sink = k_frame < self.sink_frames
        return causal & (in_window | is_sink)

    def _radial_visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        _, w = self._hw
        ft, c = self.frame_tokens, self.chunk_frames
        last = len(self._times) - 1
        q_frame, k_frame = (
            (q_pos // ft).clamp(max=last),
            (k_pos // ft).clamp(max=last),
        )  # clamp: padded blocks
        q_time, k_time = times[q_frame], times[k_frame]
        # chunks count back from the newest frame (time 0): no key from a later chunk than the query's
        causal = (k_time + c - 1) // c <= (q_time + c - 1) // c
        distance = (q_time - k_time).abs()
        radius = torch.where(
            k_frame < self.sink_frames,
            self.band_rows,
            self.band_rows * (self.dense_frames + 1) // distance.clamp(min=1),
        )
        tile_start = (q_pos % ft) // w // self.tile_rows * self.tile_rows
        k_row = (k_pos % ft) // w
        in_band = (k_row >= tile_start - radius) & (k_row < tile_start + self.tile_rows + radius)
        return causal & ((distance <= self.dense_frames) | in_band)

    @property
    def mask_mod(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` for ``q_len == kv_len`` (index = position).

        A plain function rather than a bound method, because FlexAttention tells mask and
        score functions apart by counting their positional arguments.
        """
        return self._shifted_mask_mod(0)

    def mask_mod_for(
        self, q_len: int, kv_len: int, device: torch.device | str | None = None
    ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """A FlexAttention ``mask_mod`` with the suffix alignment for ``q_len`` queries over ``kv_len``
        keys, for tensors on ``device`` (radial patterns capture their frame times there)."""
        self.check_lengths(q_len, kv_len)
        return self._shifted_mask_mod(max(kv_len - q_len, 0), device)

    def _shifted_mask_mod(self, offset: int, device: torch.device | str | None = None):
        visible = self.visible
        if self.kind is PatternKind.RADIAL:
            # the frame times are made here, outside the traced function, and captured by it
            times = torch.tensor(self._times, dtype=torch.long, device=device)
            radial = self._radial_visible

            def radial_mask_mod(b, h, q_idx, kv_idx):
                return radial(q_idx + offset, kv_idx, times)

            return radial_mask_mod

        def mask_mod(b, h, q_idx, kv_idx):
            return visible(q_idx + offset, kv_idx)

        return mask_mod

    def dense_mask(self, q_len: int, kv_len: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Boolean ``(q_len, kv_len)`` matrix, True where the query sees the key (suffix-aligned)."""
        self.check_lengths(q_len, kv_len)
        offset = max(kv_len - q_len, 0)
        q_pos = torch.arange(offset, offset + q_len, device=device)
        k_pos = torch.arange(kv_len, device=device)
        return self.visible(q_pos[:, None], k_pos[None, :])

    # ----------------------------------------------------------------- block structure
    def chunk_key_ranges(self, q_len: int, kv_len: int) -> list[ChunkKeyRanges]:
        """For each query chunk (radial: query tile), the key ranges it sees (see :data:`KEY_RANGED`).

        The first and last query chunks may be partial (suffix alignment, odd lengths). The
        number of visible keys per chunk is bounded by window + sinks + one chunk, which is what
        makes chunk-by-chunk attention linear in the sequence length.
        """
        if not self.has_key_ranges:
            raise ValueError(
                f"chunk_key_ranges needs a block_causal, sliding_window or radial pattern, not {self.kind.value}"
            )
        self.check_lengths(q_len, kv_len)
        if self.kind is PatternKind.RADIAL:
            return self._radial_key_ranges(q_len, kv_len)
        offset = kv_len - q_len
        ct, ft = self.chunk_tokens, self.frame_tokens
        chunks = []
        for chunk in range(offset // ct, (kv_len - 1) // ct + 1):
            q_start, q_end = max(chunk * ct, offset), min((chunk + 1) * ct, kv_len)
            key_end = q_end  # causal: nothing after the chunk; the chunk itself is whole up to kv_len
            if self.kind is PatternKind.BLOCK_CAUSAL:
                ranges: tuple[tuple[int, int], ...] = ((0, key_end),)
            else:
                window_start = max(chunk * self.chunk_frames - self.window_frames, 0) * ft
                sink_end = self.sink_frames * ft
                if sink_end >= window_start:  # sinks touch or overlap the window: one range
                    ranges = ((0, key_end),)
                elif sink_end > 0:
                    ranges = ((0, sink_end), (window_start, key_end))
                else:
                    ranges = ((window_start, key_end),)
            chunks.append(ChunkKeyRanges(q_start - offset, q_end - offset, ranges))
        return chunks

    def _radial_key_ranges(self, q_len: int, kv_len: int) -> list[ChunkKeyRanges]:
        """One entry per query tile (``tile_rows`` rows of one frame): per key frame, the whole
        frame, a band of rows, or nothing; the same rule as :meth:`_radial_visible`."""
        h, w = self._hw
        ft, c, times = self.frame_tokens, self.chunk_frames, self._times
        first_query_frame = (kv_len - q_len) // ft
        tiles = []
        for q_frame in range(first_query_frame, len(times)):
            q_time = times[q_frame]
            for tile_start in range(0, h, self.tile_rows):
                tile_end = min(tile_start + self.tile_rows, h)
                ranges: list[tuple[int, int]] = []
                for k_frame, k_time in enumerate(times):
                    if (k_time + c - 1) // c > (q_time + c - 1) // c:
                        continue
                    distance = abs(q_time - k_time)
                    if distance <= self.dense_frames:
                        rows = (0, h)
                    else:
                        radius = self.band_rows
                        if k_frame >= self.sink_frames:
                            radius = self.band_rows * (self.dense_frames + 1) // distance
                        rows = (max(tile_start - radius, 0), min(tile_end + radius, h))
                    start, end = k_frame * ft + rows[0] * w, k_frame * ft + rows[1] * w
                    if ranges and ranges[-1][1] == start:  # adjacent: merge
                        ranges[-1] = (ranges[-1][0], end)
                    else:
                        ranges.append((start, end))
                offset = kv_len - q_len
                tiles.append(
                    ChunkKeyRanges(
                        q_frame * ft + tile_start * w - offset,
                        q_frame * ft + tile_end * w - offset,
                        tuple(ranges),
                    )
                )
        return tiles

    def density(self, q_len: int, kv_len: int) -> float:
        """Fraction of (query, key) pairs that are visible (exact): 1.0 for full, small for sparse patterns."""
        self.check_lengths(q_len, kv_len)
        if self.kind is PatternKind.FULL:
            return 1.0
        seen = sum(
            (c.query_end - c.query_start) * sum(end - start for start, end in c.key_ranges)
            for c in self.chunk_key_ranges(q_len, kv_len)
        )
        return seen / (q_len * kv_len)
