"""Shapes World batches rendered on the fly (no data set files): videos, object masks, captions.

Every batch is a pure function of a numpy Generator, so a run resumed at step N with the same seed
sees the same data it would have seen uninterrupted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vidgen.shapes import world
from vidgen.shapes.world import FPS, Clip


@dataclass
class VideoBatch:
    video: torch.Tensor
    """(B, 3, T, S, S) float in [-1, 1]."""
    masks: torch.Tensor
    """(B, T, S, S) object coverage in [0, 1]."""
    clips: list[Clip]


def clip_to_tensor(frames: np.ndarray) -> torch.Tensor:
    """(T, S, S, 3) uint8 -> (3, T, S, S) float in [-1, 1]."""
    return torch.from_numpy(frames).permute(3, 0, 1, 2).float().div(127.5).sub(1.0)


def clips_to_tensor(clips: list[np.ndarray], device: torch.device | str = "cpu") -> torch.Tensor:
    """``clip_to_tensor`` of a batch, (N, 3, T, S, S), the same values: the uint8 frames travel to
    ``device`` (a quarter of the bytes) and are converted there."""
    frames = torch.from_numpy(np.stack(clips)).to(device)
    return frames.permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0)


def sample_clip(
    rng: np.random.Generator,
    num_frames: int,
    size: int,
    *,
    storyboard_prob: float = 0.25,
    max_lead_in: int = 96,
    min_segment: float = 0.25,
) -> Clip:
    """A clip of ``num_frames`` cut from a longer rendering, so starts near walls and bounces occur;
    with probability ``storyboard_prob`` attributes change inside the clip."""
    lead_in = int(rng.integers(0, max_lead_in + 1))
    total = lead_in + num_frames
    changes = 0
    if rng.random() < storyboard_prob:
        changes = int(rng.integers(1, 3))
        seconds = total / FPS
        while changes and (changes + 1) * min_segment > seconds:
            changes -= 1
    if changes:
        source = world.sample_storyboard(rng, total / FPS, changes, min_segment=min_segment)
    else:
        source = world.sample_scene(rng)
    clip = world.render_clip(source, total, size=size, rng=rng)
    if lead_in == 0:
        return clip
    cut = slice(lead_in, total)
    return Clip(
        frames=clip.frames[cut],
        centers=clip.centers[cut],
        velocity=clip.velocity[cut],
        masks=clip.masks[cut],
        scene_index=clip.scene_index[cut],
        scenes=clip.scenes,
        starts=tuple(max(0, s - lead_in) for s in clip.starts),
        fps=clip.fps,
    )


def sample_video_batch(
    rng: np.random.Generator, batch_size: int, num_frames: int, size: int, **kw
) -> VideoBatch:
    clips = [sample_clip(rng, num_frames, size, **kw) for _ in range(batch_size)]
    video = torch.stack([clip_to_tensor(c.frames) for c in clips])
    masks = torch.stack([torch.from_numpy(c.masks) for c in clips])
    return VideoBatch(video=video, masks=masks, clips=clips)
