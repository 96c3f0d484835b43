"""The world's continuation of a generated video: it continues a true clip as the world does, and
turns a stalled, wrongly turned or wrongly shaped object back to what the prompt asks."""

from __future__ import annotations

import numpy as np
import pytest

from vidgen.shapes import captions
from vidgen.shapes.correction import continuation, heading
from vidgen.shapes.measure import measure_frames
from vidgen.shapes.prompts import PromptSpec, parse_prompt
from vidgen.shapes.world import SIZES, SPEEDS, Scene, redraw, render_clip, retrace, sample_scene

SIZE = 64


def _spec(scene: Scene, **left_out: None) -> PromptSpec:
    named = {a: getattr(scene, a) for a in ("color", "shape", "background", "size", "speed", "direction")}
    return PromptSpec(**{**named, **left_out})


def test_a_true_clip_continues_as_the_world_renders_it():
    """Cut 200 rendered clips (paraphrased captions: sizes, speeds and directions left out too) at a
    random frame, bounces included: the continuation's object follows the clip's own path. The
    errors left are a bounce on the cut's frame itself (which way it went is not yet visible)."""
    rng = np.random.default_rng(0)
    errors = []
    for _ in range(200):
        scene = sample_scene(rng)
        clip = render_clip(scene, 90, size=SIZE, rng=rng)
        spec = parse_prompt(captions.caption(scene, rng, paraphrase=True))
        cut = int(rng.integers(9, 82))
        found = continuation(clip.frames[:cut], spec, scene, 8)
        assert found is not None and found.scene.shape == scene.shape and found.scene.color == scene.color
        errors.append(np.abs(found.clip.centers - clip.centers[cut : cut + 8]).max() * SIZE)
    # pixels: a triangle placed by its centroid without the sixth-of-a-side offset is 1.3-2.7 off
    # in every frame, a missed bounce 5-25 px
    assert np.median(errors) < 0.3 and np.percentile(errors, 95) < 1.0 and max(errors) < 3.0, sorted(errors)[
        -5:
    ]


def test_a_stalled_object_sets_off_the_way_the_prompt_names():
    scene = Scene("black", "red", "square", "medium", "fast", "up-left")
    clip = render_clip(scene, 24, size=SIZE, start=(0.5, 0.6))
    held = retrace(clip, np.repeat(clip.centers[:1], len(clip), axis=0))  # it never moved
    found = continuation(held.frames, _spec(scene), scene, 8)
    assert found is not None and found.scene.direction == "up-left"
    np.testing.assert_allclose(found.start, (0.5, 0.6), atol=1 / SIZE)
    steps = np.diff(found.clip.centers, axis=0)
    np.testing.assert_allclose(steps, np.tile(scene.velocity, (7, 1)), atol=1e-9)


def _along(scene: Scene, x: np.ndarray, y: float = 0.5):
    """``scene``'s object drawn at ``x`` (one per frame) on the row ``y``."""
    path = np.stack([x, np.full(len(x), y)], axis=1)
    return retrace(render_clip(scene, len(x), size=SIZE, start=(0.5, 0.5)), path)


def test_the_way_it_moves_is_kept_and_a_stall_sets_off_the_way_named():
    """A turn away from the walls has happened: turning back again would be a second reversal, so
    the object goes on the way it moves. Stalled after that turn, it sets off the way the prompt
    names (the turn was no bounce)."""
    scene = Scene("white", "blue", "circle", "small", "slow", "right")
    turned = np.concatenate([0.5 + 0.01 * np.arange(12), 0.61 - 0.01 * np.arange(1, 13)])
    found = continuation(_along(scene, turned).frames, _spec(scene), scene, 4)
    assert found is not None and found.scene.direction == "left"
    np.testing.assert_allclose(np.diff(found.clip.centers[:, 0]), -SPEEDS["slow"], atol=1e-9)
    stalled = np.concatenate([turned, np.full(10, turned[-1])])
    found = continuation(_along(scene, stalled).frames, _spec(scene), scene, 4)
    assert found is not None and found.scene.direction == "right"


def test_a_bounce_is_followed_moving_or_stalled():
    scene = Scene("white", "blue", "circle", "small", "slow", "right")
    start = 1 - SIZES["small"] / 2 - 0.1
    bounced = render_clip(scene, 24, size=SIZE, start=(start, 0.5))
    assert bounced.velocity[-1, 0] < 0  # it did bounce, at frame 10
    found = continuation(bounced.frames, _spec(scene), scene, 4)
    assert found is not None and found.scene.direction == "left"
    np.testing.assert_allclose(
        found.clip.centers[0, 0], bounced.centers[-1, 0] - SPEEDS["slow"], atol=1 / SIZE
    )
    # stalled after the bounce: it sets off the way the bounce sent it, not the named way
    x = np.concatenate([bounced.centers[:, 0], np.full(10, bounced.centers[-1, 0])])
    found = continuation(_along(scene, x).frames, _spec(scene), scene, 4)
    assert found is not None and found.scene.direction == "left"
    # a bounce in the last frames: the slope over them still points at the wall, the bounce wins
    fast = scene.replace(speed="fast")
    hit = render_clip(fast, 30, size=SIZE, start=(1 - SIZES["small"] / 2 - 0.025 * 27.5, 0.5))
    assert hit.velocity[-2, 0] < 0 < hit.velocity[-3, 0]  # turned at the last frame but one
    found = continuation(hit.frames, _spec(fast), fast, 4)
    assert found is not None and found.scene.direction == "left"


def test_an_axis_the_prompt_leaves_still_stays_still():
    scene = Scene("black", "green", "square", "medium", "slow", "left")
    x = 0.7 - 0.01 * np.arange(20)
    path = np.stack([x, 0.4 + 0.004 * np.arange(20)], axis=1)  # drifting down as well
    drifting = retrace(render_clip(scene, 20, size=SIZE, start=(0.5, 0.5)), path)
    found = continuation(drifting.frames, _spec(scene), scene, 4)
    assert found is not None and found.scene.direction == "left"
    np.testing.assert_allclose(np.diff(found.clip.centers[:, 1]), 0.0, atol=1e-12)


def test_a_wrong_shape_is_redrawn_with_the_centroid_where_it_was():
    """The prompt asks for a triangle, the video drew a circle: the continuation draws a triangle
    whose mask centroid (what the evaluator follows) goes on from the circle's by one step."""
    scene = Scene("gray", "green", "triangle", "large", "slow", "down")
    clip = render_clip(scene, 17, size=SIZE, start=(0.4, 0.4))
    circle = redraw(clip, shape="circle")
    found = continuation(circle, _spec(scene), scene, 4)
    assert found is not None and found.scene.shape == "triangle"
    before, after = measure_frames(circle), measure_frames(found.clip.frames)
    assert SIZES["large"] / 6 * SIZE > 2  # the offset this checks is more than two pixels
    assert np.argmax(after.ious[0]) == 2  # drawn as a triangle
    step = after.centroid[0] - before.centroid[-1]
    np.testing.assert_allclose(step, (0.0, SPEEDS["slow"]), atol=0.6 / SIZE)


def test_open_attributes_come_from_what_the_video_shows():
    """A prompt without a size or direction: the size nearest the drawn area, the heading the video
    shows (here up-right, against the scene's down); with neither shown, the scene's direction."""
    scene = Scene("beige", "pink", "circle", "large", "slow", "up-right")
    clip = render_clip(scene, 20, size=SIZE, start=(0.4, 0.6))
    spec = _spec(scene, size=None, direction=None)
    fallback = scene.replace(size="small", direction="down")
    found = continuation(clip.frames, spec, fallback, 4)
    assert found is not None and found.scene.size == "large" and found.scene.direction == "up-right"
    still = retrace(clip, np.repeat(clip.centers[:1], len(clip), axis=0))
    assert heading(spec, measure_frames(still.frames), "down") == "down"


def test_nothing_to_continue_without_an_object():
    scene = Scene("black", "red", "circle", "small", "slow", "left")
    blank = np.zeros((12, SIZE, SIZE, 3), dtype=np.uint8)
    assert continuation(blank, _spec(scene), scene, 4) is None


@pytest.mark.parametrize("direction", ["up", "down-left"])
def test_the_continuation_is_a_world_clip(direction):
    """Frames, masks and centres agree with the renderer's own clip from the continuation's start."""
    scene = Scene("black", "yellow", "square", "small", "fast", direction)
    clip = render_clip(scene, 13, size=SIZE, start=(0.5, 0.5))
    found = continuation(clip.frames, _spec(scene), scene, 6)
    assert found is not None
    again = render_clip(found.scene, 7, size=SIZE, start=found.start)
    np.testing.assert_array_equal(found.clip.frames, again.frames[1:])
    np.testing.assert_allclose(found.clip.centers, again.centers[1:])


def test_an_object_lost_in_the_last_frames_goes_on_from_its_last_sighting():
    scene = Scene("black", "cyan", "circle", "medium", "fast", "right")
    clip = render_clip(scene, 16, size=SIZE, start=(0.3, 0.5))
    frames = clip.frames.copy()
    frames[-2:] = 0  # gone for the last two frames
    found = continuation(frames, _spec(scene), scene, 4)
    assert found is not None
    # where the world had it at the last frame, two steps on from the last sighting
    np.testing.assert_allclose(found.start, clip.centers[-1], atol=0.5 / SIZE)
    frames[-4:] = 0
    assert continuation(frames, _spec(scene), scene, 4) is None  # gone for all of the last TAIL


def test_without_a_named_direction_a_bounce_is_followed_too():
    """Bounced six frames before the end, still in the bounce zone: through the V the fitted line's
    slope is about nil, and the scene's direction (right) would be taken."""
    scene = Scene("gray", "red", "square", "small", "slow", "right")
    bounced = render_clip(scene, 30, size=SIZE, start=(1 - SIZES["small"] / 2 - 0.01 * 23.5, 0.5))
    assert bounced.velocity[-6, 0] < 0 < bounced.velocity[-7, 0]
    found = continuation(bounced.frames, _spec(scene, direction=None), scene, 4)
    assert found is not None and found.scene.direction == "left"
