"""Reading videos back: decoded frames (:func:`read_video`) and a packet-level summary
(:func:`probe_video`), both through PyAV."""

from __future__ import annotations

import io
import os
import warnings
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


MAX_START_PIXELS = 50_000_000
"""Largest frame a start image or clip may have, in pixels (an 8K frame has 33 million): it is
resized to the video's size, so nothing larger is worth decoding. Checked from the file's header,
before anything is decoded."""


def check_frame_size(width: int, height: int, name: str) -> None:
    """``ValueError`` for a frame of more than :data:`MAX_START_PIXELS` pixels (or none)."""
    if width < 1 or height < 1:
        raise ValueError(f"{name} has frames of {width}x{height} pixels: nothing to read")
    if width * height > MAX_START_PIXELS:
        raise ValueError(
            f"{name} has frames of {width}x{height} pixels, more than the {MAX_START_PIXELS:,} a start "
            "file may have: scale it down first"
        )


def _resized(frame: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
    """``frame`` (H, W, 3) uint8 stretched to ``size`` (height, width) with Lanczos, as diffusers'
    ``VideoProcessor`` resizes a PIL frame (the same pixels); unchanged at that size already."""
    if size is None or frame.shape[:2] == tuple(size):
        return frame
    from PIL import Image

    return np.asarray(Image.fromarray(frame).resize((size[1], size[0]), resample=Image.Resampling.LANCZOS))


def read_video(
    path_or_bytes: VideoSource, *, max_frames: int | None = None, size: tuple[int, int] | None = None
) -> tuple[np.ndarray, FrameRate]:
    """Decodes a video file, or a whole file's bytes, to ``(frames (T, H, W, 3) uint8 RGB, fps)``.

    Colours are converted with the matrix the stream is tagged with (BT.601 if untagged). ``size``
    (height, width): each frame is resized to it as it is decoded (:func:`_resized`), so a long clip
    at a large size never sits in memory whole. Frames larger than :data:`MAX_START_PIXELS` are
    refused from the stream's header, before decoding.
    """
    name = _describe(path_or_bytes)
    with _open(path_or_bytes) as container:
        stream = container.streams.video[0]
        fps = _stream_fps(stream)
        check_frame_size(stream.codec_context.width, stream.codec_context.height, name)
        frames: list[np.ndarray] = []
        try:
            for frame in container.decode(stream):
                if max_frames is not None and len(frames) >= max_frames:
                    break
                frames.append(_resized(frame.to_ndarray(format="rgb24"), size))
        except av.FFmpegError as error:
            raise ValueError(f"could not decode {name}: {error}") from error
        if not frames:
            height, width = size or (stream.codec_context.height, stream.codec_context.width)
            return np.zeros((0, height, width, 3), np.uint8), fps
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


def image_size(path: str | os.PathLike) -> tuple[int, int]:
    """An image file's (width, height) from its header, checked against :data:`MAX_START_PIXELS`;
    nothing is decoded."""
    from PIL import Image, UnidentifiedImageError

    if not Path(path).is_file():
        raise FileNotFoundError(f"no such image file: {path}")
    try:
        with warnings.catch_warnings():  # the size is bounded here, below PIL's own warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as error:
        raise ValueError(f"not an image file: {path} ({error})") from None
    check_frame_size(width, height, str(path))
    return width, height


def read_image(path: str | os.PathLike, *, size: tuple[int, int] | None = None) -> np.ndarray:
    """An image file (PNG, JPEG, WebP, ...) as (H, W, 3) uint8 RGB; transparency is dropped.
    ``size`` (height, width): resized to it as :func:`read_video` resizes. An image of more than
    :data:`MAX_START_PIXELS` pixels is refused from its header, before decoding."""
    from PIL import Image, UnidentifiedImageError

    image_size(path)
    try:
        with Image.open(path) as image:
            return _resized(np.array(image.convert("RGB")), size)
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as error:
        raise ValueError(f"not an image file: {path} ({error})") from None


def probe_start(
    image: str | os.PathLike | None = None, video: str | os.PathLike | None = None
) -> tuple[int, int, int] | None:
    """What a render starting from ``image`` (image-to-video) or continuing ``video`` opens with,
    read from the file's header and packets without decoding a frame: ``(frames, height, width)``;
    None without either. A file that cannot be read, frames too large (:data:`MAX_START_PIXELS`), or
    a video without frames is an :class:`~vidgen.validation.InputError` naming ``--image`` /
    ``--continue``."""
    path = image or video
    if not path:
        return None
    flag = "--image" if image else "--continue"
    try:
        if image:
            width, height = image_size(path)
            return 1, height, width
        info = probe_video(path)
        check_frame_size(info["width"], info["height"], str(path))
    except (FileNotFoundError, ValueError) as err:
        raise InputError(f"{flag}: {str(err).splitlines()[0]}") from None
    if not info["frames"]:
        raise InputError(f"{flag}: {path} holds no frames")
    return info["frames"], info["height"], info["width"]
