"""The distillation's frame term: the ideal of a rendered Shapes World frame is that frame (every
shape, named size or not), a wrong shape, a second object or a tinted background costs about its
share of the object's area times the squared contrast, and the gradient reaches the pixels."""

import dataclasses

import numpy as np
import pytest
import torch

from vidgen.shapes import world
from vidgen.shapes.prompts import PromptSpec
from vidgen.training import ideal, motion
from vidgen.training.data import clips_to_tensor

SIZE = 64


def _frames(scene: world.Scene, start=(0.4, 0.45), frames: int = 5) -> np.ndarray:
    return world.render_clip(scene, frames, size=SIZE, start=start).frames


def _penalty(frames: np.ndarray, spec: PromptSpec, pixels: torch.Tensor | None = None) -> torch.Tensor:
    pixels = clips_to_tensor([frames]) if pixels is None else pixels
    track = motion.soft_track(pixels, motion.background_colors([spec]))
    return ideal.frame_penalty(pixels, [spec], track, track.present)


def _spec(scene: world.Scene, named_size: bool = True) -> PromptSpec:
    return PromptSpec(scene.color, scene.shape, scene.background, size=scene.size if named_size else None)


def test_draw_path_draws_what_render_clip_draws():
    scene = world.Scene("beige", "blue", "triangle", "large", "fast", "up-left")
    clip = world.render_clip(scene, 6, size=SIZE, rng=3)
    frames, masks = world.draw_path(scene, clip.centers, SIZE)
    np.testing.assert_array_equal(frames, clip.frames)
    np.testing.assert_array_equal(masks, clip.masks)
    # another side: the coverage's area follows it
    _, small = world.draw_path(scene, clip.centers, SIZE, side=0.16)
    assert small.sum(axis=(1, 2)) / SIZE**2 == pytest.approx(world.shape_area("triangle", 0.16), rel=0.02)


@pytest.mark.parametrize("shape", world.SHAPES)
@pytest.mark.parametrize("named_size", [True, False])
def test_a_rendered_frame_is_its_own_ideal(shape, named_size):
    scene = world.Scene("gray", "orange", shape, "medium", "slow", "down")
    frames = _frames(scene)
    pixels = clips_to_tensor([frames])
    track = motion.soft_track(pixels, motion.background_colors([_spec(scene)]))
    drawn, sides = ideal.ideal_frames(pixels, [_spec(scene, named_size)], track)
    # unnamed: from the hard mask, which counts whole pixels (a 15.4-pixel square is 15 wide)
    assert float(sides[0]) == pytest.approx(0.24, abs=1 / SIZE)
    # named: the same drawing up to the centroid's sub-pixel bias on edge pixels; unnamed, the side
    # may be a pixel short, which moves the edges by up to half a pixel's contrast
    assert float((drawn - pixels).abs().max()) < (0.2 if named_size else 0.5)
    # against 0.01-0.1 for frames through the autoencoder and 0.3-2 for a wrong shape (measured)
    assert float(_penalty(frames, _spec(scene, named_size))) < (0.003 if named_size else 0.02)


@pytest.mark.parametrize(
    "shape, other", [("circle", "square"), ("square", "triangle"), ("triangle", "circle")]
)
def test_a_wrong_shape_costs_the_mismatched_area_times_the_contrast(shape, other):
    scene = world.Scene("black", "red", shape, "large", "slow", "left")
    frames = _frames(scene)
    right = float(_penalty(frames, _spec(scene)))
    wrong = float(_penalty(frames, dataclasses.replace(_spec(scene), shape=other)))
    contrast = float(np.sum((np.array(world.COLORS["red"]) / 127.5) ** 2))  # red on black, squared
    # circle vs square: the corners, 1 - pi/4 of the square; the triangle's against the others more
    assert wrong > 0.15 * contrast > 100 * right


def test_a_second_object_and_a_tinted_background_cost():
    scene = world.Scene("white", "green", "circle", "small", "slow", "right")
    frames = _frames(scene)
    base = float(_penalty(frames, _spec(scene)))
    two = frames.copy()
    two[:, 5:12, 50:57] = world.COLORS["green"]  # a 7x7 second blob in a corner
    assert float(_penalty(two, _spec(scene))) > base + 0.5
    tinted = frames.astype(np.int16)
    tinted[(tinted == 255).all(axis=-1)] = (235, 235, 255)
    assert float(_penalty(tinted.astype(np.uint8), _spec(scene))) > base + 1.0


def test_the_frame_term_reaches_the_pixels():
    scene = world.Scene("black", "red", "square", "medium", "slow", "left")
    frames = _frames(scene)
    pixels = clips_to_tensor([frames]).requires_grad_(True)
    _penalty(frames, dataclasses.replace(_spec(scene), shape="circle"), pixels).backward()
    grad = pixels.grad
    assert grad is not None
    # the square's corners outside the inscribed circle are pushed toward the background
    corner = grad[0, 0, 0, int(0.45 * SIZE - 0.12 * SIZE) + 1, int(0.4 * SIZE - 0.12 * SIZE) + 1]
    assert float(corner) > 0


def test_frames_without_the_object_cost_its_area_when_judged():
    """A frame the track finds no object in: its ideal is the object where the nearest frame that
    shows one has it; judged (``frame_absent``) it costs about the object's area times the squared
    contrast, not judged nothing."""
    scene = world.Scene("black", "yellow", "square", "medium", "slow", "right")
    spec = _spec(scene)
    frames = _frames(scene, frames=6).copy()
    frames[2:4] = frames[0, 0, 0]  # the object gone from frames 2 and 3 (the background's colour)
    pixels = clips_to_tensor([frames])
    track = motion.soft_track(pixels, motion.background_colors([spec]))
    assert track.present[0].tolist() == [True, True, False, False, True, True]
    drawn, _ = ideal.ideal_frames(pixels, [spec], track)
    torch.testing.assert_close(drawn[:, :, 2], drawn[:, :, 1])  # frame 2's nearest showing one: 1
    torch.testing.assert_close(drawn[:, :, 3], drawn[:, :, 4])  # frame 3's: 4
    present_only = ideal.frame_penalty(pixels, [spec], track, track.present)
    every = ideal.frame_penalty(pixels, [spec], track, torch.ones_like(track.present))
    assert float(present_only) < 0.02  # rendered frames are their own ideal
    contrast = float(
        np.sum(
            (np.asarray(world.COLORS["yellow"]) / 127.5 - np.asarray(world.BACKGROUNDS["black"]) / 127.5) ** 2
        )
    )
    assert float(every) == pytest.approx((4 * float(present_only) + 2 * contrast) / 6, rel=0.1)
    # no frame shows it: the ideal object sits at the canvas centre
    blank = np.repeat(frames[2:3], 3, axis=0)
    pixels = clips_to_tensor([blank])
    track = motion.soft_track(pixels, motion.background_colors([spec]))
    drawn, _ = ideal.ideal_frames(pixels, [spec], track)
    centre = motion.soft_track(drawn, motion.background_colors([spec])).centroid
    torch.testing.assert_close(centre, torch.full_like(centre, 0.5), atol=0.5 / SIZE, rtol=0)
