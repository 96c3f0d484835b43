"""Motion rules of the Shapes World evaluator: speed (6), direction (7) and bounces (8).

They read the mask centroids that ``vidgen.shapes.measure`` finds. Positions are fractions of
S; a displacement is per frame. ``evaluate.py`` says how these pieces are put together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vidgen.shapes.world import DIRECTIONS

MIN_SPEED_RATIO = 0.4
"""Rule 6: the median speed of a second must be at least this times the named speed."""
STILL = 0.002
"""Rules 7 and 8: displacements under this (fraction of S per frame) count as no motion."""
WALL_MARGIN = 0.08
"""Rule 8: a reversal must happen within half the object's extent plus this of the wall."""
MOVING_AVERAGE = 5
"""Rules 7 and 8: frames in the moving average of the displacement."""


@dataclass(frozen=True)
class Reversal:
    """A reversal of the motion on one axis (rule 8)."""

    frame: int
    """Frame of the extreme centroid where the motion turns."""
    span: tuple[int, int]
    """Frames ``[first, last]`` between the last clear motion one way and the first the other way."""
    axis: str
    """``x`` or ``y``."""
    wall_distance: float
    """Distance from the centroid to the wall the motion turned away from."""
    allowed: float
    """Half the object's extent on the axis + 0.08."""
    excused: bool = False
    """Part of a storyboard change's transition (new direction, shape or size)."""

    @property
    def at_wall(self) -> bool:
        return self.wall_distance <= self.allowed

    @property
    def ok(self) -> bool:
        return self.at_wall or self.excused


def displacements(centroid: np.ndarray) -> np.ndarray:
    """(T, 2) displacement of each frame from the previous one; NaN for frame 0 and wherever a
    centroid is missing."""
    steps = np.full_like(centroid, np.nan)
    steps[1:] = np.diff(centroid, axis=0)
    return steps


def moving_average(steps: np.ndarray) -> np.ndarray:
    """(N - 4, 2) means of 5 consecutive displacements (NaN if any is); (0, 2) if N < 5."""
    if len(steps) < MOVING_AVERAGE:
        return np.zeros((0, 2))
    return np.lib.stride_tricks.sliding_window_view(steps, MOVING_AVERAGE, axis=0).mean(axis=2)


def median_speed(steps: np.ndarray) -> float:
    """Rule 6: median length of the measured displacements; NaN when there are none."""
    speeds = np.hypot(steps[:, 0], steps[:, 1])
    speeds = speeds[~np.isnan(speeds)]
    return float(np.median(speeds)) if len(speeds) else float("nan")


def find_reversals(
    centroid: np.ndarray, extent: np.ndarray, steps: np.ndarray, still: float, in_transition: np.ndarray
) -> list[Reversal]:
    """Rule 8: where the 5-frame moving average of the displacement flips sign on an axis.

    Averages under ``still`` are skipped, so a flip is two consecutive clear averages of
    opposite signs. Averages that include a displacement in a storyboard change's transition
    (``in_transition``, per frame) are skipped too: when the shape or size changes, the
    centroid jumps within the object, which is not motion. A turn across a transition is
    still found, at its extreme centroid.
    """
    if len(centroid) < MOVING_AVERAGE + 1:
        return []
    # Averages of the displacements of frames t - 2 .. t + 2, centred on t = 3 .. T - 3.
    average = moving_average(steps[1:])
    skip = np.lib.stride_tricks.sliding_window_view(in_transition[1:], MOVING_AVERAGE).any(axis=1)
    centre = np.arange(len(average)) + 1 + MOVING_AVERAGE // 2
    found = []
    for axis in (0, 1):
        values = np.nan_to_num(average[:, axis])
        sign = np.where((np.abs(values) >= still) & ~skip, np.sign(values), 0.0)
        clear = np.flatnonzero(sign)
        for i in np.flatnonzero(sign[clear[1:]] != sign[clear[:-1]]):
            before, after = int(centre[clear[i]]), int(centre[clear[i + 1]])
            toward_far_wall = sign[clear[i]] > 0  # heading for the wall at 1 (right, or bottom)
            between = centroid[before - 1 : after + 1, axis]
            turn = before - 1 + int(np.nanargmax(between) if toward_far_wall else np.nanargmin(between))
            position = centroid[turn, axis]
            found.append(
                Reversal(
                    frame=turn,
                    span=(before - 1, after),
                    axis="xy"[axis],
                    wall_distance=float(1.0 - position if toward_far_wall else position),
                    allowed=float(extent[turn, axis] / 2 + WALL_MARGIN),
                )
            )
    return sorted(found, key=lambda r: (r.frame, r.axis))


def excuse(reversal: Reversal, transitions: Sequence[int], fps: int) -> Reversal:
    """Excuse a turn made in a transition: from one frame before a change to a second after it."""
    first, last = reversal.span
    if any(first < change + fps and last >= change - 1 for change in transitions):
        return dataclasses.replace(reversal, excused=True)
    return reversal


def bounce_zones(centroid: np.ndarray, extent: np.ndarray) -> dict[int, np.ndarray]:
    """For a heading sign on an axis (-1 or +1), (T, 2) whether the object is within the
    bounce zone (rule 8's half extent + 0.08) of the wall that heading reaches."""
    allowed = np.nan_to_num(extent / 2 + WALL_MARGIN, nan=-1.0)
    position = np.nan_to_num(centroid, nan=0.5)
    return {-1: position <= allowed, 1: 1.0 - position <= allowed}


def named_signs(direction: str) -> tuple[int, int]:
    """Signs ``(x, y)`` of a direction's components; "up" is y = -1."""
    x, y = DIRECTIONS[direction]
    return int(np.sign(x)), int(np.sign(y))


def direction_shown(
    direction: str, steps: np.ndarray, zones: dict[int, np.ndarray], still: float
) -> np.ndarray:
    """Per frame f of a stretch: whether the motion after f (the next 5 displacements) shows
    ``direction``.

    ``steps`` and ``zones`` cover the stretch only. Per axis the mean displacement must have the
    named sign (be under ``still`` where the direction has no component); an axis is free while
    the object is in the bounce zone of the wall the direction heads for, as it may just have
    bounced off it.
    """
    length = len(steps)
    valid = ~np.isnan(steps)
    total = np.concatenate([np.zeros((1, 2)), np.cumsum(np.where(valid, steps, 0.0), axis=0)])
    count = np.concatenate([np.zeros((1, 2)), np.cumsum(valid, axis=0)])
    first = np.arange(length)
    lo, hi = np.minimum(first + 1, length), np.minimum(first + 1 + MOVING_AVERAGE, length)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (total[hi] - total[lo]) / (count[hi] - count[lo])  # (L, 2), NaN without steps
    shown = np.ones(length, dtype=bool)
    for axis, named in enumerate(named_signs(direction)):
        value = np.nan_to_num(mean[:, axis])
        moving = np.abs(value) >= still
        if named == 0:
            shown &= ~moving & ~np.isnan(mean[:, axis])
            continue
        in_zone = np.concatenate([[0], np.cumsum(zones[named][:, axis])])
        near = in_zone[hi] > in_zone[first]  # in the zone at any of frames f .. f + 5
        shown &= (moving & (np.sign(value) == named)) | near
    return shown


def judge_direction(
    direction: str,
    steps: np.ndarray,
    window: tuple[int, int],
    reversals: Sequence[Reversal],
    zones: dict[int, np.ndarray] | None,
    still: float,
) -> dict[str, object]:
    """Rule 7 over the frames ``window = (w0, w1)``: the sign of the median displacement per axis.

    The displacements judged are those after frame w0, read through the 5-frame moving average:
    at some canvas sizes a slow object's mask moves in whole-pixel steps about every other
    frame, and the median of the raw steps is then 0. An axis is not judged when a reversal
    turns within the window or, when ``zones`` is given (after a change), when the object is in
    the bounce zone of the named wall during the window's first half.
    """
    w0, w1 = window
    inside = steps[w0 + 1 : w1]
    if len(inside) >= MOVING_AVERAGE:
        averages = moving_average(inside)
    else:  # a stretch shorter than the average: one mean of what there is
        averages = inside.mean(axis=0, keepdims=True) if len(inside) else np.zeros((0, 2))
    medians, judged, ok = [], [], True
    for axis, named in enumerate(named_signs(direction)):
        values = averages[:, axis][~np.isnan(averages[:, axis])]
        median = float(np.median(values)) if len(values) else float("nan")
        measured = 0 if abs(median) < still else np.sign(median)  # NaN without displacements
        turned = any(r.axis == "xy"[axis] and w0 <= r.frame < w1 for r in reversals)
        half = w0 + max(1, (w1 - w0) // 2)
        bounced = zones is not None and named != 0 and bool(zones[named][w0:half, axis].any())
        medians.append(median)
        judged.append(not (turned or bounced))
        ok = ok and len(values) > 0 and (measured == named or not judged[-1])
    return {
        "direction_window": window,
        "median_displacement": tuple(medians),
        "axes_judged": tuple(judged),
        "direction_ok": bool(ok),
    }
