"""The Shapes World renderer: colours, areas, motion, bounces, storyboards, determinism."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest

from vidgen.shapes.world import (
    BACKGROUNDS,
    COLORS,
    DIRECTIONS,
    FPS,
    SHAPES,
    SIZES,
    SPEEDS,
    Scene,
    frame_of,
    redraw,
    render_clip,
    sample_scene,
    sample_storyboard,
    shape_area,
    start_range,
)


def _scenes(count: int, seed: int = 0) -> list[Scene]:
    rng = np.random.default_rng(seed)
    return [sample_scene(rng) for _ in range(count)]


def test_tables_match_the_spec():
    assert SIZES == {"small": 0.16, "medium": 0.24, "large": 0.32}
    assert SPEEDS == {"slow": 0.010, "fast": 0.025}
    assert FPS == 16
    assert DIRECTIONS["up"] == (0.0, -1.0)  # toward row 0
    for name, (x, y) in DIRECTIONS.items():
        assert math.hypot(x, y) == pytest.approx(1.0)
        if "-" in name:
            assert abs(x) == pytest.approx(abs(y))
    assert COLORS["red"] == (220, 40, 40) and BACKGROUNDS["beige"] == (230, 215, 180)


@pytest.mark.parametrize("size", [64, 97, 128])
def test_exact_colours_at_the_centre_and_on_the_background(size):
    for i, scene in enumerate(_scenes(24, seed=size)):
        clip = render_clip(scene, 5, size=size, rng=i)
        for t in range(len(clip)):
            col, row = (clip.centers[t] * size).astype(int)
            assert tuple(clip.frames[t, row, col]) == COLORS[scene.color]
            assert clip.masks[t, row, col] == 1.0
            outside = clip.masks[t] == 0
            assert (clip.frames[t][outside] == BACKGROUNDS[scene.background]).all()


@pytest.mark.parametrize("size", [64, 128])
@pytest.mark.parametrize("shape", SHAPES)
def test_rendered_area_matches_the_analytic_area(shape, size):
    for size_name, side in SIZES.items():
        scene = Scene("gray", "blue", shape, size_name, "fast", "down-right")
        clip = render_clip(scene, 12, size=size, rng=3)
        expected = shape_area(shape, side * size)
        np.testing.assert_allclose(clip.masks.sum(axis=(1, 2)), expected, rtol=0.005)
        # Keeping pixels more than half covered keeps the area too (what the evaluator measures).
        np.testing.assert_allclose((clip.masks > 0.5).sum(axis=(1, 2)), expected, rtol=0.1)


def test_shapes_have_the_right_silhouette():
    size = 200
    for shape in SHAPES:
        clip = render_clip(
            Scene("black", "red", shape, "large", "slow", "right"), 1, size=size, start=(0.5, 0.5)
        )
        mask = clip.masks[0] > 0.5
        rows = np.flatnonzero(mask.any(axis=1))
        widths = mask.sum(axis=1)[rows]
        assert rows[-1] - rows[0] + 1 == pytest.approx(0.32 * size, abs=1)
        if shape == "triangle":  # apex up: widths grow from the top row to the base
            assert widths[0] <= 3 and widths[-1] >= 0.32 * size - 2
            assert np.all(np.diff(widths) >= 0)
        elif shape == "square":
            assert np.ptp(widths) == 0
        else:
            assert widths[0] < widths[len(widths) // 2] > widths[-1]


def test_start_rule_gives_a_first_second_without_wall_contact():
    for i, scene in enumerate(_scenes(300, seed=1)):
        clip = render_clip(scene, FPS + 1, rng=i)
        half = scene.side / 2
        np.testing.assert_array_equal(clip.velocity, np.tile(scene.velocity, (FPS + 1, 1)))
        assert np.all(clip.centers >= half) and np.all(clip.centers <= 1 - half)
    # The start positions cover the whole allowed range, up to travel + touching the wall.
    scene = Scene("black", "red", "circle", "large", "fast", "right")
    (x_lo, x_hi), (y_lo, y_hi) = start_range(scene)
    assert x_lo == pytest.approx(0.16) and x_hi == pytest.approx(1 - 0.16 - FPS * 0.025)
    assert (y_lo, y_hi) == pytest.approx((0.16, 0.84))
    xs = np.array([render_clip(scene, 1, rng=i).centers[0, 0] for i in range(400)])
    assert xs.min() < x_lo + 0.02 and xs.max() > x_hi - 0.02


@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("speed", list(SPEEDS))
def test_speed_and_direction_are_exact(direction, speed):
    scene = Scene("white", "green", "square", "medium", speed, direction)
    clip = render_clip(scene, FPS, rng=7)
    steps = np.diff(clip.centers, axis=0)
    expected = np.array(DIRECTIONS[direction]) * SPEEDS[speed]
    np.testing.assert_allclose(steps, np.tile(expected, (FPS - 1, 1)), atol=1e-12)
    np.testing.assert_allclose(np.hypot(*steps.T), SPEEDS[speed], atol=1e-12)
    if "up" in direction:
        assert np.all(steps[:, 1] < 0)  # up is toward row 0


def test_bounces_are_elastic_and_keep_the_object_inside():
    for i, scene in enumerate(_scenes(40, seed=2)):
        clip = render_clip(scene, 20 * FPS, rng=i)
        half = scene.side / 2
        assert np.all(clip.centers >= half - 1e-12) and np.all(clip.centers <= 1 - half + 1e-12)
        # Speed along each axis never changes; only signs flip, and only at a wall.
        np.testing.assert_allclose(
            np.abs(clip.velocity), np.tile(np.abs(scene.velocity), (len(clip), 1)), atol=1e-15
        )
        flips = np.argwhere(np.diff(np.sign(clip.velocity), axis=0) != 0)
        assert len(flips) > 0
        for t, axis in flips:
            pos = clip.centers[t + 1, axis]
            assert min(pos - half, 1 - half - pos) <= abs(scene.velocity[axis]) + 1e-12
        # The whole object stays visible: no coverage is cut by the canvas edge.
        area = shape_area(scene.shape, scene.side * 64)
        np.testing.assert_allclose(clip.masks.sum(axis=(1, 2)), area, rtol=0.03)


def test_storyboard_keeps_the_object_and_changes_only_what_changed():
    first = Scene("black", "red", "circle", "small", "slow", "right")
    board = [
        (0.0, first),
        (1.0, first.replace(color="blue")),
        (2.0, first.replace(color="blue", direction="up", speed="fast")),
        (3.0, first.replace(color="blue", direction="up", speed="fast", background="beige", shape="square")),
    ]
    clip = render_clip(board, 4 * FPS, start=(0.3, 0.9))
    assert clip.starts == (0, 16, 32, 48)
    assert [clip.scene_at(t) for t in (0, 15, 16, 31, 32, 63)] == [board[i][1] for i in (0, 0, 1, 1, 2, 3)]
    steps = np.diff(clip.centers, axis=0)
    # Position continues: every step is the velocity of the frame it leads to.
    np.testing.assert_allclose(steps, clip.velocity[1:], atol=1e-12)
    np.testing.assert_allclose(clip.velocity[:32], np.tile([0.010, 0.0], (32, 1)), atol=1e-15)
    np.testing.assert_allclose(clip.velocity[32:], np.tile([0.0, -0.025], (32, 1)), atol=1e-15)
    # Colour switches exactly at the change frame, background one change later.
    centre = lambda t: tuple(clip.frames[t, int(clip.centers[t, 1] * 64), int(clip.centers[t, 0] * 64)])  # noqa: E731
    assert centre(15) == COLORS["red"] and centre(16) == COLORS["blue"]
    assert tuple(clip.frames[47, 0, 0]) == BACKGROUNDS["black"]
    assert tuple(clip.frames[48, 0, 0]) == BACKGROUNDS["beige"]


def test_speed_change_keeps_a_bounced_direction():
    first = Scene("black", "red", "circle", "small", "fast", "right")
    clip = render_clip([(0.0, first), (2.0, first.replace(speed="slow"))], 3 * FPS, start=(0.5, 0.5))
    before, after = clip.velocity[2 * FPS - 1], clip.velocity[2 * FPS]
    assert before[0] == pytest.approx(-0.025)  # it bounced off the right wall in the first two seconds
    assert after[0] == pytest.approx(-0.010)


def test_size_change_is_clamped_inside_the_canvas():
    first = Scene("black", "red", "square", "small", "slow", "right")
    board = [(0.0, first), (1.0, first.replace(size="large", direction="up"))]
    x_at_wall = 1 - 0.08 - FPS * 0.010  # touches the right wall exactly one second in
    clip = render_clip(board, 2 * FPS, start=(x_at_wall, 0.5))
    assert clip.centers[FPS, 0] == pytest.approx(1 - 0.16)
    assert clip.centers[FPS, 1] == pytest.approx(0.5 - 0.010)
    area = shape_area("square", 0.32 * 64)
    np.testing.assert_allclose(clip.masks[FPS:].sum(axis=(1, 2)), area, rtol=0.03)


def test_render_is_deterministic_from_a_seed():
    board = sample_storyboard(np.random.default_rng(5), 6, 2)
    assert board == sample_storyboard(np.random.default_rng(5), 6, 2)
    a, b = render_clip(board, 40, rng=11), render_clip(board, 40, rng=11)
    np.testing.assert_array_equal(a.frames, b.frames)
    np.testing.assert_array_equal(a.centers, b.centers)
    c = render_clip(board, 40, rng=12)
    assert not np.array_equal(a.centers, c.centers)


def test_sampled_storyboards_obey_their_constraints():
    rng = np.random.default_rng(9)
    for _ in range(50):
        board = sample_storyboard(rng, 12, 3, min_segment=2.5, max_changed=2)
        starts = [frame_of(t) for t, _ in board]
        assert starts[0] == 0 and len(board) == 4
        assert all(b - a >= 2.5 * FPS for a, b in pairwise([*starts, 12 * FPS]))
        for (_, old), (_, new) in pairwise(board):
            assert 1 <= len(old.changed_attributes(new)) <= 2
    only_colour = sample_storyboard(rng, 6, 2, attributes=("color",))
    changed = {a for (_, old), (_, new) in pairwise(only_colour) for a in old.changed_attributes(new)}
    assert changed == {"color"}
    with pytest.raises(ValueError, match="need"):
        sample_storyboard(rng, 4, 3)


def test_invalid_input_is_rejected_with_a_clear_message():
    with pytest.raises(ValueError, match="Scene.color='teal'"):
        Scene("black", "teal", "circle", "small", "slow", "left")
    scene = Scene("black", "red", "circle", "small", "slow", "left")
    with pytest.raises(ValueError, match="start at 0"):
        render_clip([(1.0, scene)], 4)
    with pytest.raises(ValueError, match="increasing"):
        render_clip([(0.0, scene), (0.0, scene)], 4)
    with pytest.raises(ValueError, match="outside"):
        render_clip(scene, 4, start=(0.01, 0.5))


def test_redraw_scale_draws_a_larger_object_about_the_same_centres_cut_at_the_edge():
    """``redraw(scale=k)``: k^2 the area about the same centroid, in one piece cut off at the
    canvas edge (no wrap to the other side); scale 1 gives the clip back; scale <= 0 raises."""
    scene = Scene("black", "red", "square", "small", "slow", "right")
    size = 64
    centred = render_clip(scene, 3, size=size, start=(0.5, 0.5))
    np.testing.assert_array_equal(redraw(centred, scale=1.0), centred.frames)
    big = redraw(centred, scale=2.5)
    for small_frame, big_frame in ((centred.frames[0], big[0]), (centred.frames[2], big[2])):
        small_mask, big_mask = (small_frame != 0).any(-1), (big_frame != 0).any(-1)
        # pixels the object touches: side 10.24 -> 25.6 px, plus at most one partial pixel a side
        assert (10.24**2) <= small_mask.sum() <= (12.24**2)
        assert (25.6**2) <= big_mask.sum() <= (27.6**2)
        for axis in (0, 1):
            small_c = np.nonzero(small_mask)[axis].mean()
            big_c = np.nonzero(big_mask)[axis].mean()
            assert abs(small_c - big_c) < 0.75
    # near the left wall the large copy runs off the canvas there, and nothing appears on the right
    walled = render_clip(scene, 2, size=size, start=(0.09, 0.5))
    edge = (redraw(walled, scale=2.5)[0] != 0).any(-1)
    columns = np.nonzero(edge.any(axis=0))[0]
    assert columns.min() == 0 and columns.max() < size // 2
    with pytest.raises(ValueError, match="scale"):
        redraw(walled, scale=0.0)


def test_redraw_centers_draws_the_object_where_it_was_earlier():
    """``redraw(centers=...)`` with the trajectory delayed by k frames gives, at frame t, exactly the
    clip's frame t - k (frame 0 for the first k); a wrong shape of ``centers`` raises."""
    scene = Scene("gray", "blue", "triangle", "medium", "fast", "down-left")
    clip = render_clip(scene, 24, size=48, rng=4)
    k = 5
    behind = clip.centers[np.maximum(np.arange(24) - k, 0)]
    lagged = redraw(clip, centers=behind)
    np.testing.assert_array_equal(lagged[k:], clip.frames[:-k])
    for t in range(k):
        np.testing.assert_array_equal(lagged[t], clip.frames[0])
    assert not np.array_equal(lagged[k:], clip.frames[k:])  # the object did move
    with pytest.raises(ValueError, match="centers"):
        redraw(clip, centers=behind[:-1])


def test_retrace_draws_frames_masks_and_path_along_new_centres():
    """``retrace`` with the trajectory delayed by k frames gives the clip's frame and coverage mask
    t - k at frame t (frame 0 for the first k), those centres, and their per-frame differences as
    the velocity (zero while the object holds); a wrong shape of ``centers`` raises."""
    from vidgen.shapes.world import retrace

    scene = Scene("black", "green", "circle", "small", "fast", "up-right")
    clip = render_clip(scene, 20, size=48, rng=7)
    k = 4
    delayed = clip.centers[np.maximum(np.arange(20) - k, 0)]
    moved = retrace(clip, delayed)
    np.testing.assert_array_equal(moved.frames, redraw(clip, centers=delayed))
    np.testing.assert_array_equal(moved.masks[k:], clip.masks[:-k])
    np.testing.assert_array_equal(moved.masks[:k], np.broadcast_to(clip.masks[0], moved.masks[:k].shape))
    np.testing.assert_array_equal(moved.centers, delayed)
    np.testing.assert_allclose(moved.velocity[: k + 1], 0.0)  # holding still, frame 0 included
    np.testing.assert_allclose(moved.velocity[1:], np.diff(delayed, axis=0))
    assert np.abs(moved.velocity[k + 1 :]).min() > 0.01  # fast: 0.025 S a frame, 0.018 an axis
    assert moved.scenes == clip.scenes and moved.starts == clip.starts
    with pytest.raises(ValueError, match="centers"):
        retrace(clip, delayed[:-1])
