"""The evaluation harness and ``vidgen eval``: generated videos are judged, MP4 files are judged."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

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
    assert set(report) == {"short", "storyboards", "long", "long_no_anchor", "per_video"}
    assert (tmp_path / "long_000.png").is_file()
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["long"]["videos"] == 1
    # one record per video and set, carrying what the summaries average
    videos = written["per_video"]
    assert {k: len(v) for k, v in videos.items()} == {
        "short": 1, "storyboard": 1, "long": 1, "long_no_anchor": 1
    }  # fmt: skip
    for name, summary in (("short", "short"), ("storyboard", "storyboards"), ("long", "long")):
        assert videos[name][0]["frame_pass_rate"] == written[summary]["frame_pass_rate"]
        assert "drift" not in videos[name][0]
    assert videos["storyboard"][0]["prompt"][1] == [1.0, "a blue circle moving left on a black background"]
    # the same videos compare to themselves with no difference
    same = evaluation.compare_reports([tmp_path], [tmp_path / "report.json"])
    assert same["frame_pass_rate"]["mean_difference"] == 0.0 and same["frame_pass_rate"]["pairs"] == 4


def _report(
    frames_by_video: dict[tuple[str, int], float], shape: float = 0.5, direction: bool = False
) -> dict:
    return {
        "per_video": {
            "short": [
                {"prompt": prompt, "seed": seed, "seconds": 8.0, "frame_pass_rate": rate,
                 "shape_right_rate": shape, "window_pass_rate": 0.5, "direction_ok": direction and seed > 0,
                 "adheres": False}
                for (prompt, seed), rate in frames_by_video.items()
            ]
        }
    }  # fmt: skip


def test_compare_reports_pairs_videos_by_prompt_and_seed(tmp_path):
    """The paired difference is the mean of per-video differences over the videos both sides have
    (matched by prompt and seed, whatever their order), with its standard error; pooled reports
    add their videos; nothing in common is an error, in one line from the CLI."""
    base = _report({("a", 0): 0.2, ("b", 1): 0.9, ("c", 2): 0.5, ("only base", 3): 0.0})
    new = _report(
        {("c", 2): 0.6, ("a", 0): 0.5, ("b", 1): 0.9, ("only new", 4): 1.0}, shape=0.75, direction=True
    )
    result = evaluation.compare_reports([base], [new])
    d = np.array([0.3, 0.0, 0.1])
    row = result["frame_pass_rate"]
    assert row["pairs"] == 3
    assert abs(row["mean_difference"] - d.mean()) < 1e-12
    assert abs(row["standard_error"] - d.std(ddof=1) / np.sqrt(3)) < 1e-12
    assert abs(result["shape_right_rate"]["mean_difference"] - 0.25) < 1e-12
    assert result["shape_right_rate"]["standard_error"] == 0.0
    assert abs(result["direction_ok"]["mean_difference"] - 2 / 3) < 1e-12  # rule 7 now holds for b and c
    # another set, pooled: the same prompt and seed in another set is another video
    more_base = {"per_video": {"B": _report({("a", 0): 0.0})["per_video"]["short"]}}
    more_new = {"per_video": {"B": _report({("a", 0): 1.0})["per_video"]["short"]}}
    pooled = evaluation.compare_reports([base, more_base], [new, more_new])["frame_pass_rate"]
    assert pooled["pairs"] == 4 and abs(pooled["mean_difference"] - (0.4 + 1.0) / 4) < 1e-12
    with pytest.raises(ValueError, match="share no video"):
        evaluation.compare_reports([base], [_report({("z", 9): 1.0})])
    with pytest.raises(ValueError, match="per-video"):
        evaluation.compare_reports([{"short": {}}], [new])
    # the CLI: two folders (or files, joined by commas) and a table
    for name, report in (("base", base), ("new", new), ("other", _report({("z", 9): 1.0}))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps(report))
    cli = _eval_cli("--compare", tmp_path / "base", tmp_path / "new", "--out-dir", tmp_path / "cmp")
    assert cli.returncode == 0, cli.stderr
    assert "paired over 3 videos" in cli.stdout and "+13.3 +-" in cli.stdout and "+66.7 +-" in cli.stdout
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["frame_pass_rate"]["pairs"] == 3
    bad = _eval_cli("--compare", tmp_path / "base", tmp_path / "other")
    assert bad.returncode == 2 and "share no video" in bad.stderr and "Traceback" not in bad.stderr


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
