"""Reading videos back: decoded frames (:func:`read_video`) and a packet-level summary
(:func:`probe_video`), both through PyAV."""

from __future__ import annotations

import io
import os
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vidgen.validation import InputError
from vidgen.video.encoding import FrameRate, plain_fps

VideoSource = str | os.PathLike | bytes | bytearray | memoryview


def _describe(source: VideoSource) -> str:
    return f"<{len(source)} bytes>" if isinstance(source, bytes | bytearray | memoryview) else str(source)


def _open(source: VideoSource) -> av.container.InputContainer:
    name = _describe(source)
    readable: io.BytesIO | str
    if isinstance(source, bytes | bytearray | memoryview):
        readable = io.BytesIO(bytes(source))
    elif not Path(source).is_file():
        raise FileNotFoundError(f"no such video file: {source}")
    else:
        readable = str(source)
    try:
        container = av.open(readable, "r")
    except av.FFmpegError as error:
        raise ValueError(f"not a video file: {name} ({error})") from error
    if not container.streams.video:
        container.close()
        raise ValueError(f"not a video file: {name} (it has no video stream)")
    return container


def _stream_fps(stream: av.video.stream.VideoStream) -> FrameRate:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    if not rate:
        raise ValueError("the video stream declares no frame rate")
    return plain_fps(Fraction(rate))


def read_video(path_or_bytes: VideoSource, *, max_frames: int | None = None) -> tuple[np.ndarray, FrameRate]:
    """Decodes a video file, or a whole file's bytes, to ``(frames (T, H, W, 3) uint8 RGB, fps)``.

    Colours are converted with the matrix the stream is tagged with (BT.601 if untagged).
    """
    name = _describe(path_or_bytes)
    with _open(path_or_bytes) as container:
        stream = container.streams.video[0]
        fps = _stream_fps(stream)
        frames: list[np.ndarray] = []
        try:
            for frame in container.decode(stream):
                if max_frames is not None and len(frames) >= max_frames:
                    break
                frames.append(frame.to_ndarray(format="rgb24"))
        except av.FFmpegError as error:
            raise ValueError(f"could not decode {name}: {error}") from error
        if not frames:
            return np.zeros((0, stream.codec_context.height, stream.codec_context.width, 3), np.uint8), fps
    return np.stack(frames), fps


def probe_video(path: VideoSource) -> dict:
    """Describes a video without decoding it: ``frames``, ``fps``, ``width``, ``height``,
    ``duration`` (seconds), ``codec`` and ``pix_fmt``.

    ``frames`` and ``duration`` are counted from the packets, so they are exact for MPEG-TS too,
    whose header stores neither.
    """
    name = _describe(path)
    with _open(path) as container:
        stream = container.streams.video[0]
        starts, ends = [], []
        try:
            for packet in container.demux(stream):
                if packet.pts is not None:
                    starts.append(packet.pts)
                    ends.append(packet.pts + (packet.duration or 0))
        except av.FFmpegError as error:
            raise ValueError(f"could not read {name}: {error}") from error
        context = stream.codec_context
        return {
            "frames": len(starts),
            "fps": _stream_fps(stream),
            "width": context.width,
            "height": context.height,
            "duration": float((max(ends) - min(starts)) * stream.time_base) if starts else 0.0,
            "codec": context.name,
            "pix_fmt": context.pix_fmt,
        }


def read_image(path: str | os.PathLike) -> np.ndarray:
    """An image file (PNG, JPEG, WebP, ...) as (H, W, 3) uint8 RGB; transparency is dropped."""
    from PIL import Image, UnidentifiedImageError

    if not Path(path).is_file():
        raise FileNotFoundError(f"no such image file: {path}")
    try:
        with Image.open(path) as image:
            return np.array(image.convert("RGB"))
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"not an image file: {path} ({error})") from None


def read_start(
    image: str | os.PathLike | None = None, video: str | os.PathLike | None = None
) -> np.ndarray | None:
    """The frames a render starts from, (T, H, W, 3) uint8: an ``image`` (image-to-video) or the
    frames of a ``video`` it continues; None without either. A file that cannot be read, or a video
    without frames, is an :class:`~vidgen.validation.InputError` naming ``--image`` / ``--continue``."""
    path = image or video
    if not path:
        return None
    flag = "--image" if image else "--continue"
    try:
        frames = read_image(path)[None] if image else read_video(path)[0]
    except (FileNotFoundError, ValueError) as err:
        raise InputError(f"{flag}: {str(err).splitlines()[0]}") from None
    if not len(frames):
        raise InputError(f"{flag}: {path} holds no frames")
    return frames
