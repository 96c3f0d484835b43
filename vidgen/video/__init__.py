"""Video in and out for vidgen: MP4 files, fragmented MP4, MPEG-TS segments, resumable recordings.

Frames are numpy ``uint8`` arrays ``(T, H, W, 3)`` in RGB throughout; ``fps`` is an ``int`` or a
``Fraction``. Everything written is H.264 (libx264) in yuv420p, so H and W must be even.

Which tool does what: PyAV (FFmpeg's libraries, in-process) encodes, decodes and muxes
everything. ffmpeg-python is used in one place only, :meth:`SegmentedRecording.finalize`, to run
the ffmpeg binary's concat demuxer with stream copy (the binary comes from
:func:`ffmpeg_executable`); without a binary the same join is done by remuxing with PyAV.

Every file appears under its final name only when complete (written to a hidden temporary name
in the same folder, then renamed), so a killed process never leaves a file that looks finished.

- ``export``: :func:`export_to_video` (a pipeline's output of any type to an MP4)
- ``mp4``: :func:`write_mp4`, :class:`Mp4Writer`, :class:`FragmentedMp4Writer`
- ``segments``: :class:`SegmentWriter` (MPEG-TS for live playback)
- ``recording``: :class:`SegmentedRecording` (``vidgen render --resume``)
- ``reading``: :func:`read_video`, :func:`probe_video`
"""

from vidgen.video.encoding import DEFAULT_CRF, DEFAULT_PRESET, FrameRate, Upscale
from vidgen.video.export import export_to_video
from vidgen.video.mp4 import FragmentedMp4Writer, Mp4Writer, write_mp4
from vidgen.video.reading import probe_video, read_image, read_video
from vidgen.video.recording import ConcatBackend, SegmentedRecording, ffmpeg_executable
from vidgen.video.segments import SegmentWriter

__all__ = [
    "DEFAULT_CRF",
    "DEFAULT_PRESET",
    "ConcatBackend",
    "FragmentedMp4Writer",
    "FrameRate",
    "Mp4Writer",
    "SegmentWriter",
    "SegmentedRecording",
    "Upscale",
    "export_to_video",
    "ffmpeg_executable",
    "probe_video",
    "read_image",
    "read_video",
    "write_mp4",
]
