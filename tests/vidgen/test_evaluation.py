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
