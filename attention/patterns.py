"""Attention patterns: which keys each query may see, as data that every backend compiles.

A pattern is a frozen, hashable description (kind, chunk size, window, sinks, tiles). It does
not run attention; it answers "may query ``q`` see key ``k``?" in three forms that backends
turn into their own kernels:

* :meth:`AttentionPattern.visible` / :meth:`AttentionPattern.mask_mod`: a vectorised
  predicate built from torch ops (FlexAttention's ``mask_mod`` signature);
* :meth:`AttentionPattern.dense_mask`: a boolean ``(q_len, kv_len)`` matrix for SDPA and
  attention biases;
* :meth:`AttentionPattern.chunk_key_ranges`: for the block-structured kinds
  (``block_causal``, ``sliding_window``), the contiguous key ranges each query chunk sees, so
  that a backend can run attention chunk by chunk at a cost linear in the sequence length.

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

from collections.abc import Callable
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
    TILE = "tile"
    """Bidirectional sliding-tile attention over the (t, y, x) token grid."""


BLOCK_STRUCTURED = frozenset({PatternKind.BLOCK_CAUSAL, PatternKind.SLIDING_WINDOW})
"""Kinds whose visibility depends only on the query's chunk: every query of a chunk sees the
same keys, so attention can be run chunk by chunk without a mask."""


class ChunkKeyRanges(NamedTuple):
    """The keys one query chunk sees.

    ``query_start``/``query_end`` index the query tensor (``0 <= start < end <= q_len``);
    ``key_ranges`` are sorted, disjoint, non-adjacent half-open ``(start, end)`` ranges of key
    indices, every key of which is visible to every query of the chunk.
    """

    query_start: int
    query_end: int
    key_ranges: tuple[tuple[int, int], ...]


def _as_triple(value: int | tuple[int, ...], name: str) -> tuple[int, int, int]:
    if isinstance(value, int):
        return (value, value, value)
    triple = tuple(int(v) for v in value)
    if len(triple) != 3:
        raise ValueError(f"{name} must be an int or a (t, h, w) triple, got {value!r}")
    return triple  # type: ignore[return-value]


@dataclass(frozen=True)
class AttentionPattern:
    """Which keys each query sees. Build one with the classmethods, e.g.
    ``AttentionPattern.sliding_window(frame_tokens=1560, chunk_frames=3, window_frames=9)``.
    """

    kind: PatternKind = PatternKind.FULL
    """The pattern family."""
    frame_tokens: int = 1
    """Tokens per latent frame (``h * w`` after patchifying). Set from ``frame_size`` for ``tile``."""
    chunk_frames: int = 1
    """Latent frames per causal chunk (block_causal, sliding_window)."""
    window_frames: int = 0
    """sliding_window: frames of history visible before the query's chunk; a multiple of chunk_frames."""
    sink_frames: int = 0
    """sliding_window: the first frames of the video, always visible; a multiple of chunk_frames."""
    frame_size: tuple[int, int] | None = None
    """tile: the (h, w) of one frame, in tokens. Tokens are laid out frame-major, (t, y, x)."""
    tile_size: tuple[int, int, int] | None = None
    """tile: the (t, h, w) extent of one tile, in frames and tokens."""
    tile_window: tuple[int, int, int] | None = None
    """tile: neighbourhood radius in tiles along (t, h, w); 0 means the query's own tile only."""

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
    def tiles(
        cls,
        frame_size: tuple[int, int],
        tile_size: tuple[int, int, int],
        tile_window: int | tuple[int, int, int] = 1,
    ) -> AttentionPattern:
        """Sliding-tile attention: a query sees the keys whose tile is within ``tile_window``
        tiles of its own along every axis."""
        h, w = (int(v) for v in frame_size)
        return cls(
            PatternKind.TILE,
            frame_tokens=h * w,
            frame_size=(h, w),
            tile_size=_as_triple(tile_size, "tile_size"),
            tile_window=_as_triple(tile_window, "tile_window"),
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
        self._check_tiles(kind)

    def _check_window(self, kind: PatternKind) -> None:
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

    def _check_tiles(self, kind: PatternKind) -> None:
        """Validate the tile fields and normalise them to tuples (``tile_window`` may be an int)."""
        fields = (self.frame_size, self.tile_size, self.tile_window)
        if kind is not PatternKind.TILE:
            if any(f is not None for f in fields):
                raise ValueError(
                    f"frame_size, tile_size and tile_window apply only to tile patterns, not {kind.value}"
                )
            return
        if any(f is None for f in fields):
            raise ValueError(
                "a tile pattern needs frame_size, tile_size and tile_window; use AttentionPattern.tiles(...)"
            )
        object.__setattr__(self, "frame_size", tuple(int(v) for v in self.frame_size))
        object.__setattr__(self, "tile_size", _as_triple(self.tile_size, "tile_size"))
        object.__setattr__(self, "tile_window", _as_triple(self.tile_window, "tile_window"))
        if len(self.frame_size) != 2 or min(self.frame_size) < 1:
            raise ValueError(f"frame_size must be a positive (h, w) in tokens, got {self.frame_size}")
        if min(self.tile_size) < 1:
            raise ValueError(f"tile_size must be a positive (t, h, w), got {self.tile_size}")
        if min(self.tile_window) < 0:
            raise ValueError(f"tile_window must be >= 0 on every axis, got {self.tile_window}")
        h, w = self.frame_size
        if self.frame_tokens == 1:  # the field's default: derive it from the frame size
            object.__setattr__(self, "frame_tokens", h * w)
        if self.frame_tokens != h * w:
            raise ValueError(
                f"frame_tokens={self.frame_tokens} disagrees with frame_size={self.frame_size} "
                f"(h * w = {h * w}); leave frame_tokens unset for tile patterns"
            )
        if self.chunk_frames != 1:
            raise ValueError("chunk_frames does not apply to tile patterns; leave it at 1")

    # ----------------------------------------------------------------- properties
    @property
    def chunk_tokens(self) -> int:
        """Tokens per causal chunk (``frame_tokens * chunk_frames``)."""
        return self.frame_tokens * self.chunk_frames

    @property
    def is_block_structured(self) -> bool:
        """True when every query of a chunk sees the same keys (see :data:`BLOCK_STRUCTURED`)."""
        return self.kind in BLOCK_STRUCTURED

    def check_lengths(self, q_len: int, kv_len: int) -> None:
        """Raise ``ValueError`` if this pattern cannot place ``q_len`` queries over ``kv_len`` keys."""
        if q_len < 1 or kv_len < 1:
            raise ValueError(
                f"attention needs at least one query and one key, got q_len={q_len}, kv_len={kv_len}"
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
        if self.kind is PatternKind.TILE:
            return self._tile_visible(q_pos, k_pos)
        q_chunk = q_pos // self.chunk_tokens
        causal = k_pos // self.chunk_tokens <= q_chunk
        if self.kind is PatternKind.BLOCK_CAUSAL:
            return causal
        k_frame = k_pos // self.frame_tokens
        in_window = k_frame >= q_chunk * self.chunk_frames - self.window_frames
        is_sink = k_frame < self.sink_frames
        return causal & (in_window | is_sink)

    def _tile_visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        h, w = self.frame_size
        tt, th, tw = self.tile_size
        rt, rh, rw = self.tile_window

        def tile_coords(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            in_frame = pos % (h * w)
            return pos // (h * w) // tt, in_frame // w // th, in_frame % w // tw

        qt, qy, qx = tile_coords(q_pos)
        kt, ky, kx = tile_coords(k_pos)
        return ((qt - kt).abs() <= rt) & ((qy - ky).abs() <= rh) & ((qx - kx).abs() <= rw)

    @property
    def mask_mod(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` for ``q_len == kv_len`` (index = position).

        A plain function rather than a bound method, because FlexAttention tells mask and
        score functions apart by counting their positional arguments.
        """
        return self._shifted_mask_mod(0)

    def mask_mod_for(
        self, q_len: int, kv_len: int
    ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """A FlexAttention ``mask_mod`` with the suffix alignment for ``q_len`` queries over ``kv_len`` keys."""
        self.check_lengths(q_len, kv_len)
        return self._shifted_mask_mod(max(kv_len - q_len, 0))

    def _shifted_mask_mod(self, offset: int):
        visible = self.visible

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
        """For each query chunk, the key ranges it sees (block_causal and sliding_window only).

        The first and last query chunks may be partial (suffix alignment, odd lengths). The
        number of visible keys per chunk is bounded by window + sinks + one chunk, which is what
        makes chunk-by-chunk attention linear in the sequence length.
        """
        if not self.is_block_structured:
            raise ValueError(
                f"chunk_key_ranges needs a block_causal or sliding_window pattern, not {self.kind.value}"
            )
        self.check_lengths(q_len, kv_len)
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

    def density(self, q_len: int, kv_len: int) -> float:
        """Fraction of (query, key) pairs that are visible: 1.0 for full, small for sparse patterns.

        Exact for the block-structured kinds; for ``tile`` it is the product of per-axis
        fractions for the whole-frame part of the sequence (an estimate for odd lengths).
        """
        self.check_lengths(q_len, kv_len)
        if self.kind is PatternKind.FULL:
            return 1.0
        if self.is_block_structured:
            seen = sum(
                (c.query_end - c.query_start) * sum(end - start for start, end in c.key_ranges)
                for c in self.chunk_key_ranges(q_len, kv_len)
            )
            return seen / (q_len * kv_len)
        frames = max(kv_len // self.frame_tokens, 1)
        fraction = 1.0
        for extent, tile, radius in zip(
            (frames, *self.frame_size), self.tile_size, self.tile_window, strict=True
        ):
            tile_of = torch.arange(extent) // tile
            fraction *= ((tile_of[:, None] - tile_of[None, :]).abs() <= radius).float().mean().item()
        return fraction
