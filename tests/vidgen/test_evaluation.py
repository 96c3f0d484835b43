"""The evaluation harness and ``vidgen eval``: generated videos are judged, MP4 files are judged."""

import json
import os
import subprocess
import sys

import numpy as np

from tests.tiny import tiny_components
from vidgen import evaluation
from vidgen.shapes import world
from vidgen.video import write_mp4


def test_prompt_file_reading(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text(
        "# a comment\na red circle moving left on a black background\n0: a red circle | 2: a blue square\n"
    )
    prompts = evaluation.read_prompt_file(path)
    assert prompts[0] == "a red circle moving left on a black background"
    assert prompts[1] == [(0.0, "a red circle"), (2.0, "a blue square")]


def test_held_out_prompts_are_deterministic_and_unseen_phrasings():
    from vidgen.shapes import captions

    a, b = evaluation.held_out_prompts(5, seed=3), evaluation.held_out_prompts(5, seed=3)
    assert a == b and len(set(a)) == 5
    for prompt in a:
        captions.parse_prompt(prompt)  # every one names what the evaluator needs


def test_evaluate_model_with_a_tiny_pipeline(tmp_path):
    pipe = tiny_components()
    report = evaluation.evaluate_model(
        pipe,
        prompts=["a red circle moving left on a black background"],
        seconds=2,
        long_prompts=["a blue square moving up on a white background"],
        long_seconds=3,
        storyboards=[
            [
                (0.0, "a red circle moving left on a black background"),
                (1.0, "a blue circle moving left on a black background"),
            ]
        ],
        storyboard_seconds=2,
        out_dir=tmp_path,
        ablations=["no_anchor"],
        log=lambda line: None,
    )
    # a random model follows no prompt: the harness must say so, not crash
    assert report["short"]["adherence_rate"] == 0.0
    assert report["storyboards"]["changes"] == 1
    assert set(report) == {"short", "storyboards", "long", "long_no_anchor"}
    assert (tmp_path / "long_000.png").is_file()
    assert json.loads((tmp_path / "report.json").read_text())["long"]["videos"] == 1


def _eval_cli(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "vidgen", "eval", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_eval_judges_an_mp4(tmp_path):
    scene = world.Scene(
        background="black", color="red", shape="circle", size="large", speed="slow", direction="left"
    )
    clip = world.render_clip(scene, 48, size=64, rng=0)
    path = tmp_path / "truth.mp4"
    write_mp4(path, clip.frames, 16)
    good = _eval_cli("--video", path, "--prompt", "a large red ball moving left on a black background")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["adheres"] is True
    wrong = _eval_cli("--video", path, "--prompt", "a large blue ball moving left on a black background")
    assert wrong.returncode == 1 and json.loads(wrong.stdout)["adheres"] is False
    assert json.loads(wrong.stdout)["failures"]["color"] > 40
    missing = _eval_cli("--video", tmp_path / "none.mp4", "--prompt", "a red ball on a black background")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert np.isfinite(json.loads(good.stdout)["frame_pass_rate"])


class _Replay:
    """Stands in for a pipeline: streams given frames in 8-frame chunks with given drift measures,
    so the harness's per-video figures can be checked against a known answer."""

    def __init__(self, frames, distances):
        from types import SimpleNamespace

        from vidgen.pipelines.drift import DriftMeasures

        self.config = SimpleNamespace(generation=SimpleNamespace(fps=16))
        self.chunks = [
            SimpleNamespace(
                frames=frames[i : i + 8],
                start_time=i / 16,
                metrics=SimpleNamespace(drift=DriftMeasures(d, 0.1, False, 0.0, False)),
            )
            for i, d in zip(range(0, len(frames), 8), distances)
        ]

    def stream(self, **kwargs):
        yield from self.chunks


def test_start_and_end_figures_show_a_video_that_degrades():
    scene = world.Scene(
        background="black", color="red", shape="square", size="large", speed="slow", direction="right"
    )
    frames = world.render_clip(scene, 480, size=64, rng=0).frames.copy()  # 30 s
    frames[320:] = 0  # the object is lost for the last 10 s
    distances = [0.1] * 54 + [2.0] * 6  # and the last tenth of the chunks drifts
    prompt = "a large red square moving right on a black background"
    result, _, _ = evaluation.run_video(_Replay(frames, distances), prompt, 30, seed=0)
    assert result.frame_pass_start == 1.0 and result.frame_pass_end == 0.0
    assert abs(result.late_stats_distance - 2.0) < 1e-9
    summary = evaluation.summarize([result])
    assert summary["frame_pass_start"] == 1.0 and summary["frame_pass_end"] == 0.0
