"""The distillation's motion terms on rendered Shapes World clips: the soft centroid is the object's
centre, straight motion away from the walls costs nothing, a reversal mid-canvas costs the
square of the velocity change, a bounce off a wall costs nothing, the wrong speed costs the
square of the difference, and the centroid carries the pixels' gradient."""

import math

import numpy as np
import pytest
import torch

from vidgen.shapes import world
from vidgen.shapes.prompts import PromptSpec
from vidgen.training import motion
from vidgen.training.data import clips_to_tensor

SIZE = 64


def _clip(scene: world.Scene, frames: int, start: tuple[float, float]) -> world.Clip:
    return world.render_clip(scene, frames, size=SIZE, start=start)


def _track(frames: np.ndarray, background: str) -> motion.SoftTrack:
    pixels = clips_to_tensor([frames])  # (1, 3, T, S, S) in [-1, 1]
    spec = PromptSpec(color="red", shape="square", background=background)
    return motion.soft_track(pixels, motion.background_colors([spec]))


def _penalties(track: motion.SoftTrack, axis_speed: tuple[float, float], lag: int = 2):
    return motion.motion_penalties(track, torch.tensor([axis_speed]), torch.tensor([True]), lag)


@pytest.mark.parametrize("shape, background", [("square", "black"), ("circle", "beige"), ("square", "gray")])
def test_soft_centroid_is_the_objects_centre(shape, background):
    scene = world.Scene(background, "purple", shape, "medium", "fast", "down-right")
    clip = _clip(scene, 12, (0.3, 0.3))
    track = _track(clip.frames, background)
    assert bool(track.present.all())
    # within a quarter pixel of the exact centre: the noise floor weighs a partly covered edge pixel
    # less than its coverage, most at the weakest contrast (purple on gray: 0.16 px measured)
    np.testing.assert_allclose(track.centroid[0].numpy(), clip.centers, atol=0.25 / SIZE)
    # half the extent: d/2 exactly for a square's flat profile, the disc's sqrt(3)/4 d by the same formula
    expected = scene.side / 2 if shape == "square" else math.sqrt(3) * scene.side / 4
    np.testing.assert_allclose(track.half_extent[0].numpy(), expected, rtol=0.05)


def test_no_object_is_not_present():
    blank = np.zeros((5, SIZE, SIZE, 3), np.uint8)
    assert not bool(_track(blank, "black").present.any())


def test_straight_motion_at_the_named_speed_costs_nothing():
    scene = world.Scene("black", "red", "square", "small", "fast", "down-right")
    clip = _clip(scene, 13, (0.3, 0.3))  # 12 frames at 0.0177 per axis: clear of the walls throughout
    v = world.SPEEDS["fast"] / math.sqrt(2)
    constant, speed = _penalties(_track(clip.frames, "black"), (v, v))
    # rendering's sub-pixel bias only (a slow object's reversal costs 4 at the turn)
    assert float(constant) < 0.01 and float(speed) < 0.01
    # the same clip captioned slow: the speed term costs (fast - slow)^2 / slow^2 on both axes
    slow = world.SPEEDS["slow"] / math.sqrt(2)
    _, wrong = _penalties(_track(clip.frames, "black"), (slow, slow))
    expected = ((v - slow) / world.SPEEDS["slow"]) ** 2
    assert float(wrong) == pytest.approx(expected, rel=0.05)  # the sub-pixel bias: +2 % measured
    # a still object: the constant-velocity term is content, the speed term is not
    still = np.repeat(clip.frames[:1], 13, axis=0)
    constant, speed = _penalties(_track(still, "black"), (v, v))
    assert float(constant) < 1e-6 and float(speed) == pytest.approx((v / world.SPEEDS["slow"]) ** 2, rel=0.01)


def test_a_reversal_mid_canvas_costs_the_velocity_change():
    scene = world.Scene("black", "red", "square", "small", "fast", "right")
    clip = _clip(scene, 7, (0.4, 0.5))
    frames = np.concatenate([clip.frames, clip.frames[-2::-1]])  # right for 6 frames, then back
    constant, _ = _penalties(_track(frames, "black"), (world.SPEEDS["fast"], 0.0))
    # x: the one triple centred on the turn has d2 = -2 v * lag (in units of slow * lag: -2 v / slow);
    # its neighbours half that; y is still: mean over the judged entries of both axes
    v = world.SPEEDS["fast"] / world.SPEEDS["slow"]
    triples = len(frames) - 4
    expected = ((2 * v) ** 2 + 2 * v**2) / (2 * triples)
    assert float(constant) == pytest.approx(expected, rel=0.05)


def test_a_bounce_off_a_wall_is_not_judged(monkeypatch):
    scene = world.Scene("black", "red", "square", "small", "fast", "right")
    half = scene.side / 2
    # starts 0.1 from the right wall: it bounces within the clip, in the wall's margin
    clip = world.render_clip(scene, 13, size=SIZE, start=(1 - half - 0.1, 0.5))
    assert np.sign(clip.velocity[0, 0]) != np.sign(clip.velocity[-1, 0])
    constant, speed = _penalties(_track(clip.frames, "black"), (world.SPEEDS["fast"], 0.0))
    assert float(constant) < 0.01 and float(speed) < 0.01
    # the same reversal with the walls' margin taken away is judged and costs
    monkeypatch.setattr(motion, "WALL_MARGIN", -1.0 - 2 * motion.FAST)
    constant, _ = _penalties(_track(clip.frames, "black"), (world.SPEEDS["fast"], 0.0))
    assert float(constant) > 1.0


def test_the_centroid_carries_the_pixels_gradient():
    scene = world.Scene("black", "red", "square", "small", "fast", "right")
    clip = _clip(scene, 9, (0.4, 0.5))
    pixels = clips_to_tensor([np.concatenate([clip.frames[:5], clip.frames[4::-1]])]).requires_grad_(True)
    spec = PromptSpec(color="red", shape="square", background="black")
    track = motion.soft_track(pixels, motion.background_colors([spec]))
    constant, _ = motion.motion_penalties(track, torch.zeros(1, 2), torch.tensor([False]), 2)
    constant.backward()
    grad = pixels.grad
    assert grad is not None and float(grad.abs().max()) > 0
    # only pixels away from the background by more than the noise floor move the centroid
    far = (pixels.detach() + 1).square().sum(dim=1).sqrt() > motion.NOISE_FLOOR
    assert float(grad.abs().sum(dim=1)[~far].max()) == 0.0


def test_named_axis_speed():
    assert motion.named_axis_speed(PromptSpec("red", "circle", "black", direction="left")) == (0.01, 0.0)
    fast = motion.named_axis_speed(PromptSpec("red", "circle", "black", speed="fast", direction="up-right"))
    assert fast == pytest.approx((0.025 / math.sqrt(2),) * 2)
    assert motion.named_axis_speed(PromptSpec("red", "circle", "black")) is None


def test_the_still_term_judges_a_sideways_wobble():
    """``still_penalty``: on the axis a caption leaves still, the 5-frame average displacement in
    units of rule 8's 0.002 S a frame, beyond half of it, squared; straight motion costs nothing,
    and a wobble costs exactly that on the still axis only."""
    assert motion.still_axes(PromptSpec("red", "square", "black", direction="right")) == (False, True)
    assert motion.still_axes(PromptSpec("red", "square", "black", direction="up")) == (True, False)
    assert motion.still_axes(PromptSpec("red", "square", "black", direction="up-left")) == (False, False)
    assert motion.still_axes(PromptSpec("red", "square", "black")) == (False, False)
    scene = world.Scene("black", "red", "square", "small", "slow", "right")
    clip = _clip(scene, 16, (0.3, 0.5))
    track = _track(clip.frames, "black")
    y_still = torch.tensor([[False, True]])
    assert float(motion.still_penalty(track, y_still)) < 1e-6  # rendered on its line: no sideways motion
    # the same clip wobbling sideways by whole pixels (the object stays clear of the edges)
    rows = np.array([0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 1, 1, 0, 0, -1, -1])
    wobble = np.stack([np.roll(frame, shift, axis=0) for frame, shift in zip(clip.frames, rows)])
    track = _track(wobble, "black")
    average = (rows[5:] - rows[:-5]) / SIZE / (5 * 0.002)
    expected = np.mean(np.maximum(np.abs(average) - 0.5, 0.0) ** 2)
    assert expected > 0.5
    assert float(motion.still_penalty(track, y_still)) == pytest.approx(expected, rel=1e-3)
    # marked still, x (moving at the slow speed) would cost (0.01 / 0.002 - 0.5)^2; unmarked, nothing
    moving = (world.SPEEDS["slow"] / 0.002 - 0.5) ** 2
    assert float(motion.still_penalty(track, torch.tensor([[True, False]]))) == pytest.approx(
        moving, rel=0.03
    )
    assert float(motion.still_penalty(track, torch.tensor([[False, False]]))) == 0.0


def _wall(frames: np.ndarray, spec: PromptSpec, pixels: torch.Tensor | None = None) -> torch.Tensor:
    pixels = clips_to_tensor([frames]) if pixels is None else pixels
    track = motion.soft_track(pixels, motion.background_colors([spec]))
    speed = motion.named_axis_speed(spec)
    return motion.wall_penalty(track, torch.tensor([speed or (0.0, 0.0)]), torch.tensor([speed is not None]))


@pytest.mark.parametrize(
    "shape, speed, direction",
    [
        ("square", "slow", "down-left"),
        ("circle", "fast", "up"),
        ("triangle", "slow", "up-left"),
        ("triangle", "slow", "down"),
        ("circle", "slow", "right"),
    ],
)
def test_the_wall_term_lets_the_worlds_bounces_be(shape, speed, direction):
    """``wall_penalty``: the world's own clips, bounces included, cost nothing, slow diagonals (the
    least travel after a contact) and triangles (whose tip is its reach on one side) too."""
    scene = world.Scene("black", "red", shape, "small", speed, direction)
    # 0.05 short of the walls it heads for: it bounces off them within the clip
    half = scene.side / 2
    near = [
        0.5 if d == 0 else (1 - half - 0.05 if d > 0 else half + 0.05) for d in world.DIRECTIONS[direction]
    ]
    clip = world.render_clip(scene, 48, size=SIZE, start=(near[0], near[1]))
    spec = PromptSpec("red", shape, "black", speed=speed, direction=direction)
    track = _track(clip.frames, "black")
    assert bool((np.diff(np.sign(clip.velocity), axis=0) != 0).any())  # it bounces
    assert int((track.gap <= motion.WALL_TOUCH).sum()) >= 1  # and touches: the term has entries to judge
    assert float(_wall(clip.frames, spec)) == 0.0


def test_the_wall_term_costs_an_object_held_at_a_wall():
    """Pressed against the wall it should have bounced off, the object costs 1 an entry; pushed on
    into it, more; on an axis the caption leaves still, or under a caption naming no direction,
    nothing. The gradient reaches the later frames only."""
    scene = world.Scene("black", "red", "square", "small", "slow", "down")
    half = scene.side / 2
    clip = world.render_clip(scene, 12, size=SIZE, start=(0.5, 1 - half))
    held = world.retrace(clip, np.repeat([[0.5, 1 - half]], 12, axis=0))
    spec = PromptSpec("red", "square", "black", speed="slow", direction="down")
    track = _track(held.frames, "black")
    np.testing.assert_allclose(track.gap[0, :, 1, 1].numpy(), 0.0)  # touches the bottom wall
    assert bool((track.gap[0, :, 0, :] > 0.3).all())  # and no side wall
    assert float(_wall(held.frames, spec)) == pytest.approx(1.0, abs=1e-6)
    # still coming in at the named speed, by a pixel a frame: clipped by the wall, it goes nowhere
    # and then the centroid moves on into the wall: away is negative, the shortfall more than 1
    pushed = world.retrace(clip, np.stack([np.full(12, 0.5), 1 - half + np.arange(12) / SIZE], axis=1))
    assert float(_wall(pushed.frames, spec)) > 1.5
    # the same held clip captioned "moving right" (y still), and with no direction named
    assert float(_wall(held.frames, PromptSpec("red", "square", "black", direction="right"))) == 0.0
    assert float(_wall(held.frames, PromptSpec("red", "square", "black"))) == 0.0
    pixels = clips_to_tensor([held.frames]).requires_grad_(True)
    _wall(held.frames, spec, pixels).backward()
    assert pixels.grad is not None
    per_frame = pixels.grad.abs().sum(dim=(0, 1, 3, 4))
    lag = motion.WALL_LAG
    assert float(per_frame[: 12 - lag].max()) == 0.0  # the touching frames' centroids are detached
    assert bool((per_frame[lag:] > 0).all())
