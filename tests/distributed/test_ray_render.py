"""``vidgen render --parallel ray``: the frames of the single-process render, an interrupted Ray
render finished by ``--resume``, and clear errors for degrees that cannot run."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from tests.tiny import FP32, assert_decoded_match, save_tiny_pipeline
from vidgen.cli import build_parser, main
from vidgen.distributed.ray_cluster import DegreeError, RayParallelism, place_workers
from vidgen.distributed.ray_worker import WORK_DIR, PipelineSpec
from vidgen.distributed.render import record_video
from vidgen.distributed.replica import BACKPRESSURE_CHUNKS, Replica, WorkerLost
from vidgen.request import GenerationRequest
from vidgen.video import SegmentedRecording, read_video

PROMPT = "a red circle moving left on a black background"
SEED = 7


def _argv(model, out, *extra):
    return [
        "render",
        "--model",
        str(model),
        "--prompt",
        PROMPT,
        "--seconds",
        "2",
        "--seed",
        str(SEED),
        "--out",
        str(out),
        "--quiet",
        *extra,
    ]


def _single_process(model, folder, seconds: int) -> np.ndarray:
    """The single-process render a Ray render must equal, frame for frame."""
    out = folder / "single.mp4"
    assert main([*_argv(model, out), "--seconds", str(seconds)]) == 0
    return read_video(out)[0]


@pytest.fixture(scope="module")
def single_frames(tiny_model_dir, tmp_path_factory):
    return _single_process(tiny_model_dir, tmp_path_factory.mktemp("single"), 2)


@pytest.mark.parametrize(
    "how", [["--sp", "1"], ["--sp", "2"], ["--decode-worker"]], ids=["sp1", "sp2", "decode"]
)
def test_ray_render_equals_single_process(ray_cluster, tiny_model_dir, single_frames, tmp_path, how):
    out = tmp_path / "ray.mp4"
    assert main(_argv(tiny_model_dir, out, "--parallel", "ray", *how)) == 0
    frames, fps = read_video(out)
    assert fps == 16 and frames.shape == single_frames.shape == (32, 64, 64, 3)
    assert_decoded_match(frames, single_frames)
    assert not (tmp_path / "ray.mp4.parts").exists()


def test_killed_ray_render_is_finished_by_resume(ray_cluster, tiny_model_dir, single_frames, tmp_path):
    """A Ray render whose worker dies (no restarts allowed) leaves a ``.parts`` folder whose state
    matches its recording: the single-process ``--resume`` finishes it with the same frames."""
    out = tmp_path / "out.mp4"
    parts = tmp_path / "out.mp4.parts"
    args = build_parser().parse_args(_argv(tiny_model_dir, out))
    from vidgen.cli.render import saved_record

    parts.mkdir()
    (parts / "request.json").write_text(json.dumps(saved_record(args, SEED)))
    layout = RayParallelism(sp=1, replicas=1)
    placement = place_workers(layout)
    replica = Replica(
        0, PipelineSpec(model=str(tiny_model_dir)), placement, 1, parts / WORK_DIR, loopback=True
    )
    try:
        replica.start()

        def kill_at_first_chunk(chunk):
            # the worker may have made BACKPRESSURE_CHUNKS more by then: they are recorded too
            if chunk.index == 0:
                os.kill(replica.pids[0], signal.SIGKILL)

        request = GenerationRequest(prompt=PROMPT, seconds=2, seed=SEED)
        with pytest.raises(WorkerLost):
            record_video(replica, request, parts, out, max_restarts=0, on_chunk=kill_at_first_chunk)
    finally:
        replica.stop()
        placement.remove()
    recorded = SegmentedRecording(parts, fps=16).completed_chunks()
    assert recorded == list(range(len(recorded))) and 1 <= len(recorded) <= 1 + BACKPRESSURE_CHUNKS < 5
    assert not out.exists()

    assert main(_argv(tiny_model_dir, out, "--resume")) == 0
    assert_decoded_match(read_video(out)[0], single_frames)


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["rank", "decoder"])
def test_decode_worker_survives_a_kill_with_the_same_frames(ray_cluster, tiny_model_dir, tmp_path, victim):
    """Ranks send latents, a separate worker decodes them (in order, while the ranks go on); a
    killed rank or decoder is replaced and both resume from their snapshots of the same chunk."""
    out, parts = tmp_path / "out.mp4", tmp_path / "out.mp4.parts"
    placement = place_workers(RayParallelism(sp=1, replicas=1), extra=1)
    replica = Replica(0, PipelineSpec(model=str(tiny_model_dir)), placement, 1, parts / WORK_DIR,
                      loopback=True, decode_bundle=1)  # fmt: skip
    killed = []

    def kill_once(chunk):
        assert len(chunk.frames) > 0 and chunk.latents is None
        if chunk.index == 1 and not killed:
            killed.append(replica.pids[0 if victim == "rank" else 1])
            os.kill(killed[0], signal.SIGKILL)

    try:
        replica.start()
        # 7 chunks: ranks and decoder are at most 2 + 2 chunks ahead of the recording at the kill
        request = GenerationRequest(prompt=PROMPT, seconds=3, seed=SEED)
        result = record_video(replica, request, parts, out, on_chunk=kill_once)
    finally:
        replica.stop()
        placement.remove()
    assert killed and result.restarts == 1 and result.frames == 48
    assert_decoded_match(read_video(out)[0], _single_process(tiny_model_dir, tmp_path, 3))


def test_bad_degrees_are_clear_errors(ray_cluster, tiny_model_dir, tmp_path, capsys):
    with pytest.raises(DegreeError, match="--sp must be a positive integer"):
        RayParallelism(sp=0)
    with pytest.raises(DegreeError, match="--replicas must be a positive integer"):
        RayParallelism(sp=1, replicas=-2)
    with pytest.raises(DegreeError, match="needs 4 CPUs but the Ray cluster has 2"):
        RayParallelism(sp=2, replicas=2).check_fits(2, "CPU")

    def error_of(*extra) -> str:
        assert main(_argv(tiny_model_dir, tmp_path / "x.mp4", *extra)) == 2
        return capsys.readouterr().err

    assert "--sp must be a positive integer, got 0" in error_of("--parallel", "ray", "--sp", "0")
    assert "needs 4 CPUs but the Ray cluster has 2" in error_of("--parallel", "ray", "--sp", "4")
    assert "--replicas applies to batches" in error_of("--parallel", "ray", "--replicas", "2")
    assert not (tmp_path / "x.mp4.parts").exists()


@pytest.mark.parametrize("sp", ["1", "2"])
def test_ray_continuation_equals_single_process(ray_cluster, tiny_model_dir, tmp_path, sp):
    from vidgen.video import write_mp4

    clip = tmp_path / "clip.mp4"
    write_mp4(clip, (np.random.default_rng(6).random((9, 64, 64, 3)) * 255).astype(np.uint8), fps=16)
    single, ray = tmp_path / "single.mp4", tmp_path / "ray.mp4"
    assert main([*_argv(tiny_model_dir, single, "--continue", str(clip)), "--seconds", "1"]) == 0
    argv = _argv(tiny_model_dir, ray, "--continue", str(clip), "--parallel", "ray", "--sp", sp)
    assert main([*argv, "--seconds", "1"]) == 0
    frames = read_video(ray)[0]
    assert frames.shape == (9 + 16, 64, 64, 3)  # the clip, then a second
    assert_decoded_match(frames, read_video(single)[0])


def test_sp2_on_three_heads_takes_ring_and_ulysses_is_one_line(ray_cluster, tmp_path, capsys):
    """The default model has 3 heads: ``--sp 2`` (``--sp-kind auto``) runs on ring attention;
    ``--sp-kind ulysses`` is refused in one line (the worker's error, not Ray's traceback)."""
    model = save_tiny_pipeline(tmp_path / "three", heads=3, **FP32)
    out = tmp_path / "ring.mp4"
    assert main([*_argv(model, out, "--parallel", "ray", "--sp", "2"), "--seconds", "1"]) == 0
    assert read_video(out)[0].shape == (16, 64, 64, 3)
    capsys.readouterr()
    bad = tmp_path / "ulysses.mp4"
    assert main(_argv(model, bad, "--parallel", "ray", "--sp", "2", "--sp-kind", "ulysses")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vidgen render: error: Ulysses sequence parallelism splits the 3 attention heads")
    assert len(err.splitlines()) == 1 and "--sp-kind ring or auto" in err
    assert not (tmp_path / "ulysses.mp4.parts").exists()
