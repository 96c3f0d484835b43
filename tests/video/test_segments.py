"""MPEG-TS segments: keyframe first, configured duration, timestamps continuous across files."""

import os
from fractions import Fraction

import av
import numpy as np
import pytest

from tests.video.conftest import FPS, INTERIOR_TOLERANCE, interior_mask, max_error, moving_shapes, packets
from vidgen.video import SegmentWriter, probe_video, read_video


def test_segments_open_on_a_keyframe_and_have_the_configured_duration(tmp_path):
    writer = SegmentWriter(tmp_path, FPS, segment_frames=16)
    written = [writer.write(chunk) for chunk in np.array_split(moving_shapes(40), [10, 24, 33])]
    # Buffered until a segment is full: after 10 frames none, 24 one, 33 two, 40 still two.
    assert [len(paths) for paths in written] == [0, 1, 1, 0]
    assert [p.name for p in writer.flush()] == ["segment_00002.ts"]
    assert sorted(os.listdir(tmp_path)) == ["segment_00000.ts", "segment_00001.ts", "segment_00002.ts"]

    infos = [probe_video(path) for path in writer.segments]
    assert [info["frames"] for info in infos] == [16, 16, 8]
    assert [info["duration"] for info in infos] == [1.0, 1.0, 0.5]
    assert {(info["codec"], info["pix_fmt"], info["fps"]) for info in infos} == {("h264", "yuv420p", 16)}
    for path in writer.segments:
        keyframes = [key for _, key in packets(path)]
        assert keyframes[0] and not any(keyframes[1:])


def test_timestamps_continue_across_segments(tmp_path):
    writer = SegmentWriter(tmp_path, FPS, segment_frames=16)
    writer.write(moving_shapes(40))
    writer.flush()
    times = [time for path in writer.segments for time, _ in packets(path)]
    assert times == [Fraction(n, FPS) for n in range(40)]


def test_concatenated_segments_play_as_the_uninterrupted_video(tmp_path):
    clip = moving_shapes(48)
    writer = SegmentWriter(tmp_path / "segments", FPS)
    for chunk in np.split(clip, 4):
        writer.write(chunk)
    writer.flush()
    joined = tmp_path / "joined.ts"
    joined.write_bytes(b"".join(path.read_bytes() for path in writer.segments))  # what a player sees

    frames, _ = read_video(joined)
    per_segment = np.concatenate([read_video(path)[0] for path in writer.segments])
    assert frames.shape[0] == 48
    np.testing.assert_array_equal(frames, per_segment)
    assert max_error(frames, clip, interior_mask(clip)) <= INTERIOR_TOLERANCE
    with av.open(str(joined)) as container:
        pts = [frame.pts for frame in container.decode(video=0)]
    assert np.unique(np.diff(pts)).tolist() == [90000 // FPS]  # no stutter, no restart


def test_default_segment_is_one_second(tmp_path):
    assert SegmentWriter(tmp_path, 16).segment_frames == 16
    assert SegmentWriter(tmp_path, Fraction(24000, 1001)).segment_frames == 24


def test_segments_shorter_than_a_second_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"at least 1 s.*segment_frames >= 16"):
        SegmentWriter(tmp_path, FPS, segment_frames=8)


def test_nothing_buffered_means_nothing_flushed(tmp_path):
    writer = SegmentWriter(tmp_path, FPS)
    writer.write(moving_shapes(16))
    assert writer.flush() == []
    assert writer.frames_written == 16
