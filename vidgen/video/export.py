"""``export_to_video``: a pipeline's frames, in any of its output types, to an MP4 file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from vidgen.video.encoding import FrameRate, Upscale
from vidgen.video.mp4 import write_mp4


def as_uint8_frames(frames: Any) -> np.ndarray:
    """(T, H, W, 3) uint8 from what ``LongVideoPipeline.__call__`` returns: ``np`` (float in
    [0, 1]), ``pt`` ((T, 3, H, W) float tensor), ``pil`` (a list of images), or uint8 frames."""
    if isinstance(frames, (list, tuple)) and frames and hasattr(frames[0], "convert"):
        frames = np.stack([np.asarray(image.convert("RGB")) for image in frames])
    elif hasattr(frames, "detach"):  # a torch tensor, (T, 3, H, W)
        tensor = frames.detach().cpu()
        if tensor.ndim != 4 or tensor.shape[1] != 3:
            raise ValueError(f"a tensor video must be (T, 3, H, W), got {tuple(tensor.shape)} (latents?)")
        frames = tensor.permute(0, 2, 3, 1).float().numpy()
    array = np.asarray(frames)
    if array.dtype == np.uint8:
        return array
    if not np.issubdtype(array.dtype, np.floating):
        raise TypeError(f"frames must be uint8 or float in [0, 1], got {array.dtype}")
    return (np.clip(array, 0.0, 1.0) * 255.0).round().astype(np.uint8)


def export_to_video(
    frames: Any, path: str | os.PathLike, fps: FrameRate = 16, *, upscale: Upscale | int | None = None
) -> Path:
    """Write ``frames`` as an H.264 MP4 at ``path`` (atomically) and return the path, as diffusers'
    ``export_to_video`` does. ``upscale``: a factor (nearest) or ``Upscale(4, "lanczos")``."""
    return write_mp4(path, as_uint8_frames(frames), fps, upscale=upscale)
