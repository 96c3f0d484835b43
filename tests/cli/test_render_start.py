"""``vidgen render --image`` / ``--continue``: the MP4 holds the given frames, then the continuation;
other sizes are resized (and said so); unreadable files are exit 2 with one line."""

import numpy as np
import pytest
from PIL import Image

from tests.cli.test_render_cli import _render, model  # noqa: F401 - the tiny model fixture
from vidgen.shapes import captions, world
from vidgen.video import probe_video, read_video, write_mp4

SCENE = world.Scene("black", "red", "square", "medium", "slow", "left")


def test_continue_holds_the_clip_then_the_continuation(tmp_path):
    clip = world.render_clip(SCENE, 17, size=64, start=(0.7, 0.5)).frames
    given = tmp_path / "clip.mp4"
    write_mp4(given, clip, fps=16)
    out = tmp_path / "more.mp4"
    # the default model: its trained autoencoder gives the clip back closely
    _render("--continue", given, "--seconds", 1, "--seed", 1, "--out", out, captions.caption(SCENE))
    frames, _ = read_video(out)
    assert len(frames) == 17 + 16
    opening = np.abs(frames[:17].astype(int) - read_video(given)[0].astype(int)).mean()
    assert opening < 4, opening  # autoencoder round trip + H.264, on 0-255 values
    # the continuation follows on: the object is still there, in red, on black
    assert frames[17:].max(axis=(1, 2))[:, 0].min() > 150 and np.median(frames[17:]) < 16


def test_image_of_another_size_is_resized(model, tmp_path):  # noqa: F811
    image = tmp_path / "start.png"
    Image.fromarray(np.full((30, 50, 3), 200, np.uint8)).save(image)
    out = tmp_path / "from-image.mp4"
    result = _render("--model", model, "--image", image, "--seconds", 1, "--seed", 1, "--out", out, "x")
    info = probe_video(out)
    assert (info["frames"], info["width"], info["height"]) == (1 + 16, 64, 64)
    assert "resizing the start frames from 50x30 to 64x64" in result.stderr


@pytest.mark.parametrize("flag, name, message", [
    ("--image", "notes.txt", "--image: not an image file:"),
    ("--continue", "notes.txt", "--continue: not a video file:"),
    ("--continue", "missing.mp4", "--continue: no such video file:"),
])  # fmt: skip
def test_unreadable_start_is_exit_2_with_one_line(model, tmp_path, flag, name, message):  # noqa: F811
    (tmp_path / "notes.txt").write_text("hello")
    out = tmp_path / "x.mp4"
    result = _render("--model", model, flag, tmp_path / name, "--out", out, "a prompt", check=False)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.mp4.parts").exists()


def test_quantize_flag_reaches_the_pipeline_and_the_ray_workers(model, tmp_path):  # noqa: F811
    pytest.importorskip("torchao")
    from vidgen.cli import build_parser
    from vidgen.cli.render_ray import pipeline_spec

    videos = []
    for extra in ([], ["--quantize", "int8"]):
        out = tmp_path / f"video{len(videos)}.mp4"
        _render("--model", model, *extra, "--seconds", 1, "--seed", 1, "--out", out, "a prompt")
        videos.append(read_video(out)[0])
    assert videos[0].shape == videos[1].shape == (16, 64, 64, 3)
    off = np.abs(videos[0].astype(int) - videos[1].astype(int)).mean()
    assert 0 < off < 10  # int8 weights move the video a little (same seed), no more
    args = build_parser().parse_args(["render", "x", "--quantize", "fp8", "--parallel", "ray"])
    assert pipeline_spec(args).overrides == {"runtime.quantize": "fp8"}
    result = _render("--model", model, "--quantize", "int4", "x", check=False)
    assert result.returncode == 2 and "invalid choice: 'int4'" in result.stderr


def test_continue_with_a_decode_worker_is_refused_before_ray_starts(model, tmp_path):  # noqa: F811
    clip = tmp_path / "clip.mp4"
    write_mp4(clip, np.zeros((5, 64, 64, 3), np.uint8), fps=16)
    out = tmp_path / "x.mp4"
    argv = ["--model", model, "--continue", clip, "--parallel", "ray", "--decode-worker", "--out", out, "x"]
    result = _render(*argv, check=False)
    assert result.returncode == 2 and "drop --decode-worker" in result.stderr
    assert not (tmp_path / "x.mp4.parts").exists()
