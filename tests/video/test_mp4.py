"""MP4 files: they decode to what went in, appear atomically, and refuse bad input clearly."""

import os
from fractions import Fraction

import numpy as np
import pytest

from tests.video.conftest import (
    FLAT_TOLERANCE,
    FPS,
    INTERIOR_TOLERANCE,
    flat_colour_clip,
    interior_mask,
    max_error,
    moving_shapes,
)
from vidgen.video import Mp4Writer, probe_video, read_video, write_mp4


def test_write_mp4_decodes_with_the_right_format(tmp_path):
    path = write_mp4(tmp_path / "clip.mp4", moving_shapes(24), FPS)
    info = probe_video(path)
    assert info == {
        "frames": 24,
        "fps": 16,
        "width": 64,
        "height": 64,
        "duration": 1.5,
        "codec": "h264",
        "pix_fmt": "yuv420p",
    }
    frames, fps = read_video(path)
    assert frames.shape == (24, 64, 64, 3) and frames.dtype == np.uint8
    assert fps == 16 and isinstance(fps, int)


def test_non_square_frames_keep_their_orientation(tmp_path):
    clip = moving_shapes(8, height=32, width=64)
    frames, _ = read_video(write_mp4(tmp_path / "wide.mp4", clip, FPS))
    assert frames.shape == (8, 32, 64, 3)
    assert max_error(frames, clip, interior_mask(clip)) <= INTERIOR_TOLERANCE


def test_flat_colours_survive_the_round_trip(tmp_path):
    clip = flat_colour_clip()
    frames, _ = read_video(write_mp4(tmp_path / "flat.mp4", clip, FPS))
    assert max_error(frames, clip) <= FLAT_TOLERANCE


def test_moving_shapes_keep_their_colours_away_from_edges(tmp_path):
    clip = moving_shapes(32)
    frames, _ = read_video(write_mp4(tmp_path / "shapes.mp4", clip, FPS))
    assert max_error(frames, clip, interior_mask(clip)) <= INTERIOR_TOLERANCE


def test_fractional_frame_rate_round_trips(tmp_path):
    fps = Fraction(24000, 1001)
    path = write_mp4(tmp_path / "ntsc.mp4", moving_shapes(12), fps)
    info = probe_video(path)
    assert info["fps"] == fps and info["frames"] == 12
    assert info["duration"] == pytest.approx(12 / fps)


def test_writer_streams_chunks_into_one_video(tmp_path):
    clip = moving_shapes(30)
    with Mp4Writer(tmp_path / "stream.mp4", FPS) as writer:
        for chunk in np.array_split(clip, [7, 16]):
            writer.write(chunk)
    assert writer.frames_written == 30
    frames, _ = read_video(tmp_path / "stream.mp4")
    assert frames.shape[0] == 30
    assert max_error(frames, clip, interior_mask(clip)) <= INTERIOR_TOLERANCE


def test_no_final_file_until_close(tmp_path):
    path = tmp_path / "out.mp4"
    writer = Mp4Writer(path, FPS)
    writer.write(moving_shapes(48))  # enough for x264 to emit packets, so the muxer has written
    assert not path.exists()
    (partial,) = tmp_path.iterdir()
    assert partial.name.startswith(".out.mp4.") and partial.name.endswith(".partial")
    assert partial.stat().st_size > 0
    assert writer.close() == path
    assert path.exists() and sorted(os.listdir(tmp_path)) == ["out.mp4"]


def test_failure_inside_with_block_leaves_nothing(tmp_path):
    with (
        pytest.raises(RuntimeError, match="generation failed"),
        Mp4Writer(tmp_path / "out.mp4", FPS) as writer,
    ):
        writer.write(moving_shapes(8))
        raise RuntimeError("generation failed")
    assert os.listdir(tmp_path) == []


def test_closing_without_frames_is_an_error_and_leaves_nothing(tmp_path):
    writer = Mp4Writer(tmp_path / "empty.mp4", FPS)
    with pytest.raises(ValueError, match="no frames"):
        writer.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("shape", [(4, 63, 64, 3), (4, 64, 63, 3), (4, 33, 17, 3)])
def test_odd_sizes_are_refused_with_a_hint(tmp_path, shape):
    with pytest.raises(ValueError, match=r"even width and height.*crop or pad"):
        write_mp4(tmp_path / "odd.mp4", np.zeros(shape, np.uint8), FPS)
    assert not (tmp_path / "odd.mp4").exists()


def test_bad_frame_arrays_are_refused(tmp_path):
    with pytest.raises(TypeError, match="uint8"):
        write_mp4(tmp_path / "a.mp4", np.zeros((2, 64, 64, 3), np.float32), FPS)
    with pytest.raises(ValueError, match=r"\(T, H, W, 3\)"):
        write_mp4(tmp_path / "a.mp4", np.zeros((64, 64, 3), np.uint8), FPS)
    with pytest.raises(ValueError, match="fps must be positive"):
        write_mp4(tmp_path / "a.mp4", moving_shapes(2), 0)


def test_frame_size_may_not_change_within_a_video(tmp_path):
    with Mp4Writer(tmp_path / "a.mp4", FPS) as writer:
        writer.write(moving_shapes(2))
        with pytest.raises(ValueError, match="frame size changed"):
            writer.write(moving_shapes(2, height=32))


def test_unwritable_output_paths_fail_before_any_encoding(tmp_path):
    clip = moving_shapes(2)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_mp4(tmp_path / "missing" / "a.mp4", clip, FPS)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="not a folder"):
        write_mp4(tmp_path / "file" / "a.mp4", clip, FPS)
    with pytest.raises(IsADirectoryError, match="give a file name"):
        write_mp4(tmp_path, clip, FPS)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o500)
    with pytest.raises(PermissionError, match="permission denied"):
        Mp4Writer(folder / "a.mp4", FPS)
