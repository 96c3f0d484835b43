"""MP4 output: whole files, written chunk by chunk (:class:`Mp4Writer`) or at once (:func:`write_mp4`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import av
import numpy as np

from vidgen.video.atomic import check_output_path, commit, temp_sibling
from vidgen.video.encoding import (
    DEFAULT_CRF,
    DEFAULT_PRESET,
    FrameRate,
    Upscale,
    add_h264_stream,
    as_fps,
    as_frames,
    as_upscale,
    check_size,
    encode_frames,
)


class Mp4Writer:
    """Streams frames into an MP4 file (one H.264 stream) that appears under its name only on
    :meth:`close`.

    Usage::

        with Mp4Writer("out.mp4", fps=16) as writer:
            for chunk in pipeline(...):
                writer.write(chunk)  # (T, H, W, 3) uint8 RGB

    Leaving the ``with`` block through an exception discards the partial file. The ``moov`` box
    is moved to the front on close (``+faststart``) so browsers start playing before the end.
    ``upscale`` (a factor or an :class:`Upscale`) enlarges the frames in the file.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        fps: FrameRate,
        *,
        crf: int = DEFAULT_CRF,
        preset: str = DEFAULT_PRESET,
        upscale: Upscale | int | None = None,
    ):
        self.fps = as_fps(fps)
        self.upscale = as_upscale(upscale)
        self.frames_written = 0
        self._crf, self._preset = crf, preset
        self._stream: av.video.stream.VideoStream | None = None
        self._size: tuple[int, int] | None = None
        self.path = check_output_path(path)
        self._temp = temp_sibling(self.path)
        self._container: av.container.OutputContainer | None = av.open(
            str(self._temp), "w", format="mp4", options={"movflags": "+faststart"}
        )

    def write(self, frames: np.ndarray) -> None:
        """Encodes ``frames`` (T, H, W, 3) uint8 RGB; every call must keep the same H and W."""
        if self._container is None:
            raise RuntimeError("write() after close() or abort()")
        frames = as_frames(frames)
        self._size = check_size(frames, self._size)
        if self._stream is None:
            size = self.upscale.size(self._size)
            self._stream = add_h264_stream(
                self._container, self.fps, size, crf=self._crf, preset=self._preset
            )
        self._container.mux(encode_frames(self._stream, frames, self.frames_written, self.upscale))
        self.frames_written += len(frames)

    def close(self) -> Path:
        """Finishes the file and renames it into place; returns its path."""
        if self._container is None:
            return self.path
        try:
            if self._stream is None:
                raise ValueError("no frames were written, so no video was made")
            self._container.mux(self._stream.encode(None))  # drain the encoder, then the trailer
            container, self._container = self._container, None
            container.close()
            commit(self._temp, self.path)
        finally:
            self.abort()
        return self.path

    def abort(self) -> None:
        """Drops the unfinished file; nothing appears at :attr:`path`."""
        if self._container is not None:
            container, self._container = self._container, None
            with contextlib.suppress(av.FFmpegError):
                container.close()
        self._temp.unlink(missing_ok=True)

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_mp4(
    path: str | os.PathLike,
    frames: np.ndarray,
    fps: FrameRate,
    *,
    crf: int = DEFAULT_CRF,
    preset: str = DEFAULT_PRESET,
    upscale: Upscale | int | None = None,
) -> Path:
    """Writes ``frames`` (T, H, W, 3) uint8 RGB to an H.264 MP4 at ``path``, atomically
    (``upscale``: a factor, or an :class:`Upscale` with its resampling, for a bigger file)."""
    with Mp4Writer(path, fps, crf=crf, preset=preset, upscale=upscale) as writer:
        writer.write(frames)
    return writer.path
