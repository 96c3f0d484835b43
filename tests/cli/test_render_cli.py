"""``vidgen render`` end to end with a tiny model: the MP4 decodes; SIGKILL + --resume; user errors."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.tiny import save_tiny_pipeline
from vidgen.video import probe_video, read_video

PROMPT = "a red circle moving left on a black background"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_tiny_pipeline(tmp_path_factory.mktemp("tiny") / "model")


def _render(*args, check=True, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "vidgen", "render", "--quiet", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=check, timeout=300, **kw)


def test_render_writes_a_decodable_mp4(model, tmp_path):
    out = tmp_path / "video.mp4"
    _render("--model", model, "--prompt", PROMPT, "--seconds", 3, "--seed", 1, "--out", out)
    info = probe_video(out)
    assert (info["frames"], info["fps"], info["width"], info["height"]) == (48, 16, 64, 64)
    assert info["codec"] == "h264" and info["pix_fmt"] == "yuv420p"
    assert not (tmp_path / "video.mp4.parts").exists()


def test_positional_prompt_and_default_name(model, tmp_path):
    """``vidgen render "a prompt"`` as in the README: the MP4 is named after the prompt, here."""
    _render("--model", model, "A red circle, moving left!", "--seconds", 1, "--seed", 1, cwd=tmp_path)
    info = probe_video(tmp_path / "a-red-circle-moving-left.mp4")
    assert (info["frames"], info["width"]) == (16, 64)


def test_off_topic_prompt_and_untrained_size_warn_and_upscale_enlarges_the_file(model, tmp_path):
    """The tiny model carries the default model's config: Shapes World words, trained at 64x64."""
    out = tmp_path / "cat.mp4"
    result = _render(
        "--model", model, "a cat playing the piano, cinematic", "--seconds", 1, "--seed", 1,
        "--height", 32, "--width", 32, "--upscale", 3, "--out", out,
    )  # fmt: skip
    warnings = [line for line in result.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 2, result.stderr
    assert "does not know 'cat', 'playing', 'piano', 'cinematic'" in warnings[0]
    assert "trained at 64x64 (WxH), not 32x32" in warnings[1]
    info = probe_video(out)
    assert (info["frames"], info["width"], info["height"]) == (16, 96, 96)
    # the model made 32x32 frames: each is a 3x3 block in the file
    frames, _ = read_video(out)
    assert frames.shape == (16, 96, 96, 3)


def test_the_ray_driver_warns_too(model, tmp_path):
    """With --parallel ray the driver loads no weights but reads the config for the warnings
    (here before a layout error stops the render, so no Ray is started)."""
    result = _render(
        "--model", model, "a cat", "--parallel", "ray", "--replicas", 2, "--out", tmp_path / "x.mp4", check=False
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert "warning: the default model only knows Shapes World and does not know 'cat'" in lines[0]
    assert "--replicas applies to batches" in lines[-1]


def test_storyboard_file(model, tmp_path):
    board = tmp_path / "board.toml"
    board.write_text(
        '[[scene]]\nstart = 0\nprompt = "a red circle"\n[[scene]]\nstart = 1.5\nprompt = "a blue square"\n'
    )
    out = tmp_path / "board.mp4"
    _render("--model", model, "--storyboard", board, "--seconds", 3, "--seed", 1, "--out", out)
    assert probe_video(out)["frames"] == 48
    as_json = tmp_path / "board.json"
    as_json.write_text(json.dumps([[0, "a red circle"], [1.5, "a blue square"]]))
    out2 = tmp_path / "board2.mp4"
    _render("--model", model, "--storyboard", as_json, "--seconds", 3, "--seed", 1, "--out", out2)
    assert np.array_equal(read_video(out)[0], read_video(out2)[0])


def test_sigkill_then_resume_equals_uninterrupted(model, tmp_path):
    args = ["--model", model, "--prompt", PROMPT, "--seconds", 40, "--seed", 7]
    whole = tmp_path / "whole.mp4"
    _render(*args, "--out", whole)

    out = tmp_path / "killed.mp4"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vidgen", "render", "--quiet", *map(str, args), "--out", str(out)], env=env
    )
    manifest = tmp_path / "killed.mp4.parts" / "manifest.json"
    deadline = time.time() + 120
    while time.time() < deadline:
        if manifest.is_file() and len(json.loads(manifest.read_text())["chunks"]) >= 4:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists(), "a killed render must not leave a file that looks complete"
    chunks_before = len(json.loads(manifest.read_text())["chunks"])
    assert 0 < chunks_before < 80

    _render(*args, "--out", out, "--resume")
    resumed, _ = read_video(out)
    expected, _ = read_video(whole)
    assert resumed.shape == expected.shape == (640, 64, 64, 3)
    assert np.array_equal(resumed, expected)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", " ", "--seconds", 2], "prompt is empty"),
        ([PROMPT, "--prompt", PROMPT], "give the prompt once"),
        (["--seconds", 2], "say what to render"),
        (["--prompt", PROMPT, "--seconds", -2], "--seconds must be a positive number, got -2"),
        (["--prompt", PROMPT, "--seconds", 1e9], "video length"),
        (["--prompt", PROMPT, "--height", 50], "multiples of 8"),
        (["--prompt", PROMPT, "--set", "generation.windw=3"], "unknown key 'windw'"),
        (["--prompt", PROMPT, "--set", "generation.window_frames=3"], "multiple of chunk_frames"),
    ],
)
def test_user_errors_exit_2_with_one_line(model, tmp_path, args, message):
    result = _render("--model", model, *args, "--out", tmp_path / "x.mp4", check=False)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir()), "nothing may be left behind"


def test_missing_model_and_unwritable_output(tmp_path, model):
    result = _render(
        "--model", tmp_path / "absent", "--prompt", PROMPT, "--out", tmp_path / "x.mp4", check=False
    )
    assert result.returncode == 2 and "never downloads" in result.stderr
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = _render("--model", model, "--prompt", PROMPT, "--out", blocker / "x.mp4", check=False)
    assert result.returncode == 2 and "cannot write" in result.stderr
    bad = tmp_path / "bad"
    save_tiny_pipeline(bad)
    next((Path(bad) / "vae").glob("*.safetensors")).write_bytes(b"\0" * 10)
    result = _render("--model", bad, "--prompt", PROMPT, "--out", tmp_path / "y.mp4", check=False)
    assert result.returncode == 2 and "autoencoder" in result.stderr


def test_storyboard_errors(model, tmp_path):
    board = tmp_path / "b.json"
    board.write_text(json.dumps([[2, "a red circle"], [1, "a blue square"]]))
    result = _render("--model", model, "--storyboard", board, "--out", tmp_path / "x.mp4", check=False)
    assert result.returncode == 2 and "storyboard" in result.stderr
    board.write_text("not json")
    result = _render("--model", model, "--storyboard", board, "--out", tmp_path / "x.mp4", check=False)
    assert result.returncode == 2 and "cannot parse storyboard" in result.stderr
