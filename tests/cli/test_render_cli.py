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
        (["--prompt", PROMPT, "--seconds", 1e9], "seconds must be at most 3600 (generation.max_seconds)"),
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
    assert result.returncode == 2 and "no model folder at" in result.stderr
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


def _main_in_process(capsys, *argv):
    """``vidgen render`` in this process: (exit status, stderr lines)."""
    from vidgen.cli import main

    status = main(["render", "--quiet", *map(str, argv)])
    return status, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seconds", "inf"], "--seconds must be a finite number, got inf"),
        (["--seconds", "nan"], "--seconds must be a finite number, got nan"),
        (["--seconds", "-inf"], "--seconds must be a finite number, got -inf"),
        (["--seconds", "1e308"], "seconds must be at most 3600 (generation.max_seconds)"),
        (["--seed", "99999999999999999999999"], "--seed must be at most 9223372036854775807"),
        (["--seed", "-1"], "--seed must be at least 0"),
        (["--steps", "0"], "--steps must be a positive integer, got 0"),
        (["--steps", "100000"], "at most 1000 (generation.max_steps), got 100000"),
        (["--guidance", "inf"], "--guidance must be a finite number, got inf"),
        (["--guidance", "1e308"], "--guidance must be at most 100, got 1e+308"),
        (["--set", "generation.shift=nan"], "--set generation.shift: must be a finite number, got nan"),
        (["--set", "generation.timesteps=[900, nan]"], "--set generation.timesteps: must be a finite"),
        (["--height", "0"], "--height must be a positive integer, got 0"),
        (["--fps", "0"], "--fps must be a positive integer, got 0"),
        (["--fps", "10000000", "--seconds", "3600"], "200000 frames (generation.max_frames)"),
        (["--set", "generation.max_seconds=inf", "--seconds", "1e300"], "max_seconds: must be a finite"),
        (["--height", "4096", "--width", "4096"], "at most 512 for this model (its positional table)"),
        (["--set", "runtime.max_memory_gb=0.000001"], "a 64x64 video needs about"),
    ],
)
def test_numbers_that_cannot_work_are_one_line_and_leave_nothing(model, tmp_path, capsys, args, message):
    status, err = _main_in_process(capsys, "--model", model, PROMPT, *args, "--out", tmp_path / "x.mp4")
    assert status == 2 and len(err) == 1 and message in err[0], err
    assert not list(tmp_path.iterdir()), "nothing may be left behind"


def test_argument_errors_are_one_line(capsys):
    from vidgen.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["render", PROMPT, "--steps", "many"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert err == [
        "vidgen render: error: argument --steps: invalid int value: 'many' (see vidgen render --help)"
    ]


def test_text_and_files_that_cannot_be_read(model, tmp_path, capsys):
    folder = tmp_path / "out.mp4"
    folder.mkdir()
    status, err = _main_in_process(capsys, "--model", model, PROMPT, "--out", folder)
    assert status == 2 and "is a folder: name the MP4 file" in err[0]
    status, err = _main_in_process(capsys, "")  # no --out: the name would come from the prompt
    assert status == 2 and err == ["vidgen render: error: the prompt is empty: say what the video shows"]
    status, err = _main_in_process(capsys, "--model", model, "caf\udce9", "--out", tmp_path / "x.mp4")
    assert status == 2 and err == [
        "vidgen render: error: the prompt is not valid UTF-8 text: write it in UTF-8"
    ]
    board = tmp_path / "b.json"
    for data, message in [
        (bytes(range(256)), "is not UTF-8 text"),
        (b"[" * 200_000 + b"]" * 200_000, "nested deeper than 16 levels"),
        (b'[[0, "a red circle"], [NaN, "a blue square"]]', "NaN is not a number JSON allows"),
        (b'[[false, "a red circle"]]', "scene 0 start must be a number, got bool False"),
        (b'[[0, "a red circle"], [1e400, "a blue square"]]', "scene 1 start must be a finite number"),
    ]:
        board.write_bytes(data)
        status, err = _main_in_process(
            capsys, "--model", model, "--storyboard", board, "--out", tmp_path / "x.mp4"
        )
        assert status == 2 and len(err) == 1 and message in err[0], err
    config = tmp_path / "c.toml"
    config.write_bytes(b'[generation]\nnegative_prompt = "caf\xe9"\n')
    status, err = _main_in_process(
        capsys, "--model", model, PROMPT, "--config", config, "--out", tmp_path / "x.mp4"
    )
    assert status == 2 and "not UTF-8 text" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "c.toml", "out.mp4"]


def test_resume_refuses_another_seed_and_a_damaged_request(model, tmp_path, capsys):
    from vidgen.cli import build_parser
    from vidgen.cli.render import _what_to_render, saved_record

    out = tmp_path / "x.mp4"
    argv = ["render", "--model", str(model), PROMPT, "--seconds", "1", "--out", str(out)]
    args = build_parser().parse_args(argv)
    _what_to_render(args)
    parts = tmp_path / "x.mp4.parts"
    parts.mkdir()
    (parts / "request.json").write_text(json.dumps(saved_record(args, 3)))
    status, err = _main_in_process(capsys, *argv[1:], "--resume", "--seed", "7")
    assert status == 2 and len(err) == 1
    assert (
        "used --seed 3, not 7" in err[0] and f"delete {parts} and run the command without --resume" in err[0]
    )
    status, err = _main_in_process(capsys, *argv[1:], "--resume", "--steps", "2")
    assert status == 2 and "steps differ from the interrupted render's" in err[0]
    (parts / "request.json").write_text('{"prompt": ')
    status, err = _main_in_process(capsys, *argv[1:], "--resume")
    assert status == 2 and "request.json is damaged" in err[0]
    assert not out.exists()


def test_resume_refuses_a_request_saved_in_another_layout_in_one_line(model, tmp_path, capsys):
    """A ``request.json`` from before the one request type (CLI names, no format) is refused as a
    damaged or changed one is: one line, saying how to start over, nothing touched."""
    out = tmp_path / "x.mp4"
    parts = tmp_path / "x.mp4.parts"
    parts.mkdir()
    old = {"prompt": PROMPT, "storyboard": None, "seconds": 1.0, "steps": None, "guidance": None}
    (parts / "request.json").write_text(json.dumps({**old, "seed": 3}))
    argv = ["--model", model, PROMPT, "--seconds", "1", "--out", out, "--resume"]
    status, err = _main_in_process(capsys, *argv)
    assert status == 2 and len(err) == 1, err
    assert "was written by another version of vidgen" in err[0] and f"delete {parts}" in err[0]
    assert sorted(p.name for p in parts.iterdir()) == ["request.json"] and not out.exists()


def test_default_model_render_keeps_its_state_under_half_a_megabyte(tmp_path, monkeypatch):
    """The saved state holds latents, not the KV cache (4.75 MB per chunk for this model)."""
    from vidgen.cli import main
    from vidgen.pipelines.run import VideoRun

    sizes = []
    save = VideoRun.save

    def measured_save(self, path, chunk_index):
        save(self, path, chunk_index)
        sizes.append((chunk_index, os.path.getsize(path), self.cache.k.numel() * 2 * 4))

    monkeypatch.setattr(VideoRun, "save", measured_save)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "default.mp4"
    # 9 s: 19 chunks, past the drift monitor's 16 remembered chunks (the state's largest part)
    args = ["render", "--quiet", "--prompt", PROMPT, "--seconds", "9", "--seed", "3", "--out", str(out)]
    assert main(args) == 0
    assert [index for index, _, _ in sizes] == list(range(19))
    assert sizes[-1][1] == sizes[-2][1]  # the state has stopped growing
    assert all(size <= 500_000 for _, size, _ in sizes), sizes
    assert all(cache > 4_000_000 for _, _, cache in sizes)  # what the state used to hold
    assert probe_video(out)["frames"] == 144
