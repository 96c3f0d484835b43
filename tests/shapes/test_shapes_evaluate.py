"""The evaluator: ground truth always adheres; each kind of wrong video is caught."""

from __future__ import annotations

import time

import numpy as np
import pytest

from vidgen.shapes.captions import caption, storyboard_captions
from vidgen.shapes.evaluate import evaluate_video, summarize
from vidgen.shapes.measure import measure_frames
from vidgen.shapes.prompts import PromptSpec
from vidgen.shapes.world import (
    BACKGROUNDS,
    COLORS,
    DIRECTIONS,
    FPS,
    SHAPES,
    SIZES,
    SPEEDS,
    Scene,
    render_clip,
    sample_scene,
    sample_storyboard,
)


def _assert_perfect(report, context=""):
    assert report.adheres, (context, report.failures)
    assert report.frame_pass_rate == 1.0 and report.window_pass_rate == 1.0, (context, report.failures)
    assert report.direction_ok and report.changes_ok and report.failures == {}, (context, report.failures)
    assert report.drift_free_rate == 1.0 and report.drift_free


def test_ground_truth_clips_always_adhere():
    rng = np.random.default_rng(0)
    reports = []
    for i in range(120):
        size = (64, 64, 96, 128)[i % 4]
        scene = sample_scene(rng)
        clip = render_clip(scene, int(rng.integers(16, 72)), size=size, rng=rng)
        report = evaluate_video(clip.frames, scene)
        _assert_perfect(report, (size, scene))
        reports.append(report)
    summary = summarize(reports)
    assert summary["adherence_rate"] == 1.0 and summary["failures"] == {}


def test_every_shape_size_speed_and_direction_at_64_pixels():
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        for size in SIZES:
            for speed in SPEEDS:
                for direction in DIRECTIONS:
                    scene = Scene(
                        str(rng.choice(list(BACKGROUNDS))),
                        str(rng.choice(list(COLORS))),
                        shape,
                        size,
                        speed,
                        direction,
                    )
                    clip = render_clip(scene, 40, size=64, rng=rng)
                    _assert_perfect(evaluate_video(clip.frames, scene), scene)


def test_ground_truth_storyboards_adhere_with_changes_taking_effect_at_once():
    rng = np.random.default_rng(2)
    reports = []
    for i in range(30):
        size = (64, 72, 96)[i % 3]
        board = sample_storyboard(rng, 10, 3, min_segment=(1.0, 2.0)[i % 2])
        clip = render_clip(board, 10 * FPS, size=size, rng=rng)
        report = evaluate_video(clip.frames, board)
        _assert_perfect(report, board)
        assert report.change_latencies == [0.0, 0.0, 0.0]
        reports.append(report)
    summary = summarize(reports)
    assert summary["changes"] == 90 and summary["change_within_1s_rate"] == 1.0
    assert summary["mean_change_latency"] == 0.0


def test_paraphrased_and_held_out_captions_are_judged_like_the_scene():
    rng = np.random.default_rng(3)
    for i in range(12):
        board = sample_storyboard(rng, 6, 2)
        clip = render_clip(board, 6 * FPS, rng=rng)
        captions = storyboard_captions(board, rng, paraphrase=True, held_out=i % 2 == 1)
        _assert_perfect(evaluate_video(clip.frames, captions), captions)
    scene = Scene("beige", "purple", "triangle", "medium", "fast", "down-left")
    clip = render_clip(scene, 32, rng=4)
    _assert_perfect(evaluate_video(clip.frames, caption(scene, rng, held_out=True)))


@pytest.mark.parametrize("new_direction", list(DIRECTIONS))
def test_a_new_direction_next_to_a_wall_counts_from_the_change(new_direction):
    # The object reaches the right wall around the change, so a new direction with a right
    # component bounces at once; the change still takes effect at once and nothing fails.
    for shape, size, speed in (
        ("triangle", "large", "fast"),
        ("circle", "small", "slow"),
        ("square", "medium", "fast"),
    ):
        first = Scene("black", "red", shape, size, speed, "right")
        if new_direction == first.direction:
            continue
        half, step = SIZES[size] / 2, SPEEDS[speed]
        for gap in (-0.05, -0.01, 0.0, 0.01, 0.03, 0.06):  # negative: it already bounced
            board = [(0.0, first), (1.0, first.replace(direction=new_direction))]
            clip = render_clip(board, 48, start=(1 - half - 16 * step - gap, 0.5))
            report = evaluate_video(clip.frames, board)
            segment = report.segments[1]
            context = (shape, size, speed, gap, report.failures)
            assert segment.latency == 0.0 and segment.direction_ok, context
            assert report.frame_pass_rate == 1.0 and all(w.passed for w in report.windows[1:]), context


def _wrong(frames, prompt):
    report = evaluate_video(frames, prompt)
    assert not report.adheres
    return report


@pytest.fixture(scope="module")
def clip_and_scene():
    scene = Scene("gray", "red", "square", "medium", "slow", "left")
    return render_clip(scene, 48, rng=0), scene


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"color": "blue"}, "color"),
        ({"color": "orange"}, "color"),
        ({"shape": "circle"}, "shape"),
        ({"shape": "triangle"}, "area"),  # half the area of the square it shows
        ({"background": "white"}, "background"),
        ({"background": "beige"}, "background"),
        ({"size": "small"}, "area"),
        ({"direction": "right"}, "direction"),
        ({"direction": "up"}, "direction"),
        ({"direction": "up-left"}, "direction"),
        ({"speed": "fast"}, "motion"),
    ],
)
def test_a_video_that_shows_something_else_is_rejected(clip_and_scene, change, reason):
    clip, scene = clip_and_scene
    report = _wrong(clip.frames, scene.replace(**change))
    assert set(report.failures) == {reason}


def test_a_vanishing_object_is_rejected(clip_and_scene):
    clip, scene = clip_and_scene
    frames = clip.frames.copy()
    frames[20:] = BACKGROUNDS[scene.background]
    report = _wrong(frames, scene)
    assert report.failures["no_object"] == 28
    assert report.frames[30].centroid is None and report.frames[10].passed


def test_a_frozen_object_is_rejected(clip_and_scene):
    clip, scene = clip_and_scene
    report = _wrong(np.repeat(clip.frames[:1], 48, axis=0), scene)
    assert report.failures["motion"] == 3 and report.frame_pass_rate == 1.0
    assert all(w.median_speed == 0 for w in report.windows)


def test_a_reversal_mid_screen_is_rejected_but_a_bounce_is_not():
    scene = Scene("white", "green", "circle", "small", "fast", "left")
    turning = render_clip([(0.0, scene), (1.0, scene.replace(direction="right"))], 40, start=(0.6, 0.5))
    report = _wrong(turning.frames, scene)
    assert report.failures == {"reversal": 1}
    (reversal,) = report.reversals
    assert reversal.axis == "x" and reversal.frame == 15 and not reversal.at_wall
    assert not report.windows[0].reversal_ok and report.windows[1].reversal_ok
    # The same turn is fine where the storyboard asks for it, and so is a bounce off a wall.
    assert evaluate_video(turning.frames, turning.storyboard).adheres
    bouncing = render_clip(scene, 48, start=(0.48, 0.5))
    report = evaluate_video(bouncing.frames, scene)
    assert report.adheres and len(report.reversals) == 1 and report.reversals[0].at_wall


def test_change_latency_is_measured_from_the_caption_change():
    first = Scene("black", "red", "circle", "medium", "slow", "down")
    shown = [(0.0, first), (1.5, first.replace(color="blue"))]
    clip = render_clip(shown, 64, start=(0.5, 0.2))
    asked = [(0.0, first), (1.0, first.replace(color="blue"))]
    report = evaluate_video(clip.frames, asked)
    assert report.change_latencies == [0.5] and report.changes_ok and report.adheres
    assert report.segments[1].effect_frame == 24
    # Before it took effect the frames still showed the previous caption, which passes in the transition.
    assert report.frames[20].caption == 0 and report.frames[20].color == "red" and report.frames[20].passed
    assert report.frames[30].caption == 1 and report.frames[30].color == "blue"
    late = render_clip([(0.0, first), (2.5, first.replace(color="blue"))], 64, start=(0.5, 0.2))
    report = evaluate_video(late.frames, asked)
    assert report.change_latencies == [1.5] and not report.changes_ok and not report.adheres
    never = evaluate_video(late.frames[:32], asked)
    assert never.change_latencies == [None] and never.failures["change_latency"] == 1


def test_a_direction_change_that_is_ignored_fails_rule_7():
    first = Scene("black", "yellow", "square", "small", "slow", "right")
    clip = render_clip(first, 48, start=(0.2, 0.5))
    report = _wrong(clip.frames, [(0.0, first), (1.0, first.replace(direction="down"))])
    assert report.segments[1].direction_ok is False and report.segments[1].latency is None


def test_ten_second_windows_measure_drift():
    scene = Scene("beige", "cyan", "triangle", "large", "fast", "up-right")
    clip = render_clip(scene, 30 * FPS, rng=5)
    report = evaluate_video(clip.frames, scene)
    assert [(w.start, w.stop) for w in report.drift_free_windows] == [(0, 160), (160, 320), (320, 480)]
    assert report.drift_free_rate == 1.0 and len(report.windows) == 30
    frames = clip.frames.copy()
    frames[400:] = BACKGROUNDS["beige"]  # the object is lost half way through the last window
    report = evaluate_video(frames, scene)
    assert report.drift_free_rate == pytest.approx(2 / 3) and not report.drift_free
    assert report.frame_pass_rate == 400 / 480 and not report.adheres


def test_windows_partition_each_caption_and_keep_the_remainder():
    scene = Scene("black", "pink", "circle", "large", "slow", "down-right")
    board = [(0.0, scene), (2.5, scene.replace(color="green"))]
    report = evaluate_video(render_clip(board, 75, rng=6).frames, board)
    assert [(w.start, w.stop, w.caption) for w in report.windows] == [
        (0, 16, 0),
        (16, 40, 0),
        (40, 56, 1),
        (56, 75, 1),
    ]


def test_other_frame_rates_scale_the_speeds():
    scene = Scene("gray", "orange", "square", "large", "slow", "up")
    clip = render_clip(scene, 64, rng=7)
    _assert_perfect(evaluate_video(clip.frames[::2], scene, fps=8))
    assert not evaluate_video(clip.frames, scene, fps=8).adheres  # half the speed it should have


def test_measurements_of_a_drawn_frame():
    frame = np.zeros((1, 64, 64, 3), dtype=np.uint8)
    frame[:] = BACKGROUNDS["gray"]
    frame[0, 10:20, 30:46] = COLORS["purple"]
    m = measure_frames(frame)
    np.testing.assert_array_equal(m.background[0], BACKGROUNDS["gray"])
    np.testing.assert_array_equal(m.object_color[0], COLORS["purple"])
    assert m.area[0] == 160 / 64**2 and SHAPES[m.shape_index[0]] == "square"
    np.testing.assert_allclose(m.ious[0, SHAPES.index("square")], 1.0)
    np.testing.assert_allclose(m.centroid[0], [38 / 64, 15 / 64])
    np.testing.assert_allclose(m.extent[0], [16 / 64, 10 / 64])
    empty = measure_frames(np.zeros((1, 64, 64, 3), dtype=np.uint8))
    assert empty.area[0] == 0 and np.isnan(empty.centroid[0]).all() and empty.shape_index[0] == -1


def test_bad_input_is_rejected():
    frames = np.zeros((4, 64, 64, 3), dtype=np.uint8)
    spec = PromptSpec("red", "circle", "black")
    with pytest.raises(ValueError, match="square canvas"):
        evaluate_video(np.zeros((4, 64, 48, 3), dtype=np.uint8), spec)
    with pytest.raises(TypeError, match="uint8"):
        evaluate_video(frames.astype(np.float32), spec)
    with pytest.raises(ValueError, match="start at 0"):
        evaluate_video(frames, [(1.0, spec)])
    with pytest.raises(TypeError, match="pairs"):
        evaluate_video(frames, [spec])


def test_a_ten_minute_video_is_judged_in_well_under_a_minute():
    board = sample_storyboard(np.random.default_rng(8), 600, 20, min_segment=10)
    clip = render_clip(board, 600 * FPS, rng=8)
    start = time.perf_counter()
    report = evaluate_video(clip.frames, board)
    assert time.perf_counter() - start < 30
    _assert_perfect(report)
    assert len(report.drift_free_windows) == 60


def test_shape_right_rate_counts_the_frames_with_the_named_shape(clip_and_scene):
    clip, scene = clip_and_scene
    assert evaluate_video(clip.frames, scene).shape_right_rate == 1.0
    assert evaluate_video(clip.frames, scene.replace(shape="circle")).shape_right_rate == 0.0
    # a storyboard that names a triangle from 1 s on: the frames judged by it have the wrong shape
    board = [(0.0, scene), (1.0, scene.replace(shape="triangle"))]
    report = evaluate_video(clip.frames, board)
    wrong = sum(f.caption == 1 for f in report.frames)
    assert 0 < wrong < len(clip.frames)
    assert report.shape_right_rate == pytest.approx(1 - wrong / len(clip.frames))
    blank = np.zeros_like(clip.frames)
    blank[...] = clip.frames[0, 0, 0]  # the background alone: no object, no shape
    assert evaluate_video(blank, scene).shape_right_rate == 0.0
