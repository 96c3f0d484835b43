"""Resumable recordings: atomic chunks, a manifest that alone decides, and an exact lossless join."""

import json
import os
from fractions import Fraction

import numpy as np
import pytest

from tests.video.conftest import FPS, moving_shapes
from vidgen.video import SegmentedRecording, probe_video, read_video

CHUNK_FRAMES = (16, 16, 9)


def record(folder, chunks=CHUNK_FRAMES, fps=FPS) -> SegmentedRecording:
    recording = SegmentedRecording(folder, fps)
    for index, num_frames in enumerate(chunks):
        recording.append(index, moving_shapes(num_frames, seed=index))
    return recording


def decode_segments(recording: SegmentedRecording) -> np.ndarray:
    return np.concatenate([read_video(path)[0] for path in recording.segment_paths()])


def test_append_records_chunks_and_manifest(tmp_path):
    recording = record(tmp_path / "rec")
    assert recording.completed_chunks() == [0, 1, 2]
    assert recording.num_frames() == 41
    manifest = json.loads((tmp_path / "rec" / "manifest.json").read_text())
    assert (manifest["fps"], manifest["width"], manifest["height"]) == ("16", 64, 64)
    assert [(c["chunk_index"], c["file"], c["num_frames"], c["first_frame"]) for c in manifest["chunks"]] == [
        (0, "chunk_00000.mp4", 16, 0),
        (1, "chunk_00001.mp4", 16, 16),
        (2, "chunk_00002.mp4", 9, 32),
    ]
    assert sorted(os.listdir(tmp_path / "rec")) == [*(c["file"] for c in manifest["chunks"]), "manifest.json"]


def test_finalize_joins_segments_exactly(tmp_path):
    recording = record(tmp_path / "rec")
    out = recording.finalize(tmp_path / "final.mp4")
    frames, fps = read_video(out)
    np.testing.assert_array_equal(frames, decode_segments(recording))
    info = probe_video(out)
    assert (info["frames"], info["fps"], info["duration"]) == (41, 16, 41 / 16)
    assert (info["codec"], info["pix_fmt"], info["width"], info["height"]) == ("h264", "yuv420p", 64, 64)


def test_finalize_is_exact_at_a_fractional_frame_rate(tmp_path):
    fps = Fraction(24000, 1001)
    recording = record(tmp_path / "rec", chunks=(5, 7), fps=fps)
    out = recording.finalize(tmp_path / "final.mp4")
    np.testing.assert_array_equal(read_video(out)[0], decode_segments(recording))
    info = probe_video(out)
    assert info["fps"] == fps and info["duration"] == pytest.approx(12 / fps, abs=1e-6)


def test_resuming_sees_what_was_recorded(tmp_path):
    record(tmp_path / "rec", chunks=(16, 16))
    resumed = SegmentedRecording(tmp_path / "rec", FPS)
    assert resumed.completed_chunks() == [0, 1] and resumed.num_frames() == 32
    resumed.append(2, moving_shapes(4, seed=2))
    assert probe_video(resumed.finalize(tmp_path / "out.mp4"))["frames"] == 36


def test_stray_half_written_segment_is_ignored_and_removed(tmp_path):
    folder = tmp_path / "rec"
    record(folder, chunks=(16, 16))
    (folder / "chunk_00002.mp4").write_bytes(b"\x00\x00\x00\x18ftypisom" + b"\x00" * 40)  # cut short
    (folder / ".chunk_00002.mp4.0123abcd.partial").write_bytes(b"\x00" * 10)
    (folder / "notes.txt").write_text("not ours: left alone")

    recording = SegmentedRecording(folder, FPS)
    assert recording.completed_chunks() == [0, 1] and recording.num_frames() == 32
    assert sorted(os.listdir(folder)) == ["chunk_00000.mp4", "chunk_00001.mp4", "manifest.json", "notes.txt"]
    recording.append(2, moving_shapes(8, seed=2))
    frames, _ = read_video(recording.finalize(tmp_path / "out.mp4"))
    assert frames.shape[0] == 40
    np.testing.assert_array_equal(frames, decode_segments(recording))


def test_crash_between_segment_and_manifest_update(tmp_path):
    folder = tmp_path / "rec"
    recording = record(folder, chunks=(16, 16))
    manifest_before_crash = (folder / "manifest.json").read_bytes()
    recording.append(2, moving_shapes(16, seed=7))
    # The crash: chunk 2's segment was renamed into place, its manifest update only half written.
    (folder / "manifest.json").write_bytes(manifest_before_crash)
    (folder / ".manifest.json.feedbeef0000.partial").write_bytes(manifest_before_crash[:20])

    resumed = SegmentedRecording(folder, FPS)
    assert resumed.completed_chunks() == [0, 1]
    assert sorted(os.listdir(folder)) == ["chunk_00000.mp4", "chunk_00001.mp4", "manifest.json"]
    redone = moving_shapes(12, seed=2)  # the re-generated chunk need not match the lost one
    resumed.append(2, redone)
    frames, _ = read_video(resumed.finalize(tmp_path / "out.mp4"))
    assert frames.shape[0] == 44
    np.testing.assert_array_equal(frames[32:], read_video(folder / "chunk_00002.mp4")[0])


def test_finalize_can_delete_the_folder_and_is_atomic(tmp_path):
    recording = record(tmp_path / "rec", chunks=(16,))
    out = recording.finalize(tmp_path / "out.mp4", delete_folder=True)
    assert sorted(os.listdir(tmp_path)) == ["out.mp4"] and out.exists()


def test_chunks_must_come_in_order(tmp_path):
    recording = record(tmp_path / "rec", chunks=(16,))
    with pytest.raises(ValueError, match="next one is 1, got 0"):
        recording.append(0, moving_shapes(4))
    with pytest.raises(ValueError, match="next one is 1, got 2"):
        recording.append(2, moving_shapes(4))
    with pytest.raises(ValueError, match="frame size changed"):
        recording.append(1, moving_shapes(4, height=32))


def test_resuming_with_other_settings_is_refused(tmp_path):
    record(tmp_path / "rec", chunks=(16,))
    with pytest.raises(ValueError, match="fps='16'.*same fps"):
        SegmentedRecording(tmp_path / "rec", 24)
    with pytest.raises(ValueError, match="preset='medium'.*same preset"):
        SegmentedRecording(tmp_path / "rec", FPS, preset="fast")


def _flip_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x20
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda p: os.remove(p), "chunk_00001.mp4 is missing"),
        (lambda p: _flip_byte(p, len(p.read_bytes()) // 2), "not the file recorded"),
        (lambda p: p.write_bytes(p.read_bytes()[:-100]), "not the file recorded"),  # a torn write
        (lambda p: p.write_bytes((p.parent / "chunk_00000.mp4").read_bytes()), "not the file recorded"),
    ],
    ids=["deleted", "flipped", "truncated", "swapped"],
)
def test_a_damaged_segment_and_the_later_ones_leave_the_recording(tmp_path, damage, why):
    """A segment that is not what was recorded (each case would join into a wrong or undecodable
    MP4) is found by its checksum when the folder is opened: it and every later chunk leave the
    manifest, their files are removed, and recording goes on from there."""
    record(tmp_path / "rec", chunks=(16, 16, 16))
    damage(tmp_path / "rec" / "chunk_00001.mp4")
    recording = SegmentedRecording(tmp_path / "rec", FPS)
    assert recording.dropped is not None and recording.dropped[0] == 1 and why in recording.dropped[1]
    assert recording.completed_chunks() == [0]
    assert sorted(os.listdir(tmp_path / "rec")) == ["chunk_00000.mp4", "manifest.json"]
    assert SegmentedRecording(tmp_path / "rec", FPS).dropped is None  # the manifest was rewritten
    for index in (1, 2):
        recording.append(index, moving_shapes(16, seed=index))
    recording.finalize(tmp_path / "out.mp4")
    expected = decode_segments(record(tmp_path / "whole", chunks=(16, 16, 16)))
    assert np.array_equal(read_video(tmp_path / "out.mp4")[0], expected)


def test_empty_recording_cannot_be_finalized(tmp_path):
    with pytest.raises(ValueError, match="nothing to finalize"):
        SegmentedRecording(tmp_path / "rec", FPS).finalize(tmp_path / "out.mp4")
    assert not (tmp_path / "out.mp4").exists()


def test_unwritable_recording_folder_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="it is a file, not a folder"):
        SegmentedRecording(tmp_path / "file", FPS)
