"""The Python API's first minutes: ``pipe(...)`` shows a tqdm progress bar (configurable as in
diffusers) and its output saves as an MP4 that holds the frames it returned."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tiny import FP32, assert_decoded_match, tiny_components
from vidgen.video import probe_video, read_video, write_mp4

PROMPT = "a red circle moving left on a black background"


@pytest.fixture(scope="module")
def pipe():
    return tiny_components(**FP32)


def test_progress_bar_counts_frames(pipe, capsys):
    pipe.set_progress_bar_config(ascii=True, ncols=80)
    pipe(PROMPT, seconds=1, generator=0)
    bar = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "16/16" in bar and "frame" in bar
    pipe.set_progress_bar_config(disable=True)
    pipe(PROMPT, seconds=1, generator=0)
    assert capsys.readouterr().err == ""
    pipe.set_progress_bar_config()


@pytest.mark.parametrize("output_type", ["np", "pt", "pil"])
def test_output_saves_as_mp4(pipe, tmp_path, output_type):
    pipe.set_progress_bar_config(disable=True)
    out = pipe(PROMPT, seconds=1, generator=3, output_type=output_type)
    assert out.fps == 16
    path = out.save(tmp_path / "x.mp4")
    frames, fps = read_video(path)
    assert fps == 16 and frames.shape == (16, 64, 64, 3)
    # the file holds the returned frames: what write_mp4 makes of them as uint8 (the tiny random
    # model's frames are noise, which H.264 does not keep exactly)
    as_uint8 = (pipe(PROMPT, seconds=1, generator=3).frames * 255).round().astype(np.uint8)
    reference, _ = read_video(write_mp4(tmp_path / "reference.mp4", as_uint8, 16))
    assert_decoded_match(frames, reference)  # x264 under load may decide a block differently
    assert probe_video(out.save(tmp_path / "big.mp4", upscale=4))["width"] == 256


def test_export_to_video_is_public():
    import vidgen

    assert vidgen.export_to_video.__module__ == "vidgen.video.export"
