"""Tiny synthetic clips (64x64, a few dozen frames) and measurements shared by the video tests."""

from fractions import Fraction

import av
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

FPS = 16

FLAT_TOLERANCE = 2
"""Max RGB error on frames of one flat colour: only the 8-bit limited-range YUV round trip."""

INTERIOR_TOLERANCE = 16
"""Max RGB error >= 3 px away from any colour edge in moving-shape clips at the default crf
(measured 13). Nearer the edges yuv420p's 2x2 chroma blurs colours by up to ~130 levels."""

PALETTE = np.array(
    [(220, 40, 40), (40, 180, 60), (40, 80, 220), (240, 220, 40), (140, 60, 190), (40, 200, 210)]
    + [(0, 0, 0), (255, 255, 255), (128, 128, 128), (230, 215, 180), (255, 0, 0), (0, 255, 0), (0, 0, 255)],
    np.uint8,
)


def flat_colour_clip(num_frames: int = 26, size: int = 64) -> np.ndarray:
    """Frame t is one flat colour, PALETTE[t % len(PALETTE)]."""
    colours = PALETTE[np.arange(num_frames) % len(PALETTE)]
    return np.ascontiguousarray(np.broadcast_to(colours[:, None, None, :], (num_frames, size, size, 3)))


def moving_shapes(num_frames: int, seed: int = 0, height: int = 64, width: int = 64) -> np.ndarray:
    """Two flat squares sliding over a flat background; ``seed`` changes colours and positions."""
    rng = np.random.default_rng(seed)
    background, first, second = PALETTE[rng.choice(len(PALETTE), 3, replace=False)]
    frames = np.empty((num_frames, height, width, 3), np.uint8)
    frames[:] = background
    x0, y0 = rng.integers(0, width // 2), rng.integers(0, height // 2)
    for t in range(num_frames):
        x = (x0 + t) % (width - 16)
        frames[t, y0 : y0 + 16, x : x + 16] = first
        frames[t, height - 20 : height - 4, width - 20 - t // 2 : width - 4 - t // 2] = second
    return frames


def interior_mask(frames: np.ndarray, margin: int = 3) -> np.ndarray:
    """(T, H, W) True where every pixel within ``margin`` has the same colour."""
    padded = np.pad(frames, ((0, 0), (margin, margin), (margin, margin), (0, 0)), mode="edge")
    windows = sliding_window_view(padded, (2 * margin + 1, 2 * margin + 1), axis=(1, 2))
    return (windows == frames[..., None, None]).all(axis=(-1, -2)).all(-1)


def max_error(decoded: np.ndarray, original: np.ndarray, mask: np.ndarray | None = None) -> int:
    error = np.abs(decoded.astype(np.int16) - original.astype(np.int16)).max(-1)
    return int(error[mask].max() if mask is not None else error.max())


def packets(source) -> list[tuple[Fraction, bool]]:
    """(presentation time in seconds, is_keyframe) of every video packet, in file order."""
    with av.open(str(source) if not hasattr(source, "read") else source) as container:
        return [(p.pts * p.time_base, p.is_keyframe) for p in container.demux(video=0) if p.pts is not None]
