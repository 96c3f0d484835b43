"""H.264 encoding shared by every writer: argument checks, stream settings, RGB -> yuv420p.

Colour: frames are converted with the BT.709 matrix to limited ("TV") range and the stream is
tagged so, which is what browsers assume for web video; decoders, ours included, read the tags
and convert back with the same matrix. Flat colours come back within 2 RGB levels; edges
between colours blur over about 2 pixels, because yuv420p keeps one colour sample per 2x2 pixels.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from av.video.reformatter import (
    ColorPrimaries,
    ColorRange,
    Colorspace,
    ColorTrc,
    Interpolation,
    VideoReformatter,
)

from vidgen.video.atomic import commit, temp_sibling

DEFAULT_CRF = 14
"""x264 constant rate factor. Low, because our videos are small and made of flat colours: at 14 a
64x64 clip costs a few kB per second and flat areas come back within a few RGB levels."""

DEFAULT_PRESET = "medium"
"""x264 speed/size trade-off; at 64x64 even ``medium`` encodes hundreds of frames per second."""

FrameRate = int | Fraction

_AVCOL_SPC_BT709 = 1  # FFmpeg's AVColorSpace value; PyAV's Colorspace enum uses swscale's numbering.


MAX_ENCODED_SIDE = 8192
"""Largest encoded frame side (H.264's highest level, 6.2, ends at 8192 x 4320)."""


@dataclass(frozen=True)
class Upscale:
    """Frames enlarged ``factor`` times as they are encoded: the file (or stream) is bigger, the
    frames the model makes keep their size. ``nearest`` repeats pixels (sharp squares, exact);
    ``lanczos`` interpolates (smooth edges)."""

    factor: int = 1
    resample: str = "nearest"

    def __post_init__(self) -> None:
        if isinstance(self.factor, bool) or not isinstance(self.factor, int) or not 1 <= self.factor <= 16:
            raise ValueError(f"the upscale factor must be a whole number from 1 to 16, got {self.factor!r}")
        if self.resample not in ("nearest", "lanczos"):
            raise ValueError(f"resample must be 'nearest' or 'lanczos', got {self.resample!r}")

    def size(self, size: tuple[int, int]) -> tuple[int, int]:
        """The encoded (W, H) of frames of ``size`` (W, H)."""
        return size[0] * self.factor, size[1] * self.factor

    def check(self, size: tuple[int, int]) -> None:
        """``ValueError`` when frames of ``size`` (W, H) would be encoded larger than
        :data:`MAX_ENCODED_SIDE` on a side."""
        width, height = self.size(size)
        if max(width, height) > MAX_ENCODED_SIDE:
            raise ValueError(
                f"--upscale {self.factor} makes {size[0]}x{size[1]} frames {width}x{height}, more than the "
                f"{MAX_ENCODED_SIDE} pixels a side H.264 players decode: use a factor of at most "
                f"{max(1, MAX_ENCODED_SIDE // max(size))}"
            )


def as_upscale(upscale: Upscale | int | None) -> Upscale:
    """``2`` -> ``Upscale(2)``; None -> no upscaling."""
    if upscale is None:
        return Upscale()
    return upscale if isinstance(upscale, Upscale) else Upscale(upscale)


def as_fps(fps: FrameRate | float) -> Fraction:
    rate = Fraction(fps).limit_denominator(1_000_000)
    if rate <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    return rate


def plain_fps(rate: Fraction) -> FrameRate:
    """16 rather than Fraction(16, 1); 24000/1001 stays a Fraction."""
    return int(rate) if rate.denominator == 1 else rate


def as_frames(frames: np.ndarray) -> np.ndarray:
    """Checks ``frames`` is (T, H, W, 3) uint8 with an even H and W, as H.264 in yuv420p needs."""
    array = np.asarray(frames)
    if array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(f"frames must have shape (T, H, W, 3) (RGB), got {array.shape}")
    if array.dtype != np.uint8:
        raise TypeError(
            f"frames must be uint8, got {array.dtype}; convert e.g. with (x * 255).round().astype(np.uint8)"
        )
    _, height, width, _ = array.shape
    if height % 2 or width % 2:
        even_h, even_w = height - height % 2, width - width % 2
        raise ValueError(
            f"H.264 in yuv420p needs an even width and height, got {width}x{height} (WxH): crop or pad the "
            f"frames to an even size, e.g. frames[:, :{even_h}, :{even_w}] for {even_w}x{even_h}"
        )
    return array


def check_size(frames: np.ndarray, size: tuple[int, int] | None) -> tuple[int, int]:
    """Returns (width, height) of ``frames``; every write to one stream must keep the first size."""
    found = (frames.shape[2], frames.shape[1])
    if size is not None and found != size:
        raise ValueError(
            f"frame size changed from {size[0]}x{size[1]} to {found[0]}x{found[1]} (WxH) within one video"
        )
    return found


def add_h264_stream(
    container: av.container.OutputContainer,
    fps: Fraction,
    size: tuple[int, int],
    *,
    crf: int,
    preset: str,
    keyint: int | None = None,
    bframes: bool = True,
) -> av.video.stream.VideoStream:
    """Adds a libx264 yuv420p stream of ``size`` (W, H) whose time base is 1/fps.

    ``keyint`` fixes the GOP: an IDR frame every ``keyint`` frames and none in between (no
    scene-cut keyframes). ``bframes=False`` makes dts == pts, so no muxer shifts timestamps to
    avoid a negative dts.
    """
    params = []
    if keyint is not None:
        params += [f"keyint={keyint}", f"min-keyint={keyint}", "scenecut=0"]
    if not bframes:
        params.append("bframes=0")
    options = {"crf": str(crf), "preset": preset}
    if params:
        options["x264-params"] = ":".join(params)
    stream = container.add_stream("libx264", rate=fps, options=options)
    stream.width, stream.height = size
    stream.pix_fmt = "yuv420p"
    context = stream.codec_context
    context.colorspace = _AVCOL_SPC_BT709
    context.color_primaries = ColorPrimaries.BT709
    context.color_trc = ColorTrc.BT709
    context.color_range = ColorRange.MPEG
    return stream


_reformatters = threading.local()


def reformatter() -> VideoReformatter:
    """This thread's RGB -> yuv420p converter. ``VideoFrame.reformat`` sets up a new swscale
    context for every frame (~3 ms at 64x64, over 90 % of encoding a 64x64 chunk); one kept
    converter reuses its context while the sizes and formats stay the same (~0.05 ms), with the same
    output. Not shared between threads: a swscale context is not thread-safe."""
    found = getattr(_reformatters, "converter", None)
    if found is None:
        found = _reformatters.converter = VideoReformatter()
    return found


def encode_frames(
    stream: av.video.stream.VideoStream, frames: np.ndarray, first_pts: int, upscale: Upscale | None = None
) -> list[av.Packet]:
    """Encodes RGB ``frames`` as frames ``first_pts, first_pts + 1, ...`` of ``stream`` (enlarged
    by ``upscale`` on the way: the stream's size must be the enlarged one)."""
    upscale = upscale or Upscale()
    if upscale.factor > 1 and upscale.resample == "nearest":
        frames = frames.repeat(upscale.factor, axis=1).repeat(upscale.factor, axis=2)
    # lanczos: swscale resizes while it converts to yuv420p, from the full-resolution RGB
    scale = {}
    if upscale.factor > 1 and upscale.resample == "lanczos":
        scale = {"width": stream.width, "height": stream.height, "interpolation": Interpolation.LANCZOS}
    packets = []
    convert = reformatter()
    for offset, rgb in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        frame = convert.reformat(
            frame,
            format="yuv420p",
            dst_colorspace=Colorspace.ITU709,
            dst_color_range=ColorRange.MPEG,
            **scale,
        )
        frame.pts = first_pts + offset  # the time base is 1/fps, so pts counts frames
        packets.extend(stream.encode(frame))
    return packets


def write_clip(
    path: Path,
    frames: np.ndarray,
    fps: Fraction,
    *,
    format: str,
    first_pts: int,
    crf: int,
    preset: str,
    upscale: Upscale | None = None,
) -> None:
    """Writes ``frames`` as one self-contained file, atomically.

    A fresh encoder per file, so the file opens with an IDR frame and is one closed GOP; no
    B-frames, so every timestamp is exactly the frame's own (``first_pts`` + index).
    """
    temp = temp_sibling(path)
    try:
        with av.open(str(temp), "w", format=format) as container:
            size = (upscale or Upscale()).size((frames.shape[2], frames.shape[1]))
            stream = add_h264_stream(
                container, fps, size, crf=crf, preset=preset, keyint=len(frames), bframes=False
            )
            container.mux(encode_frames(stream, frames, first_pts, upscale))
            container.mux(stream.encode(None))
        commit(temp, path)
    finally:
        temp.unlink(missing_ok=True)
