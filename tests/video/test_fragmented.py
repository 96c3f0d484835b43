"""Fragmented MP4: moof boxes, pieces handed out as the muxer finishes them, and it decodes."""

import io
import os

import numpy as np
import pytest

from tests.video.conftest import (
    FPS,
    INTERIOR_TOLERANCE,
    interior_mask,
    max_error,
    moving_shapes,
    packets,
    top_level_boxes,
)
from vidgen.video import FragmentedMp4Writer, probe_video, read_video


def test_in_memory_stream_hands_out_whole_fragments():
    clip = moving_shapes(48)
    writer = FragmentedMp4Writer(None, FPS, fragment_frames=16)
    handed_out = [writer.write(chunk) for chunk in np.split(clip, 3)]
    handed_out.append(writer.close())
    # Chunk k's fragment is finished when chunk k + 1 begins; close() adds the last one and mfra.
    assert [len(pieces) for pieces in handed_out] == [0, 2, 1, 2]
    pieces = [piece for call in handed_out for piece in call]
    assert b"".join(pieces) == writer.getvalue()
    assert top_level_boxes(pieces[0]) == [b"ftyp", b"moov"]
    assert [top_level_boxes(piece) for piece in pieces[1:4]] == [[b"moof", b"mdat"]] * 3
    assert top_level_boxes(pieces[4]) == [b"mfra"]

    data = writer.getvalue()
    assert probe_video(data)["frames"] == 48
    frames, fps = read_video(data)
    assert fps == FPS and max_error(frames, clip, interior_mask(clip)) <= INTERIOR_TOLERANCE
    # One fragment per IDR frame, one IDR every fragment_frames frames.
    assert [pts for pts, key in packets(io.BytesIO(data)) if key] == [0, 1, 2]  # seconds


def test_init_segment_plus_fragments_so_far_is_playable():
    writer = FragmentedMp4Writer(None, FPS, fragment_frames=16)
    writer.write(moving_shapes(16))
    early = writer.write(moving_shapes(16, seed=1))
    frames, _ = read_video(b"".join(early))  # what a live consumer has after two chunks
    assert frames.shape[0] == 16
    writer.close()


def test_file_target_is_atomic_and_fragmented(tmp_path):
    path = tmp_path / "live.mp4"
    writer = FragmentedMp4Writer(path, FPS)
    writer.write(moving_shapes(40))
    assert not path.exists()
    writer.close()
    assert os.listdir(tmp_path) == ["live.mp4"]
    data = path.read_bytes()
    assert top_level_boxes(data).count(b"moof") == 3  # 40 frames in fragments of 16
    assert read_video(path)[0].shape == (40, 64, 64, 3)


def test_file_object_target_gets_every_byte():
    sink = io.BytesIO()
    writer = FragmentedMp4Writer(sink, FPS)
    pieces = writer.write(moving_shapes(20)) + writer.close()
    assert sink.getvalue() == b"".join(pieces)
    assert b"moof" in sink.getvalue()
    with pytest.raises(RuntimeError, match="target=None"):
        writer.getvalue()


def test_abort_removes_the_partial_file(tmp_path):
    with pytest.raises(KeyError), FragmentedMp4Writer(tmp_path / "x.mp4", FPS) as writer:
        writer.write(moving_shapes(20))
        raise KeyError("stop")
    assert os.listdir(tmp_path) == []
