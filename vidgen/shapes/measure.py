"""What each frame shows, measured as the spec's evaluator rules 1-5 define it.

The measurements do not depend on the prompt (the background is the border's median colour,
the object is whatever stands out from it), so a video is measured once and then judged
against any caption. Vectorised over chunks of frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vidgen.shapes.world import COLORS, SHAPES

OBJECT_DISTANCE = 60.0
"""Rule 2: pixels farther than this (RGB distance) from the background belong to the object."""
BORDER = 2
"""Rule 1: width in pixels of the border ring whose median colour is the background."""

_COLOR_TABLE = np.array(list(COLORS.values()), dtype=np.float64)  # (8, 3) in COLORS order


@dataclass
class FrameMeasurements:
    """Per-frame measurements of a video of T frames on an S x S canvas.

    Positions and lengths are fractions of S, areas fractions of S^2. Where a frame shows no
    object, the object's values are NaN and its indices -1.
    """

    size: int
    """Canvas side S in pixels."""
    background: np.ndarray
    """(T, 3) median colour of the 2-pixel border ring (rule 1)."""
    object_color: np.ndarray
    """(T, 3) median colour of the pixels farther than 60 from the background (rule 2)."""
    color_index: np.ndarray
    """(T,) index into ``COLORS`` of the table colour nearest ``object_color``."""
    area: np.ndarray
    """(T,) area of the object mask (rule 3)."""
    ious: np.ndarray
    """(T, 3) IoU of the mask with the ellipse, box and apex-up triangle in its bounding box, in
    ``SHAPES`` order (circle, square, triangle) (rule 4)."""
    shape_index: np.ndarray
    """(T,) index into ``SHAPES`` of the best IoU (rule 4)."""
    centroid: np.ndarray
    """(T, 2) mask centroid ``(x, y)`` (rule 5)."""
    extent: np.ndarray
    """(T, 2) width and height of the mask's bounding box."""

    def __len__(self) -> int:
        return len(self.area)

    @property
    def has_object(self) -> np.ndarray:
        """(T,) whether the frame shows an object at all."""
        return self.area > 0


def measure_frames(frames: np.ndarray, chunk: int | None = None) -> FrameMeasurements:
    """Measure every frame of a ``(T, S, S, 3)`` uint8 video (rules 1-5 of the spec)."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[1] != frames.shape[2]:
        raise ValueError(f"frames must be (T, S, S, 3) with a square canvas, got shape {frames.shape}")
    if frames.dtype != np.uint8:
        raise TypeError(f"frames must be uint8 RGB, got {frames.dtype}")
    if frames.shape[1] <= 2 * BORDER:
        raise ValueError(f"the canvas must be wider than the {2 * BORDER}-pixel border ring")
    if len(frames) == 0:
        raise ValueError("frames is empty: nothing to measure")
    size = frames.shape[1]
    chunk = chunk or max(1, (1 << 20) // (size * size))
    parts = [_measure_chunk(frames[i : i + chunk]) for i in range(0, len(frames), chunk)]
    return FrameMeasurements(
        size=size, **{name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    )


def _median_uint8(values: np.ndarray, selected: np.ndarray | None = None) -> np.ndarray:
    """Per-channel median of the selected pixels, (B, 3) float; NaN where none is selected.

    ``values`` is (B, N, 3) uint8 and ``selected`` (B, N) bool (None: all). Works by histogram;
    an even count averages the two middle values, like ``np.median``.
    """
    batch, n = values.shape[:2]
    if selected is None:
        frame, chosen, count = np.repeat(np.arange(batch), n), values.reshape(-1, 3), np.full(batch, n)
    else:
        frame, pixel = np.nonzero(selected)
        chosen, count = values[frame, pixel], selected.sum(axis=1)
    bins = (frame[:, None] * 3 + np.arange(3)[None, :]) * 256 + chosen  # (M, 3) one bin per value
    histogram = np.bincount(bins.ravel(), minlength=batch * 3 * 256).reshape(batch, 3, 256)
    cumulative = histogram.cumsum(axis=2)
    lower = (cumulative > ((count - 1) // 2)[:, None, None]).argmax(axis=2)
    upper = (cumulative > (count // 2)[:, None, None]).argmax(axis=2)
    median = (lower + upper) / 2.0
    median[count == 0] = np.nan
    return median


def _measure_chunk(frames: np.ndarray) -> dict[str, np.ndarray]:
    batch, size = frames.shape[:2]

    # Rule 1: the background is the median colour of the border ring.
    ring = np.ones((size, size), dtype=bool)
    ring[BORDER:-BORDER, BORDER:-BORDER] = False
    background = _median_uint8(frames[:, ring])

    # Rule 2: the object colour is the median of the pixels far from the background.
    # Squared distances throughout: the comparisons are the same and need no square root.
    offset = frames.astype(np.float32) - background[:, None, None, :].astype(np.float32)
    distance2 = np.einsum("bijc,bijc->bij", offset, offset)  # (B, S, S)
    far = distance2 > OBJECT_DISTANCE**2
    object_color = _median_uint8(frames.reshape(batch, -1, 3), far.reshape(batch, -1))
    has_color = ~np.isnan(object_color[:, 0])
    nearest = np.linalg.norm(object_color[:, None, :] - _COLOR_TABLE[None], axis=2)  # (B, 8)
    color_index = np.where(has_color, np.nan_to_num(nearest, nan=np.inf).argmin(axis=1), -1)

    # Rule 3: the mask's edge sits halfway between the background and the object colour.
    halfway2 = 0.25 * ((object_color - background) ** 2).sum(axis=1)
    mask = distance2 > np.where(has_color, halfway2, np.inf)[:, None, None].astype(np.float32)
    count = mask.sum(axis=(1, 2))
    present = count > 0

    # Bounding box and centroid (rule 5) in pixel indices; centres of pixels sit at i + 1/2.
    row_counts, col_counts = mask.sum(axis=2), mask.sum(axis=1)  # (B, S)
    rows, cols = row_counts > 0, col_counts > 0
    top, left = rows.argmax(axis=1), cols.argmax(axis=1)
    bottom = size - 1 - rows[:, ::-1].argmax(axis=1)
    right = size - 1 - cols[:, ::-1].argmax(axis=1)
    height = (bottom - top + 1).astype(np.float64)
    width = (right - left + 1).astype(np.float64)
    centres = np.arange(size) + 0.5
    safe = np.maximum(count, 1)
    cy = (row_counts * centres).sum(axis=1) / safe
    cx = (col_counts * centres).sum(axis=1) / safe

    # Rule 4: the ideal shapes drawn in the mask's bounding box, sampled at pixel centres.
    u = (centres[None, :] - left[:, None]) / width[:, None]  # (B, S) across the box, 0..1
    v = (centres[None, :] - top[:, None]) / height[:, None]  # (B, S) down the box, 0..1
    ellipse = ((2 * u - 1) ** 2)[:, None, :] + ((2 * v - 1) ** 2)[:, :, None] <= 1
    # Apex-up triangle: apex at the top centre, base along the bottom of the box.
    triangle = (np.abs(2 * u - 1)[:, None, :] <= v[:, :, None]) & (v <= 1)[:, :, None]
    box_area = width * height  # the mask lies inside its box, so box & mask = mask
    ious = np.zeros((batch, len(SHAPES)))
    for k, shape in enumerate(SHAPES):
        if shape == "square":
            ious[:, k] = count / box_area
            continue
        ideal = ellipse if shape == "circle" else triangle
        inter = (mask & ideal).sum(axis=(1, 2))
        ious[:, k] = inter / np.maximum(count + ideal.sum(axis=(1, 2)) - inter, 1)

    nan2 = np.full((batch, 2), np.nan)
    return {
        "background": background,
        "object_color": object_color,
        "color_index": color_index.astype(np.int64),
        "area": count / float(size * size),
        "ious": np.where(present[:, None], ious, 0.0),
        "shape_index": np.where(present, ious.argmax(axis=1), -1).astype(np.int64),
        "centroid": np.where(present[:, None], np.stack([cx, cy], axis=1) / size, nan2),
        "extent": np.where(present[:, None], np.stack([width, height], axis=1) / size, nan2),
    }
