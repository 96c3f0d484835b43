"""The world's own continuation of a generated video: what Shapes World would show next.

A generated video drifts from what its prompt asked for: the object slows, turns away from a wall,
changes shape. Given what a generated video shows so far (measured as the evaluator measures it)
and the prompt, :func:`continuation` renders the next frames as the world would: the prompt's
object, from where the video left it, at the prompt's speed, with the prompt's shape, colour and
size (for a size the prompt leaves open, the one the video shows), on the lawful path nearest the
one the video drew (:func:`heading`: on the way it moves, or, where it stalls, the way the prompt
names after the bounces its path made). ``vidgen train distill --correction-weight`` trains a
model on its own rollouts with these frames as the target, to return to the prompt from its own
errors rather than carry them on (on the default model it cost 1-s windows: the training log's (docs/default-model-training-log.md)
stop-39 pilot). Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vidgen.shapes.measure import FrameMeasurements, measure_frames
from vidgen.shapes.motion import bounce_zones, displacements, named_signs
from vidgen.shapes.prompts import PromptSpec
from vidgen.shapes.world import DEFAULT_SPEED, DIRECTIONS, SIZES, SPEEDS, Clip, Scene, render_clip, shape_area

TAIL = 4
"""The last frames of the video searched for the object (its last sighting is where it continues)."""
CLEAR = 0.35
"""An axis counts as moving from this fraction of the speed on (a measured centroid wobbles by a
fraction of a pixel on an axis the object does not move along)."""
FIT_FRAMES = 8
"""The last frames through whose centroids the video's velocity is fitted (two latent frames)."""


@dataclass
class Continuation:
    """The world's next frames after a generated video."""

    clip: Clip
    """The continuation's frames, masks, centres and velocities (its frame 0 follows the video's
    last frame by one frame's step)."""
    scene: Scene
    """What it shows: the prompt's object, heading where it continues."""
    start: tuple[float, float]
    """The bounding-box centre ``(x, y)`` the object continues from, at the video's last frame."""


def _direction_of(signs: tuple[int, int]) -> str:
    for name, (x, y) in DIRECTIONS.items():
        if (int(np.sign(x)), int(np.sign(y))) == signs:
            return name
    raise ValueError(f"no direction has signs {signs}")


def _slope(t: np.ndarray, x: np.ndarray) -> float:
    t = t - t.mean()
    return float((t * (x - x.mean())).sum() / (t * t).sum())


def moving_signs(m: FrameMeasurements, clear: float) -> list[int]:
    """Per axis, the way the object moves at the video's end (-1, 0 or 1): the sign of the slope of
    a line through its centroids over the last ``FIT_FRAMES`` frames, counted from at least
    ``clear`` a frame. Where it moved ``clear`` away from a wall inside rule 8's bounce zone in the
    last three frames, it has just bounced: it moves away from that wall (the line through the
    bounce would still point at the wall)."""
    steps = displacements(m.centroid)
    zones = bounce_zones(m.centroid, m.extent)
    frames = np.arange(len(m))
    signs = []
    for axis in (0, 1):
        # near the wall at 0 moving up the axis, or near the wall at 1 moving down it
        near = {w: zones[w][:, axis] | np.roll(zones[w][:, axis], 1) for w in (-1, 1)}
        away = (near[-1] & (steps[:, axis] >= clear)) | (near[1] & (steps[:, axis] <= -clear))
        away[0] = False
        bounces = np.flatnonzero(away & m.has_object & np.roll(m.has_object, 1))
        if len(bounces) and len(m) - bounces[-1] < 4:
            signs.append(int(np.sign(steps[bounces[-1], axis])))
            continue
        seen = m.has_object & (frames >= len(m) - FIT_FRAMES)
        if seen.sum() < 4:
            signs.append(0)
            continue
        slope = _slope(frames[seen].astype(float), m.centroid[seen, axis])
        signs.append(int(np.sign(slope)) if abs(slope) >= clear else 0)
    return signs


def walked_signs(direction: str, m: FrameMeasurements, clear: float) -> list[int]:
    """The signs of ``direction`` after the bounces the video's path made: reversed on an axis each
    time its object turns back (by ``clear`` a frame) inside rule 8's bounce zone of the wall it
    was heading for."""
    signs = list(named_signs(direction))
    steps = displacements(m.centroid)
    zones = bounce_zones(m.centroid, m.extent)
    for t in range(1, len(m)):
        if not (m.has_object[t] and m.has_object[t - 1]):
            continue
        for axis in (0, 1):
            sign = signs[axis]
            # the frame before counts too: a measured centroid moves in uneven pixel steps
            if sign == 0 or not (zones[sign][t, axis] or zones[sign][t - 1, axis]):
                continue
            if steps[t, axis] * sign <= -clear:
                signs[axis] = -sign
    return signs


def heading(spec: PromptSpec, m: FrameMeasurements, fallback: str) -> str:
    """The direction the object heads after the video's last frame: the lawful path nearest the one
    the video drew, so that the continuation itself turns nowhere away from a wall.

    On an axis where the object moves (:func:`moving_signs`, from ``CLEAR`` of the speed) it goes
    on the way it moves, even against the prompt: turning it back would be a reversal away from a
    wall (rule 8), and after the first second nothing else judges the way. On an axis where it
    stalls it sets off the way the prompt names, with the bounces its path made
    (:func:`walked_signs`). An axis the prompt's direction leaves still stays still. A prompt that
    names no direction: the axes the object moves along, as it moves (``fallback`` when it
    hardly moves at all)."""
    clear = CLEAR * SPEEDS[spec.speed or DEFAULT_SPEED]
    moving = moving_signs(m, clear)
    if spec.direction is None:
        return fallback if moving == [0, 0] else _direction_of((moving[0], moving[1]))
    named = walked_signs(spec.direction, m, clear)
    signs = [0 if n == 0 else (v or n) for n, v in zip(named, moving, strict=True)]
    return _direction_of((signs[0], signs[1]))


def _size_shown(shape: str, areas: np.ndarray) -> str:
    """The size whose area for ``shape`` is nearest (in ratio) the median of ``areas``."""
    area = float(np.median(areas))
    return min(SIZES, key=lambda s: abs(np.log(area / shape_area(shape, SIZES[s]))))


def continuation(
    frames: np.ndarray,
    spec: PromptSpec,
    scene: Scene,
    num_frames: int,
    *,
    measurements: FrameMeasurements | None = None,
) -> Continuation | None:
    """The world's next ``num_frames`` frames after ``frames`` (T, S, S, 3) uint8, a generated video
    of the prompt ``spec``; None when its last ``TAIL`` frames show no object.

    ``scene`` fills in what the prompt leaves open and the video cannot tell (the shape of a
    prompt that names none; the direction of an object that hardly moves): the scene the prompt
    was written from, in training. The object continues from its last sighting's mask centroid (a
    triangle's box sits above its centroid by a sixth of its side), so the centroid the evaluator
    follows does not jump where the shape is corrected."""
    m = measurements if measurements is not None else measure_frames(frames)
    seen = np.flatnonzero(m.has_object[-TAIL:])
    if len(seen) == 0:
        return None
    last = len(m) - TAIL + int(seen[-1]) if len(m) >= TAIL else int(seen[-1])
    shape = spec.shape or scene.shape
    tail = m.area[-TAIL:][m.has_object[-TAIL:]]
    size = spec.size or _size_shown(shape, tail)
    speed = spec.speed or DEFAULT_SPEED
    direction = heading(spec, m, scene.direction)
    target = Scene(
        background=spec.background,
        color=spec.color,
        shape=shape,
        size=size,
        speed=speed,
        direction=direction,
    )
    half = target.side / 2
    x, y = (float(v) for v in m.centroid[last])
    if shape == "triangle":
        y -= target.side / 6
    # where the world puts it at the video's last frame: a sighting a frame or two earlier moves on
    vx, vy = target.velocity
    x, y = x + vx * (len(m) - 1 - last), y + vy * (len(m) - 1 - last)
    start = (float(np.clip(x, half, 1 - half)), float(np.clip(y, half, 1 - half)))
    clip = render_clip(target, num_frames + 1, size=m.size, start=start)
    return Continuation(clip=_drop_first(clip), scene=target, start=start)


def _drop_first(clip: Clip) -> Clip:
    return Clip(
        frames=clip.frames[1:],
        centers=clip.centers[1:],
        velocity=clip.velocity[1:],
        masks=clip.masks[1:],
        scene_index=clip.scene_index[1:],
        scenes=clip.scenes,
        starts=clip.starts,
        fps=clip.fps,
    )
