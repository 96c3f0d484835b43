"""MPEG-TS segments for live playback: the files a streaming Gradio ``gr.Video`` is fed."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from vidgen.video.atomic import make_folder
from vidgen.video.encoding import (
    DEFAULT_CRF,
    DEFAULT_PRESET,
    FrameRate,
    Upscale,
    as_fps,
    as_frames,
    as_upscale,
    check_size,
    write_clip,
)


class SegmentWriter:
    """Cuts a stream of frame chunks into MPEG-TS segment files of equal duration.

    Each segment holds ``segment_frames`` frames (default: one second's worth rounded up, e.g. 16
    at 16 fps; never less than one second). Each is encoded on its own, so it opens with an IDR
    frame, and carries the timestamps it has in the whole stream (segment ``k`` starts at
    ``k * segment_frames / fps``), so a player that plays the files one after another (Gradio's
    streaming ``gr.Video``, one path per ``yield``; an HLS playlist) sees one continuous stream.
    Frames are buffered until a segment is full; :meth:`flush` writes the last, shorter one.
    Files are named ``{prefix}_{index:05d}.ts`` and appear atomically.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        fps: FrameRate,
        *,
        segment_frames: int | None = None,
        prefix: str = "segment",
        crf: int = DEFAULT_CRF,
        preset: str = DEFAULT_PRESET,
        upscale: Upscale | int | None = None,
    ):
        self.fps = as_fps(fps)
        self.upscale = as_upscale(upscale)
        one_second = math.ceil(self.fps)
        self.segment_frames = segment_frames if segment_frames is not None else one_second
        if self.segment_frames < self.fps:
            seconds = float(self.segment_frames / self.fps)
            raise ValueError(
                f"segments must last at least 1 s: {self.segment_frames} frames at {self.fps} fps last "
                f"{seconds:.3g} s; use segment_frames >= {one_second}"
            )
        self.folder = make_folder(folder)
        self.prefix = prefix
        self._crf, self._preset = crf, preset
        self._buffer: list[np.ndarray] = []
        self._buffered = 0
        self._size: tuple[int, int] | None = None
        self.frames_written = 0
        """Frames already in segment files (buffered frames not counted)."""
        self.segments: list[Path] = []

    def write(self, frames: np.ndarray) -> list[Path]:
        """Buffers ``frames`` (T, H, W, 3) uint8 RGB; returns the segments this call completed."""
        frames = as_frames(frames)
        self._size = check_size(frames, self._size)
        self._buffer.append(frames)
        self._buffered += len(frames)
        written = []
        while self._buffered >= self.segment_frames:
            pending = np.concatenate(self._buffer)
            written.append(self._write_segment(pending[: self.segment_frames]))
            rest = pending[self.segment_frames :]
            self._buffer, self._buffered = ([rest] if len(rest) else []), len(rest)
        return written

    def flush(self) -> list[Path]:
        """Writes the buffered frames as a (shorter) segment, if there are any."""
        if not self._buffered:
            return []
        pending = np.concatenate(self._buffer)
        self._buffer, self._buffered = [], 0
        return [self._write_segment(pending)]

    def _write_segment(self, frames: np.ndarray) -> Path:
        path = self.folder / f"{self.prefix}_{len(self.segments):05d}.ts"
        write_clip(
            path,
            frames,
            self.fps,
            format="mpegts",
            first_pts=self.frames_written,
            crf=self._crf,
            preset=self._preset,
            upscale=self.upscale,
        )
        self.frames_written += len(frames)
        self.segments.append(path)
        return path

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.flush()
