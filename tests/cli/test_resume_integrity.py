"""``vidgen render --resume`` on a damaged ``OUT.mp4.parts/``: whatever a crash, a disk or a person
did to the folder, the resumed MP4 is exactly the uninterrupted one's frames, or the render refuses
in one line; never a silently different video.

One render is interrupted (SIGKILL) once; each case damages a copy of its folder and resumes it."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.tiny import save_tiny_pipeline
from vidgen.cli import main
from vidgen.video import read_video

PROMPT = "a red circle moving left on a black background"
SECONDS = 5  # 10 chunks of the tiny model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_tiny_pipeline(tmp_path_factory.mktemp("tiny") / "model")


def _args(model, seed=7):
    return ["--model", model, "--prompt", PROMPT, "--seconds", SECONDS, "--seed", seed]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _render(*args, check=True):
    cmd = [sys.executable, "-m", "vidgen", "render", "--quiet", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), check=check, timeout=300)


def _chunks(parts):
    manifest = parts / "manifest.json"
    try:
        return len(json.loads(manifest.read_text())["chunks"])
    except (FileNotFoundError, ValueError):
        return 0


def _kill_after(args, out, chunks):
    """Start a render of ``out`` and SIGKILL it once ``chunks`` chunks are recorded."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "vidgen", "render", "--quiet", *map(str, args), "--out", str(out)], env=_env()
    )
    parts = out.with_name(out.name + ".parts")
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and _chunks(parts) < chunks:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return parts


@pytest.fixture(scope="module")
def renders(model, tmp_path_factory):
    """(the uninterrupted video's frames, an interrupted render's folder, another seed's folder)."""
    root = tmp_path_factory.mktemp("renders")
    _render(*_args(model), "--out", root / "whole.mp4")
    parts = _kill_after(_args(model), root / "cut.mp4", 4)
    other = _kill_after(_args(model, seed=8), root / "other.mp4", 4)
    assert 4 <= _chunks(parts) < 10 and (parts / "state.safetensors").is_file()
    return read_video(root / "whole.mp4")[0], parts, other


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGE = {
    "state deleted": lambda p, o: (p / "state.safetensors").unlink(),
    "state bit flipped at its end": lambda p, o: _flip(p / "state.safetensors", -1),
    "state truncated": lambda p, o: (p / "state.safetensors").write_bytes(
        (p / "state.safetensors").read_bytes()[:100]
    ),
    "state empty": lambda p, o: (p / "state.safetensors").write_bytes(b""),
    "state header damaged": lambda p, o: _flip(p / "state.safetensors", 12),
    "middle segment deleted": lambda p, o: (p / "chunk_00002.mp4").unlink(),
    "middle segment bytes flipped": lambda p, o: [
        _flip(p / "chunk_00002.mp4", 600 + 7 * i) for i in range(32)
    ],
    "segment from another seed": lambda p, o: shutil.copy(o / "chunk_00003.mp4", p / "chunk_00003.mp4"),
    "last segment torn": lambda p, o: (p / f"chunk_{_chunks(p) - 1:05d}.mp4").write_bytes(
        (p / f"chunk_{_chunks(p) - 1:05d}.mp4").read_bytes()[:-300]
    ),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_folder_resumes_to_the_uninterrupted_video(model, renders, tmp_path, capsys, case):
    whole, parts, other = renders
    out = tmp_path / "cut.mp4"
    copy = tmp_path / "cut.mp4.parts"
    shutil.copytree(parts, copy)
    DAMAGE[case](copy, other)
    # in this process (no interpreter to start), with its own thread count: the frames do not follow it
    code = main(["render", "--quiet", *map(str, _args(model)), "--out", str(out), "--resume"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "made again" in err or "from its start again" in err, err
    frames, _ = read_video(out)
    assert frames.shape == whole.shape and np.array_equal(frames, whole)


def test_killed_at_random_moments_many_times_resumes_exactly(model, renders, tmp_path):
    """Three SIGKILLs at random moments (a seeded draw: mid-chunk, mid-write, mid-join), each
    resumed: the final MP4 holds exactly the uninterrupted render's frames."""
    whole, _, _ = renders
    out = tmp_path / "many.mp4"
    draw = random.Random(5)
    parts = out.with_name(out.name + ".parts")
    for _ in range(3):
        args = [*_args(model), "--resume"] if parts.exists() else _args(model)
        proc = subprocess.Popen(
            [sys.executable, "-m", "vidgen", "render", "--quiet", *map(str, args), "--out", str(out)],
            env=_env(),
        )
        time.sleep(draw.uniform(2.5, 5.0))  # the interpreter and the model take ~3 s to start
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    _render(*_args(model), "--out", out, *(["--resume"] if parts.exists() else []))
    frames, _ = read_video(out)
    assert np.array_equal(frames, whole)


def test_a_full_disk_mid_render_is_one_line_and_the_render_resumes(model, tmp_path):
    """The disk refuses a write half way (a file size limit, as a full disk or a quota would: the
    state file outgrows it after a few chunks): one line naming what to do, exit 1, no traceback;
    the same command with --resume once there is room finishes with the uninterrupted frames."""
    import resource

    out = tmp_path / "full.mp4"

    def small_files():  # the state file (0.1 MB here) outgrows this after a few chunks
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))

    args = [*_args(model)[:-4], "--seconds", 2, "--seed", 7]  # 4 chunks are enough to fill the limit
    cmd = [sys.executable, "-m", "vidgen", "render", "--quiet", *map(str, args), "--out", str(out)]
    result = subprocess.run(
        cmd, capture_output=True, text=True, env=_env(), timeout=300, preexec_fn=small_files
    )
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "the disk refused a write (File too large)" in lines[0] and "--resume" in lines[0]
    assert not out.exists() and out.with_name(out.name + ".parts").is_dir()
    _render(*args, "--out", out, "--resume")
    whole = tmp_path / "whole.mp4"
    _render(*args, "--out", whole)
    np.testing.assert_array_equal(read_video(out)[0], read_video(whole)[0])
