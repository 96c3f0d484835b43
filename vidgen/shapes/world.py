"""Shapes World v1: the attribute tables, scenes, storyboards and the clip renderer.

These tables and rules define the world: the training data and the evaluator both read them, so
they change together. Positions and sizes are fractions of the canvas side ``S``; ``x`` grows to
the right and ``y`` grows downward ("up" is toward row 0). Pure numpy, so it can run inside data
loaders.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

FPS = 16
"""Frames per second of every Shapes World video."""

BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "black": (0, 0, 0),
    "white": (255, 255, 255),
    "gray": (128, 128, 128),
    "beige": (230, 215, 180),
}

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 220, 40),
    "orange": (245, 140, 30),
    "purple": (140, 60, 190),
    "cyan": (40, 200, 210),
    "pink": (240, 120, 180),
}

SHAPES: tuple[str, ...] = ("circle", "square", "triangle")

SIZES: dict[str, float] = {"small": 0.16, "medium": 0.24, "large": 0.32}
"""Side ``d`` of the object's bounding box, as a fraction of S."""

SPEEDS: dict[str, float] = {"slow": 0.010, "fast": 0.025}
"""Distance travelled per frame along the direction, as a fraction of S."""

DEFAULT_SPEED = "slow"
"""The speed a caption means when it names none."""

_DIAGONAL = 1.0 / math.sqrt(2.0)
DIRECTIONS: dict[str, tuple[float, float]] = {
    "left": (-1.0, 0.0),
    "right": (1.0, 0.0),
    "up": (0.0, -1.0),
    "down": (0.0, 1.0),
    "up-left": (-_DIAGONAL, -_DIAGONAL),
    "up-right": (_DIAGONAL, -_DIAGONAL),
    "down-left": (-_DIAGONAL, _DIAGONAL),
    "down-right": (_DIAGONAL, _DIAGONAL),
}
"""Unit vectors ``(x, y)``; diagonals at 45 degrees."""

ATTRIBUTES: tuple[str, ...] = ("background", "color", "shape", "size", "speed", "direction")

_CHOICES: dict[str, Sequence[str]] = {
    "background": tuple(BACKGROUNDS),
    "color": tuple(COLORS),
    "shape": SHAPES,
    "size": tuple(SIZES),
    "speed": tuple(SPEEDS),
    "direction": tuple(DIRECTIONS),
}


def choices(attribute: str) -> tuple[str, ...]:
    """The names an attribute can take, in table order."""
    if attribute not in _CHOICES:
        raise ValueError(f"unknown attribute {attribute!r}; choose one of {ATTRIBUTES}")
    return tuple(_CHOICES[attribute])


def shape_area(shape: str, side: float) -> float:
    """Area of a shape whose bounding box has side ``side`` (same units squared)."""
    factor = {"circle": math.pi / 4.0, "square": 1.0, "triangle": 0.5}[shape]
    return factor * side * side


@dataclass(frozen=True)
class Scene:
    """What one stretch of video shows: one object moving over a solid background."""

    background: str
    """Background name, a key of ``BACKGROUNDS``."""
    color: str
    """Object colour, a key of ``COLORS``."""
    shape: str
    """One of ``SHAPES``."""
    size: str
    """A key of ``SIZES``."""
    speed: str
    """A key of ``SPEEDS``."""
    direction: str
    """A key of ``DIRECTIONS``."""

    def __post_init__(self) -> None:
        for attribute in ATTRIBUTES:
            value = getattr(self, attribute)
            if value not in _CHOICES[attribute]:
                raise ValueError(
                    f"Scene.{attribute}={value!r} is not in the Shapes World table; "
                    f"choose one of {tuple(_CHOICES[attribute])}"
                )

    @property
    def side(self) -> float:
        """Bounding-box side d as a fraction of S."""
        return SIZES[self.size]

    @property
    def velocity(self) -> tuple[float, float]:
        """Per-frame velocity ``(vx, vy)`` in fractions of S, before any bounce."""
        ux, uy = DIRECTIONS[self.direction]
        speed = SPEEDS[self.speed]
        return (ux * speed, uy * speed)

    def replace(self, **changes: str) -> Scene:
        """A copy with some attributes changed (validated)."""
        return dataclasses.replace(self, **changes)

    def changed_attributes(self, other: Scene) -> tuple[str, ...]:
        """Names of the attributes whose values differ between ``self`` and ``other``."""
        return tuple(a for a in ATTRIBUTES if getattr(self, a) != getattr(other, a))


Storyboard = Sequence[tuple[float, Scene]]
"""A list of ``(start_seconds, Scene)``; the first entry starts at 0."""


def as_rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    """A numpy Generator from a Generator, a seed, or None (fresh entropy)."""
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


def sample_scene(rng: np.random.Generator | int | None = None) -> Scene:
    """A scene with every attribute drawn uniformly from its table."""
    rng = as_rng(rng)
    return Scene(**{a: str(rng.choice(_CHOICES[a])) for a in ATTRIBUTES})


def sample_storyboard(
    rng: np.random.Generator | int | None,
    seconds: float,
    num_changes: int,
    *,
    min_segment: float = 2.0,
    attributes: Sequence[str] = ATTRIBUTES,
    max_changed: int = 3,
    first: Scene | None = None,
) -> list[tuple[float, Scene]]:
    """A random storyboard of ``seconds`` with ``num_changes`` changes.

    Each change alters between 1 and ``max_changed`` of ``attributes`` (one attribute most
    often), always to a different value. Every segment lasts at least ``min_segment`` seconds
    and changes fall on frame boundaries (multiples of 1/FPS).
    """
    rng = as_rng(rng)
    unknown = set(attributes) - set(ATTRIBUTES)
    if unknown or not attributes:
        raise ValueError(f"attributes must be a non-empty subset of {ATTRIBUTES}, got {tuple(attributes)}")
    if num_changes < 0:
        raise ValueError(f"num_changes must be >= 0, got {num_changes}")
    total = round(seconds * FPS)
    shortest = math.ceil(min_segment * FPS)
    slack = total - (num_changes + 1) * shortest
    if slack < 0:
        raise ValueError(
            f"{num_changes} changes with segments of at least {min_segment} s need "
            f"{(num_changes + 1) * min_segment} s; got seconds={seconds}"
        )
    # Stick breaking over frames: sorted offsets into the slack, plus the minimum segments.
    offsets = np.sort(rng.integers(0, slack + 1, size=num_changes))
    starts = [int(o) + (i + 1) * shortest for i, o in enumerate(offsets)]

    scene = first if first is not None else sample_scene(rng)
    storyboard = [(0.0, scene)]
    weights = np.array([0.6, 0.3, 0.1][: max(1, min(max_changed, len(attributes)))])
    for start in starts:
        count = 1 + int(rng.choice(len(weights), p=weights / weights.sum()))
        picked = rng.choice(len(attributes), size=count, replace=False)
        changes = {}
        for i in sorted(picked):
            attribute = attributes[i]
            options = [v for v in _CHOICES[attribute] if v != getattr(scene, attribute)]
            changes[attribute] = str(rng.choice(options))
        scene = scene.replace(**changes)
        storyboard.append((start / FPS, scene))
    return storyboard


def frame_of(seconds: float, fps: int = FPS) -> int:
    """The first frame shown at or after ``seconds`` (frame i is shown at time i / fps)."""
    return max(0, math.ceil(seconds * fps - 1e-6))


def storyboard_frames(storyboard: Sequence[tuple[float, object]], fps: int = FPS) -> list[int]:
    """Start frame of each storyboard entry, validated: the first at 0, then strictly increasing."""
    if not storyboard:
        raise ValueError("a storyboard needs at least one (start_seconds, caption) entry")
    starts = [frame_of(float(t), fps) for t, _ in storyboard]
    if starts[0] != 0:
        raise ValueError(f"a storyboard must start at 0 s; the first entry starts at {storyboard[0][0]} s")
    for ((t0, _), f0), ((t1, _), f1) in pairwise(zip(storyboard, starts, strict=True)):
        if f1 <= f0:
            raise ValueError(
                f"storyboard entries must start at increasing times, at least one frame apart; "
                f"got {t0} s then {t1} s"
            )
    return starts


@dataclass
class Clip:
    """A rendered clip and its exact ground truth."""

    frames: np.ndarray
    """(T, S, S, 3) uint8 RGB."""
    centers: np.ndarray
    """(T, 2) float64 centre of the object's bounding box, ``(x, y)`` in fractions of S."""
    velocity: np.ndarray
    """(T, 2) float64 velocity after frame t's step (what the next step uses), fractions of S."""
    masks: np.ndarray
    """(T, S, S) float32 coverage of the object in [0, 1] (anti-aliased)."""
    scene_index: np.ndarray
    """(T,) int64 index into ``scenes`` of the scene each frame shows."""
    scenes: tuple[Scene, ...]
    """The storyboard's scenes, in order."""
    starts: tuple[int, ...]
    """Start frame of each scene."""
    fps: int = FPS

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def size(self) -> int:
        """Canvas side S in pixels."""
        return self.frames.shape[1]

    @property
    def storyboard(self) -> list[tuple[float, Scene]]:
        """The storyboard as ``(start_seconds, Scene)``, start times snapped to frames."""
        return [(start / self.fps, scene) for start, scene in zip(self.starts, self.scenes, strict=True)]

    def scene_at(self, frame: int) -> Scene:
        """The scene frame ``frame`` shows."""
        return self.scenes[int(self.scene_index[frame])]


def start_range(scene: Scene, seconds: float = 1.0) -> tuple[tuple[float, float], tuple[float, float]]:
    """Ranges of start centres ``((x_lo, x_hi), (y_lo, y_hi))`` obeying the spec's start rule.

    From any of them the object, wholly inside the canvas, travels ``seconds`` in its direction
    before touching a wall.
    """
    half = scene.side / 2.0
    travel = seconds * FPS
    ranges = []
    for v in scene.velocity:
        lo, hi = half, 1.0 - half
        # A tiny margin so that rounding in the summed steps never grazes the wall early.
        if v > 0:
            hi -= travel * v + 1e-9
        elif v < 0:
            lo -= travel * v - 1e-9
        if hi < lo:
            raise ValueError(f"no start position lets {scene} travel {seconds} s before a wall")
        ranges.append((lo, hi))
    return ranges[0], ranges[1]


def render_clip(
    storyboard_or_scene: Scene | Storyboard,
    num_frames: int,
    size: int = 64,
    rng: np.random.Generator | int | None = None,
    start: tuple[float, float] | None = None,
    *,
    supersample: int = 8,
) -> Clip:
    """Render ``num_frames`` frames of a scene or storyboard on an ``size`` x ``size`` canvas.

    Args:
        storyboard_or_scene: a ``Scene``, or a storyboard ``[(start_seconds, Scene), ...]``. At a
            change the same object continues from where it is: a new direction sets the velocity
            to it, a new speed rescales the velocity (keeping any bounce), a new size keeps the
            centre, moved just enough to stay inside the canvas.
        num_frames: length T of the clip.
        size: canvas side S in pixels.
        rng: Generator or seed for the start position; the only randomness.
        start: optional start centre ``(x, y)`` in fractions of S, instead of a random one.
        supersample: horizontal bands per pixel row for anti-aliasing; coverage along each
            band is exact.
    """
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    if size < 8:
        raise ValueError(f"size (the canvas side in pixels) must be >= 8, got {size}")
    storyboard = (
        [(0.0, storyboard_or_scene)] if isinstance(storyboard_or_scene, Scene) else storyboard_or_scene
    )
    starts = storyboard_frames(storyboard)
    scenes = tuple(scene for _, scene in storyboard)
    for scene in scenes:
        if not isinstance(scene, Scene):
            raise TypeError(f"storyboard entries must hold Scene objects, got {type(scene).__name__}")

    scene_index = np.searchsorted(np.asarray(starts), np.arange(num_frames), side="right") - 1
    centers, velocity = _simulate(scenes, starts, num_frames, _start_position(scenes[0], rng, start))
    frames, masks = _draw(scenes, scene_index, centers, size, supersample)
    return Clip(
        frames=frames,
        centers=centers,
        velocity=velocity,
        masks=masks,
        scene_index=scene_index.astype(np.int64),
        scenes=scenes,
        starts=tuple(starts),
    )


def redraw(
    clip: Clip,
    size: int | None = None,
    *,
    scale: float = 1.0,
    centers: np.ndarray | None = None,
    **changes: str,
) -> np.ndarray:
    """The frames of ``clip`` along the same trajectory with attributes changed in every scene
    (e.g. ``shape="square"``): what the video would look like had only those words differed. Every
    shape of a size has the same bounding box, so the trajectory and its bounces stay valid.

    ``scale`` draws the object that many times its size's side about the same centres (at most
    the canvas less 2 pixels), cut off where it leaves the canvas: not a Shapes World clip, a
    picture of a size error (training's ``oversize_swap``).

    ``centers`` (T, 2), fractions of S, draws the object there instead of along the clip's
    trajectory (e.g. where it was some frames earlier: training's ``lag_swap``)."""
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    if centers is None:
        centers = clip.centers
    elif np.shape(centers) != clip.centers.shape:
        raise ValueError(f"centers must have shape {clip.centers.shape}, got {np.shape(centers)}")
    scenes = [scene.replace(**changes) for scene in clip.scenes]
    return _draw(
        scenes, clip.scene_index, np.asarray(centers, dtype=np.float64), size or clip.size, 8, scale
    )[0]


def retrace(clip: Clip, centers: np.ndarray) -> Clip:
    """``clip`` with its object drawn at ``centers`` (T, 2), fractions of S, instead: frames,
    coverage masks, centres and velocity all follow the new path (each frame's velocity is its step
    from the frame before; frame 0 takes its step to frame 1). Not a Shapes World clip unless the
    path is one; training's ``false_start`` holds or turns the first chunk's object this way."""
    centers = np.asarray(centers, dtype=np.float64)
    if centers.shape != clip.centers.shape:
        raise ValueError(f"centers must have shape {clip.centers.shape}, got {centers.shape}")
    frames, masks = _draw(clip.scenes, clip.scene_index, centers, clip.size, 8)
    velocity = np.empty_like(centers)
    velocity[1:] = np.diff(centers, axis=0)
    velocity[0] = velocity[1] if len(centers) > 1 else 0.0
    return dataclasses.replace(clip, frames=frames, masks=masks, centers=centers, velocity=velocity)


def draw_path(
    scene: Scene, centers: np.ndarray, size: int, *, side: float | None = None, supersample: int = 8
) -> tuple[np.ndarray, np.ndarray]:
    """``scene``'s object drawn at ``centers`` (T, 2), fractions of S: frames (T, S, S, 3) uint8 and
    coverage masks (T, S, S). ``side`` draws it with that bounding-box side (a fraction of S)
    instead of its size's."""
    centers = np.asarray(centers, dtype=np.float64).reshape(-1, 2)
    scale = 1.0 if side is None else side / scene.side
    return _draw((scene,), np.zeros(len(centers), dtype=np.int64), centers, size, supersample, scale)


def trajectory(scene: Scene, num_frames: int, start: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """The centres and velocities (T, 2) of ``scene``'s object over ``num_frames`` frames from
    ``start``: the path ``render_clip`` draws, without drawing it."""
    return _simulate((scene,), (0,), num_frames, _start_position(scene, None, start))


def _start_position(
    scene: Scene, rng: np.random.Generator | int | None, start: tuple[float, float] | None
) -> tuple[float, float]:
    half = scene.side / 2.0
    if start is not None:
        x, y = (float(c) for c in start)
        if not (half <= x <= 1 - half and half <= y <= 1 - half):
            raise ValueError(f"start={start} puts a {scene.size} object outside the canvas")
        return x, y
    rng = as_rng(rng)
    (x_lo, x_hi), (y_lo, y_hi) = start_range(scene)
    return float(rng.uniform(x_lo, x_hi)), float(rng.uniform(y_lo, y_hi))


def _simulate(
    scenes: Sequence[Scene], starts: Sequence[int], num_frames: int, start: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """Centres and velocities per frame: constant velocity, elastic bounces, storyboard changes."""
    centers = np.empty((num_frames, 2))
    velocity = np.empty((num_frames, 2))
    change_at = dict(zip(starts, range(len(scenes)), strict=True))
    scene = scenes[0]
    pos = list(start)
    vel = list(scene.velocity)
    for t in range(num_frames):
        if t > 0:
            if t in change_at:
                new = scenes[change_at[t]]
                if new.direction != scene.direction:
                    vel = list(new.velocity)
                elif new.speed != scene.speed:
                    ratio = SPEEDS[new.speed] / SPEEDS[scene.speed]
                    vel = [v * ratio for v in vel]
                scene = new
                half = scene.side / 2.0
                pos = [min(max(p, half), 1.0 - half) for p in pos]
            half = scene.side / 2.0
            lo, hi = half, 1.0 - half
            for axis in range(2):
                p = pos[axis] + vel[axis]
                # Mirror at the wall: the velocity component into the wall flips.
                if p > hi:
                    p, vel[axis] = 2 * hi - p, -vel[axis]
                elif p < lo:
                    p, vel[axis] = 2 * lo - p, -vel[axis]
                pos[axis] = p
        centers[t] = pos
        velocity[t] = vel
    return centers, velocity


def _half_width(shape: str, v: np.ndarray) -> np.ndarray:
    """Half the shape's width at height ``v`` (offset from the centre over d, in [-1/2, 1/2])."""
    if shape == "circle":
        return np.sqrt(np.maximum(0.25 - v * v, 0.0))
    if shape == "square":
        return np.full_like(v, 0.5)
    # Apex-up isosceles triangle: apex at the top centre (v = -1/2), base d along v = +1/2.
    return (v + 0.5) / 2.0


def _coverage(
    shape: str,
    side: float,
    cx: np.ndarray,
    cy: np.ndarray,
    x0: np.ndarray,
    y0: np.ndarray,
    n: int,
    bands: int,
) -> np.ndarray:
    """Fraction of each pixel of an n x n window covered by the object, (N, n, n) float32.

    Each pixel row is cut into ``bands`` horizontal bands; in each band the shape is the span
    of its width at the band's middle, and that span's overlap with each pixel is exact. So
    vertical edges are exact, horizontal edges are exact too (bands are clipped to the shape's
    top and bottom), and only curved edges are approximated.
    """
    cx, cy = cx[:, None, None], cy[:, None, None]  # (N, 1, 1) centre in pixels
    band = y0[:, None, None] + np.arange(n)[None, :, None] + np.arange(bands + 1)[None, None, :] / bands
    top = np.clip(band[:, :, :-1], cy - side / 2, cy + side / 2)  # (N, n, bands) clipped to the shape
    bottom = np.clip(band[:, :, 1:], cy - side / 2, cy + side / 2)
    weight = (bottom - top) * bands  # fraction of the band inside the shape's height
    half = _half_width(shape, ((top + bottom) / 2 - cy) / side) * side  # (N, n, bands) in pixels
    left = (cx - half)[..., None]  # (N, n, bands, 1)
    right = (cx + half)[..., None]
    pixel = (x0[:, None] + np.arange(n)[None, :])[:, None, None, :]  # (N, 1, 1, n) left pixel edges
    overlap = np.clip(np.minimum(right, pixel + 1) - np.maximum(left, pixel), 0.0, 1.0)
    return (overlap * weight[..., None]).mean(axis=2).astype(np.float32)  # (N, ny, nx)


def _draw(
    scenes: Sequence[Scene],
    scene_index: np.ndarray,
    centers: np.ndarray,
    size: int,
    supersample: int,
    scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Frames and coverage masks; coverage is computed only in each object's bounding box."""
    num_frames = len(centers)
    backgrounds = np.array([BACKGROUNDS[s.background] for s in scenes], dtype=np.float32)[scene_index]
    colors = np.array([COLORS[s.color] for s in scenes], dtype=np.float32)[scene_index]
    frames = np.empty((num_frames, size, size, 3), dtype=np.uint8)
    frames[:] = backgrounds.astype(np.uint8)[:, None, None, :]
    masks = np.zeros((num_frames, size, size), dtype=np.float32)

    # One vectorised pass per run of frames with the same shape and size.
    keys = [(scenes[i].shape, scenes[i].size) for i in scene_index]
    run_start = 0
    for t in range(1, num_frames + 1):
        if t < num_frames and keys[t] == keys[run_start]:
            continue
        shape, size_name = keys[run_start]
        frames_in_run = np.arange(run_start, t)
        side = min(SIZES[size_name] * size * scale, size - 2.0)  # d in pixels
        n = math.ceil(side) + 1  # pixels of the window that holds the object's box
        cx, cy = centers[frames_in_run, 0] * size, centers[frames_in_run, 1] * size
        x0 = np.clip(np.floor(cx - side / 2).astype(np.int64), 0, size - n)
        y0 = np.clip(np.floor(cy - side / 2).astype(np.int64), 0, size - n)
        coverage = _coverage(shape, side, cx, cy, x0, y0, n, supersample)

        rows = y0[:, None] + np.arange(n)[None, :]  # (N, n)
        cols = x0[:, None] + np.arange(n)[None, :]
        index = (frames_in_run[:, None, None], rows[:, :, None], cols[:, None, :])
        masks[index] = coverage
        bg = backgrounds[frames_in_run][:, None, None, :]
        fg = colors[frames_in_run][:, None, None, :]
        blended = bg + (fg - bg) * coverage[..., None]
        frames[index] = np.rint(blended).astype(np.uint8)
        run_start = t
    return frames, masks
