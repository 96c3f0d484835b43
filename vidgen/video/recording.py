"""A recording that survives being killed, for ``vidgen render --resume``: one MP4 segment per
generated chunk, a manifest of the finished ones, and a lossless join at the end."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import av
import numpy as np

from vidgen.video.atomic import (
    check_output_path,
    commit,
    file_digest,
    is_temp_file,
    make_folder,
    temp_sibling,
)
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
from vidgen.video.reading import probe_video


class SegmentedRecording:
    """Chunks recorded as separate MP4 segments in ``folder``, listed in ``manifest.json``.

    :meth:`append` writes the chunk's segment (temp + rename), then rewrites the manifest (temp +
    rename): the manifest alone says what is complete. Opening the folder removes chunk files the
    manifest does not list and leftover temp files, since a crash may have cut them short.
    :meth:`finalize` joins the segments into one MP4 without re-encoding.

    Why MP4 segments and not MPEG-TS: a stream-copy join must place every frame exactly. Each MP4
    segment starts at 0 and stores every frame's duration, in a timescale that represents ``fps``
    exactly, and its total duration, so the concat demuxer (and the PyAV fallback) shifts segment
    ``k`` by exactly the frames before it. MPEG-TS has a fixed 90 kHz clock (a frame at 24000/1001
    fps is not a whole number of ticks) and stores no duration, which the demuxer must guess.
    Segments have no B-frames (dts == pts, no edit lists), and all are made with the same encoder
    settings (checked on resume) so they share one SPS/PPS, which the joined file stores once.
    """

    MANIFEST = "manifest.json"
    VERSION = 1

    def __init__(
        self,
        folder: str | os.PathLike,
        fps: FrameRate,
        *,
        crf: int = DEFAULT_CRF,
        preset: str = DEFAULT_PRESET,
        upscale: Upscale | int | None = None,
    ):
        self.folder = make_folder(folder)
        self.fps = as_fps(fps)
        self._crf, self._preset = crf, preset
        self.upscale = as_upscale(upscale)
        self.dropped: tuple[int, str] | None = None
        """(first chunk, why) when opening found a segment damaged or missing: it and every later
        chunk left the manifest, to be recorded again."""
        self._manifest = self._load_manifest()
        self._remove_unlisted()

    # -- the manifest

    def _load_manifest(self) -> dict:
        path = self.folder / self.MANIFEST
        if not path.exists():
            settings = {
                "fps": str(self.fps),
                "width": None,
                "height": None,
                "crf": self._crf,
                "preset": self._preset,
                "upscale": self._upscale_setting(),
            }
            return {"version": self.VERSION, **settings, "chunks": []}
        try:
            manifest = json.loads(path.read_text())
        except (
            json.JSONDecodeError,
            UnicodeDecodeError,
        ) as error:  # written atomically: only if edited by hand
            raise ValueError(
                f"{path} is not valid JSON ({error}); delete the folder to start over"
            ) from error
        manifest.setdefault("upscale", "1:nearest")  # recorded before upscaling existed
        expected = (
            ("fps", str(self.fps)),
            ("crf", self._crf),
            ("preset", self._preset),
            ("upscale", self._upscale_setting()),
        )
        for key, ours in expected:
            if manifest.get(key) != ours:
                raise ValueError(
                    f"{self.folder} was recorded with {key}={manifest.get(key)!r} but this run uses {ours!r}: resume "
                    f"with the same {key} (segments must match to be joined without re-encoding)"
                )
        kept = []
        for chunk in manifest["chunks"]:
            problem = self._segment_problem(chunk)
            if problem is not None:  # this chunk and every later one are made again
                self.dropped = (chunk["chunk_index"], problem)
                break
            kept.append(chunk)
        if len(kept) < len(manifest["chunks"]):
            manifest = {**manifest, "chunks": kept}
            self._write_manifest(manifest)
        return manifest

    def _segment_problem(self, chunk: dict) -> str | None:
        """Why a listed segment cannot be joined (missing, or not the bytes recorded: a torn write,
        a flipped bit, a file swapped in from another render), or None."""
        path = self.folder / chunk["file"]
        if not path.is_file():
            return f"{chunk['file']} is missing"
        if "sha256" in chunk and file_digest(path) != chunk["sha256"]:
            return f"{chunk['file']} is not the file recorded (its checksum differs)"
        return None

    def _upscale_setting(self) -> str:
        return f"{self.upscale.factor}:{self.upscale.resample}"

    def _remove_unlisted(self) -> None:
        listed = {chunk["file"] for chunk in self._manifest["chunks"]}
        for path in self.folder.iterdir():
            stray_chunk = path.name.startswith("chunk_") and path.suffix == ".mp4" and path.name not in listed
            if stray_chunk or is_temp_file(path):
                path.unlink()

    def _write_manifest(self, manifest: dict) -> None:
        path = self.folder / self.MANIFEST
        temp = temp_sibling(path)
        try:
            temp.write_text(json.dumps(manifest, indent=1))
            commit(temp, path)
        finally:
            temp.unlink(missing_ok=True)

    # -- state

    def completed_chunks(self) -> list[int]:
        """Indices of the chunks safely recorded, in order (a resumed render starts after the last)."""
        return [chunk["chunk_index"] for chunk in self._manifest["chunks"]]

    def num_frames(self) -> int:
        """Number of frames safely recorded."""
        return sum(chunk["num_frames"] for chunk in self._manifest["chunks"])

    def segment_paths(self) -> list[Path]:
        """The recorded segment files, in order."""
        return [self.folder / chunk["file"] for chunk in self._manifest["chunks"]]

    # -- writing

    def append(self, chunk_index: int, frames: np.ndarray) -> Path:
        """Records ``frames`` (T, H, W, 3) uint8 RGB as chunk ``chunk_index``, which must be the next."""
        frames = as_frames(frames)
        expected = len(self._manifest["chunks"])
        if chunk_index != expected:
            raise ValueError(f"chunks are recorded in order: the next one is {expected}, got {chunk_index}")
        if len(frames) == 0:
            raise ValueError(f"chunk {chunk_index} has no frames")
        recorded = (
            None if self._manifest["width"] is None else (self._manifest["width"], self._manifest["height"])
        )
        width, height = check_size(frames, recorded)
        name = f"chunk_{chunk_index:05d}.mp4"
        write_clip(
            self.folder / name,
            frames,
            self.fps,
            format="mp4",
            first_pts=0,
            crf=self._crf,
            preset=self._preset,
            upscale=self.upscale,
        )
        chunk = {
            "chunk_index": chunk_index,
            "file": name,
            "num_frames": len(frames),
            "first_frame": self.num_frames(),
            "sha256": file_digest(self.folder / name),
        }
        manifest = {
            **self._manifest,
            "width": width,
            "height": height,
            "chunks": [*self._manifest["chunks"], chunk],
        }
        self._write_manifest(manifest)
        self._manifest = manifest
        return self.folder / name

    def finalize(
        self,
        out_path: str | os.PathLike,
        *,
        delete_folder: bool = False,
    ) -> Path:
        """Joins all segments into one MP4 at ``out_path`` without re-encoding, atomically.

        The result is checked to hold exactly :meth:`num_frames` frames. ``delete_folder`` removes
        the recording afterwards.
        """
        out_path = check_output_path(out_path)
        segments = self.segment_paths()
        if not segments:
            raise ValueError(f"{self.folder}: no chunks are recorded, there is nothing to finalize")
        _check_same_parameter_sets(segments)
        temp = temp_sibling(out_path)
        try:
            self._concat(segments, temp)
            joined = probe_video(temp)["frames"]
            if joined != self.num_frames():
                raise RuntimeError(
                    f"joining {self.folder} gave {joined} frames instead of {self.num_frames()}"
                )
            commit(temp, out_path)
        finally:
            temp.unlink(missing_ok=True)
        if delete_folder:
            shutil.rmtree(self.folder)
        return out_path

    def _concat(self, segments: list[Path], temp: Path) -> None:
        """Remux the segments' packets in-process with PyAV, each shifted by the frames before it."""
        with av.open(str(temp), "w", format="mp4", options={"movflags": "+faststart"}) as output:
            out_stream = None
            for path, chunk in zip(segments, self._manifest["chunks"], strict=True):
                with av.open(str(path)) as source:
                    stream = source.streams.video[0]
                    if out_stream is None:
                        out_stream = output.add_stream_from_template(stream)
                    shift = chunk["first_frame"] / self.fps / stream.time_base  # in ticks of the segment
                    if shift.denominator != 1:
                        raise RuntimeError(
                            f"{path.name}: frame times are not whole ticks of {stream.time_base}"
                        )
                    for packet in source.demux(stream):
                        if packet.dts is None or packet.pts is None:  # the demuxer's end-of-stream marker
                            continue
                        packet.pts += int(shift)
                        packet.dts += int(shift)
                        packet.stream = out_stream
                        output.mux(packet)


def _check_same_parameter_sets(segments: list[Path]) -> None:
    """The joined file keeps the first segment's SPS/PPS; a segment with others would decode wrong."""
    first = None
    for path in segments:
        with av.open(str(path)) as container:
            extradata = container.streams.video[0].codec_context.extradata
        if first is None:
            first = extradata
        elif extradata != first:
            raise RuntimeError(
                f"{path.name} was encoded with other H.264 parameters than {segments[0].name}; "
                "the segments cannot be joined without re-encoding"
            )
