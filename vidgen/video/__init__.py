"""Video in and out for vidgen: MP4 files, MPEG-TS segments, resumable recordings.

Frames are numpy ``uint8`` arrays ``(T, H, W, 3)`` in RGB throughout; ``fps`` is an ``int`` or a
``Fraction``. Everything written is H.264 (libx264) in yuv420p, so H and W must be even.

PyAV (FFmpeg's libraries, in-process) encodes, decodes and muxes everything, including the
lossless join of a recording's segments; no ffmpeg binary is needed.

Every file appears under its final name only when complete (written to a hidden temporary name
in the same folder, then renamed), so a killed process never leaves a file that looks finished.

- ``export``: :func:`export_to_video` (a pipeline's output of any type to an MP4)
- ``mp4``: :func:`write_mp4`, :class:`Mp4Writer`
- ``segments``: :class:`SegmentWriter` (MPEG-TS for live playback)
- ``recording``: :class:`SegmentedRecording` (``vidgen render --resume``)
- ``reading``: :func:`read_video`, :func:`probe_video`
"""

from vidgen.video.encoding import DEFAULT_CRF, DEFAULT_PRESET, FrameRate, Upscale
from vidgen.video.export import export_to_video
from vidgen.video.mp4 import Mp4Writer, write_mp4
from vidgen.video.reading import probe_video, read_image, read_video
from vidgen.video.recording import SegmentedRecording
from vidgen.video.segments import SegmentWriter

__all__ = [
    "DEFAULT_CRF",
    "DEFAULT_PRESET",
    "FrameRate",
    "Mp4Writer",
    "SegmentWriter",
    "SegmentedRecording",
    "Upscale",
    "export_to_video",
    "probe_video",
    "read_image",
    "read_video",
    "write_mp4",
]
