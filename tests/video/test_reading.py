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


def test_a_long_large_clip_is_read_at_the_videos_size_frame_by_frame(tmp_path):
    """``--continue`` with a 720p clip: each frame is resized as it is decoded, so the clip is never
    in memory at its own size (it was all decoded first: 6.4 GB for a long clip), and the frames
    are those of resizing the whole decoded clip."""
    import tracemalloc

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    clip = rng.integers(0, 256, (16, 720, 1280, 3), dtype=np.uint8)
    path = write_mp4(tmp_path / "big.mp4", clip, FPS)
    tracemalloc.start()
    try:
        small, _ = read_video(path, size=(64, 96))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert small.shape == (16, 64, 96, 3)
    assert peak < 3 * 720 * 1280 * 3, f"{peak / 1e6:.1f} MB at the peak"  # a frame or two, not 16
    whole, _ = read_video(path)
    resized = [np.asarray(Image.fromarray(f).resize((96, 64), Image.Resampling.LANCZOS)) for f in whole]
    assert np.array_equal(small, np.stack(resized))


def test_frames_larger_than_a_start_file_may_have_are_refused_before_decoding(tmp_path):
    from vidgen.video.reading import MAX_START_PIXELS, check_frame_size

    check_frame_size(7680, 4320, "8k.mp4")
    with pytest.raises(ValueError, match="more than the 50,000,000 a start file may have"):
        check_frame_size(MAX_START_PIXELS + 1, 1, "wide.mp4")
