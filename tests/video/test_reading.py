"""Reading: frames, fps, limits, and clear errors for missing or undecodable input."""

import pytest

from tests.video.conftest import FPS, moving_shapes
from vidgen.video import probe_video, read_video, write_mp4


def test_max_frames_and_bytes_input(tmp_path):
    path = write_mp4(tmp_path / "a.mp4", moving_shapes(20), FPS)
    frames, fps = read_video(path, max_frames=5)
    assert frames.shape == (5, 64, 64, 3) and fps == FPS
    from_bytes, _ = read_video(path.read_bytes())
    assert from_bytes.shape[0] == 20
    assert probe_video(path.read_bytes())["frames"] == 20


def test_missing_file_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such video file: .*nothing.mp4"):
        read_video(tmp_path / "nothing.mp4")
    with pytest.raises(FileNotFoundError, match="no such video file"):
        probe_video(tmp_path / "nothing.mp4")


def test_undecodable_input_is_reported(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"this is not a video\n" * 8)
    with pytest.raises(ValueError, match=f"not a video file: {junk}"):
        read_video(junk)
    with pytest.raises(ValueError, match="not a video file"):
        probe_video(junk)
    with pytest.raises(ValueError, match=r"not a video file: <5 bytes>"):
        read_video(b"hello")
