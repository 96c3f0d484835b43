"""MP4 output: whole files (:class:`Mp4Writer`, :func:`write_mp4`) and fragmented MP4 for
streaming consumers (:class:`FragmentedMp4Writer`)."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

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

FRAGMENTED_MOVFLAGS = "frag_keyframe+empty_moov+default_base_moof"


class _H264Writer:
    """What the MP4 writers share: one H.264 stream in an open container, fed chunk by chunk."""

    def __init__(
        self, fps: FrameRate, crf: int, preset: str, upscale: Upscale | int | None = None, **stream_options
    ):
        self.fps = as_fps(fps)
        self.upscale = as_upscale(upscale)
        self.frames_written = 0
        self._stream_settings = {"crf": crf, "preset": preset, **stream_options}
        self._container: av.container.OutputContainer | None = None
        self._stream: av.video.stream.VideoStream | None = None
        self._size: tuple[int, int] | None = None

    def _write(self, frames: np.ndarray) -> None:
        if self._container is None:
            raise RuntimeError("write() after close() or abort()")
        frames = as_frames(frames)
        self._size = check_size(frames, self._size)
        if self._stream is None:
            size = self.upscale.size(self._size)
            self._stream = add_h264_stream(self._container, self.fps, size, **self._stream_settings)
        self._container.mux(encode_frames(self._stream, frames, self.frames_written, self.upscale))
        self.frames_written += len(frames)

    def _finish(self) -> None:
        """Drains the encoder and writes the trailer."""
        if self._stream is None:
            raise ValueError("no frames were written, so no video was made")
        self._container.mux(self._stream.encode(None))
        container, self._container = self._container, None
        container.close()

    def _drop_container(self) -> None:
        if self._container is not None:
            container, self._container = self._container, None
            with contextlib.suppress(av.FFmpegError):
                container.close()

    def close(self):
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class Mp4Writer(_H264Writer):
    """Streams frames into an MP4 file that appears under its name only on :meth:`close`.

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
        super().__init__(fps, crf, preset, upscale)
        self.path = check_output_path(path)
        self._temp = temp_sibling(self.path)
        self._container = av.open(str(self._temp), "w", format="mp4", options={"movflags": "+faststart"})

    def write(self, frames: np.ndarray) -> None:
        """Encodes ``frames`` (T, H, W, 3) uint8 RGB; every call must keep the same H and W."""
        self._write(frames)

    def close(self) -> Path:
        """Finishes the file and renames it into place; returns its path."""
        if self._container is None:
            return self.path
        try:
            self._finish()
            commit(self._temp, self.path)
        finally:
            self.abort()
        return self.path

    def abort(self) -> None:
        """Drops the unfinished file; nothing appears at :attr:`path`."""
        self._drop_container()
        self._temp.unlink(missing_ok=True)


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


class _BoxSplitter(io.RawIOBase):
    """Receives the muxer's bytes, passes them on to ``sink`` and cuts them into whole pieces:
    the init segment (``ftyp`` + ``moov``), then one ``moof`` + ``mdat`` piece per fragment."""

    def __init__(self, sink: BinaryIO):
        super().__init__()
        self._sink = sink
        self._pending = bytearray()  # bytes not yet part of a whole top-level box
        self._piece = bytearray()  # whole boxes of the piece being assembled
        self._ready: list[bytes] = []

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False  # keeps the muxer from seeking back: what it wrote is final

    def write(self, data) -> int:
        self._sink.write(data)
        self._pending += data
        for box_type, box in self._whole_boxes():
            if box_type == b"moof" and self._piece:
                self._ready.append(bytes(self._piece))
                self._piece.clear()
            self._piece += box
            if box_type == b"mdat":
                self._ready.append(bytes(self._piece))
                self._piece.clear()
        return len(data)

    def _whole_boxes(self) -> Iterator[tuple[bytes, bytes]]:
        while len(self._pending) >= 8:
            size = int.from_bytes(self._pending[:4], "big")
            if size == 1:  # a 64-bit size follows the type
                if len(self._pending) < 16:
                    return
                size = int.from_bytes(self._pending[8:16], "big")
            if size < 8 or len(self._pending) < size:
                return
            box = bytes(self._pending[:size])
            del self._pending[:size]
            yield box[4:8], box

    def take(self, final: bool = False) -> list[bytes]:
        """The pieces finished since the last call; ``final`` adds whatever is left (the ``mfra``)."""
        if final and (self._piece or self._pending):
            self._ready.append(bytes(self._piece + self._pending))
            self._piece.clear()
            self._pending.clear()
        pieces, self._ready = self._ready, []
        return pieces


class FragmentedMp4Writer(_H264Writer):
    """Fragmented MP4 (``movflags=frag_keyframe+empty_moov+default_base_moof``) for streaming.

    ``target`` is a file path (written atomically, like :class:`Mp4Writer`), a writable binary
    file object (written through and left open), or ``None`` (kept in memory: :meth:`getvalue`).

    Every ``fragment_frames`` frames (default: about one second) an IDR frame starts a new
    fragment. :meth:`write` and :meth:`close` return the pieces finished so far: the init segment
    (``ftyp`` + ``moov``) first, then one ``moof`` + ``mdat`` piece per fragment, and from
    ``close`` the trailing ``mfra`` index; joined, they are the whole file. The encoder runs with
    zero latency, but the muxer closes a fragment only when the next one begins, so a fragment is
    handed out by the ``write`` that starts the next fragment, or by ``close`` (the init segment
    comes out together with the first fragment).
    """

    def __init__(
        self,
        target: str | os.PathLike | BinaryIO | None,
        fps: FrameRate,
        *,
        fragment_frames: int | None = None,
        crf: int = DEFAULT_CRF,
        preset: str = DEFAULT_PRESET,
    ):
        rate = as_fps(fps)
        self.fragment_frames = fragment_frames if fragment_frames is not None else max(1, round(rate))
        if self.fragment_frames < 1:
            raise ValueError(f"fragment_frames must be >= 1, got {fragment_frames}")
        super().__init__(rate, crf, preset, keyint=self.fragment_frames, bframes=False, zero_latency=True)
        self.path: Path | None = None
        self._temp: Path | None = None
        self._file: BinaryIO | None = None
        self._memory: io.BytesIO | None = None
        if target is None:
            self._memory = sink = io.BytesIO()
        elif isinstance(target, str | os.PathLike):
            self.path = check_output_path(target)
            self._temp = temp_sibling(self.path)
            self._file = sink = open(self._temp, "wb")  # noqa: SIM115 - closed by close() / abort()
        else:
            sink = target
        self._splitter = _BoxSplitter(sink)
        options = {"movflags": FRAGMENTED_MOVFLAGS, "flush_packets": "1"}
        self._container = av.open(self._splitter, "w", format="mp4", options=options)

    def write(self, frames: np.ndarray) -> list[bytes]:
        """Encodes ``frames``; returns the pieces (init segment, fragments) this call finished."""
        self._write(frames)
        return self._splitter.take()

    def close(self) -> list[bytes]:
        """Finishes the stream and returns the remaining pieces; a file target is renamed into place."""
        if self._container is None:
            return []
        try:
            self._finish()
            if self._file is not None:
                self._file.close()
                commit(self._temp, self.path)
        finally:
            self.abort()
        return self._splitter.take(final=True)

    def abort(self) -> None:
        """Stops without finishing: a path target is removed, a file object is left as it is."""
        self._drop_container()
        if self._file is not None:
            self._file.close()
            self._temp.unlink(missing_ok=True)

    def getvalue(self) -> bytes:
        """All bytes so far, for an in-memory writer (``target=None``)."""
        if self._memory is None:
            raise RuntimeError("getvalue() needs a writer made with target=None")
        return self._memory.getvalue()
