"""``upscale``: the written file (whole MP4, segments, recordings) is N times the frames' size;
nearest keeps each pixel a flat N x N block, lanczos smooths; ``export_to_video`` takes every
output type of the pipeline."""

import numpy as np
import pytest
import torch
from PIL import Image

from tests.tiny import assert_decoded_match
from tests.video.conftest import FLAT_TOLERANCE, INTERIOR_TOLERANCE, moving_shapes
from vidgen.video import (
    SegmentedRecording,
    SegmentWriter,
    Upscale,
    export_to_video,
    probe_video,
    read_video,
    write_mp4,
)
from vidgen.video.export import as_uint8_frames


def _blocks(frames: np.ndarray, n: int) -> np.ndarray:
    return frames.repeat(n, axis=1).repeat(n, axis=2)


def test_nearest_is_the_frames_in_n_by_n_blocks(tmp_path):
    clip = moving_shapes(8)
    path = write_mp4(tmp_path / "big.mp4", clip, 16, upscale=4)
    info = probe_video(path)
    assert (info["width"], info["height"], info["frames"]) == (256, 256, 8)
    video, _ = read_video(path)
    # away from colour edges (where yuv420p's chroma blurs), every pixel is its source pixel
    expected = _blocks(clip, 4).astype(int)
    interior = np.ones(video.shape[:3], bool)
    edges = np.abs(np.diff(expected, axis=2)).sum(-1) > 0
    for shift in range(-3, 4):
        interior[:, :, :-1] &= ~np.roll(edges, shift, axis=2)
    assert np.abs(video.astype(int) - expected)[interior].max() <= INTERIOR_TOLERANCE


def test_lanczos_interpolates(tmp_path):
    clip = np.zeros((2, 16, 16, 3), np.uint8)
    clip[:, :, 8:] = 255  # one vertical edge
    nearest, _ = read_video(write_mp4(tmp_path / "n.mp4", clip, 16, upscale=Upscale(8, "nearest")))
    smooth, _ = read_video(write_mp4(tmp_path / "l.mp4", clip, 16, upscale=Upscale(8, "lanczos")))
    assert nearest.shape == smooth.shape == (2, 128, 128, 3)
    row_n, row_l = nearest[0, 64, :, 1].astype(int), smooth[0, 64, :, 1].astype(int)
    # both flat far from the edge; lanczos has levels between black and white near it
    assert abs(row_n[:40] - 16).max() <= 20 and abs(row_l[:40] - row_n[:40]).max() <= FLAT_TOLERANCE + 16
    between = lambda row: int(((row > 40) & (row < 215)).sum())  # noqa: E731
    assert between(row_l) > between(row_n)


def test_segments_and_recordings_upscale_and_resume_only_alike(tmp_path):
    clip = moving_shapes(20)
    with SegmentWriter(tmp_path / "live", 16, upscale=2) as writer:
        paths = writer.write(clip)
    assert probe_video(paths[0])["width"] == 128
    recording = SegmentedRecording(tmp_path / "parts", 16, upscale=3)
    recording.append(0, clip[:10])
    with pytest.raises(ValueError, match="upscale='3:nearest' but this run uses '1:nearest'"):
        SegmentedRecording(tmp_path / "parts", 16)
    again = SegmentedRecording(tmp_path / "parts", 16, upscale=3)
    again.append(1, clip[10:])
    out = again.finalize(tmp_path / "joined.mp4")
    info = probe_video(out)
    assert (info["width"], info["frames"]) == (192, 20)


@pytest.mark.parametrize("factor", [0, 17, 2.5])
def test_bad_factors(factor):
    with pytest.raises(ValueError, match="whole number from 1 to 16"):
        Upscale(factor)
    with pytest.raises(ValueError, match="'nearest' or 'lanczos'"):
        Upscale(2, "bicubic")


def test_export_to_video_takes_every_output_type(tmp_path):
    clip = moving_shapes(6)
    floats = clip.astype(np.float32) / 255.0
    outputs = {
        "np": floats,
        "pt": torch.from_numpy(floats).permute(0, 3, 1, 2),
        "pil": [Image.fromarray(f) for f in clip],
        "uint8": clip,
    }
    reference, _ = read_video(write_mp4(tmp_path / "ref.mp4", clip, 16))
    for name, frames in outputs.items():
        # every output type becomes exactly the uint8 frames the encoder is given ...
        np.testing.assert_array_equal(as_uint8_frames(frames), clip, err_msg=name)
        path = export_to_video(frames, tmp_path / f"{name}.mp4", fps=16)
        video, fps = read_video(path)
        # ... and the file decodes to that video (x264 under load may decide a block differently)
        assert fps == 16, name
        assert_decoded_match(video, reference)
    assert probe_video(export_to_video(floats, tmp_path / "x2.mp4", upscale=2))["width"] == 128
    with pytest.raises(ValueError, match="latents"):
        export_to_video(torch.zeros(1, 4, 2, 8, 8), tmp_path / "latents.mp4")


@pytest.mark.parametrize("scale", [{}, {"width": 96, "height": 64, "interpolation": "LANCZOS"}])
def test_kept_converter_equals_a_fresh_conversion_per_frame(scale):
    """The thread's kept swscale converter gives what ``VideoFrame.reformat`` gives, frame by
    frame, through changes of size; each thread has its own."""
    import threading

    import av
    from av.video.reformatter import ColorRange, Colorspace, Interpolation

    from vidgen.video.encoding import reformatter

    if scale:
        scale = {**scale, "interpolation": Interpolation.LANCZOS}
    rng = np.random.default_rng(0)
    settings = dict(
        format="yuv420p", dst_colorspace=Colorspace.ITU709, dst_color_range=ColorRange.MPEG, **scale
    )
    for shape in [(32, 48, 3), (32, 48, 3), (16, 16, 3), (32, 48, 3)]:
        frame = av.VideoFrame.from_ndarray(rng.integers(0, 256, shape, dtype=np.uint8), format="rgb24")
        got = reformatter().reformat(frame, **settings)
        expected = frame.reformat(**settings)
        assert np.array_equal(got.to_ndarray(), expected.to_ndarray())  # Y, U and V, no row padding
    other = []
    thread = threading.Thread(target=lambda: other.append(reformatter()))
    thread.start()
    thread.join()
    assert reformatter() is reformatter() and other[0] is not reformatter()
