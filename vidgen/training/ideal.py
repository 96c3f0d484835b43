"""The ideal frame of a decoded Shapes World frame, for the distillation's frame term
(``vidgen train distill --frame-weight``).

The evaluator's frame rules (background, one object of the named colour, its area, its shape) have
an exact answer once the object's place is known: the caption's object drawn on the caption's
background. The frame term locates the object in the student's decoded frame (the soft centroid of
:mod:`vidgen.training.motion`), draws that answer there (:func:`ideal_frames`), and penalises the
decoded frame's distance from it, through the decoder, so that a blob of the wrong shape, a second
object or a tinted background pulls toward the frame the caption describes without moving the
object's path (the motion terms judge that)."""

from __future__ import annotations

import numpy as np
import torch

from vidgen.shapes.prompts import PromptSpec
from vidgen.shapes.world import BACKGROUNDS, COLORS, SIZES, Scene, draw_path, shape_area
from vidgen.training.motion import SoftTrack

SIDE_RANGE = (min(SIZES.values()), max(SIZES.values()))


def object_side(pixels: np.ndarray, spec: PromptSpec, present: np.ndarray) -> float:
    """The bounding-box side d (a fraction of S) of the ideal object for one video, ``pixels``
    (T, S, S, 3) in [-1, 1]: the named size's; with no size named, the side whose named shape has
    the area of the evaluator's object mask (rule 3: farther from the background than half the
    named colour's distance), the median over the frames ``present`` (T,) shows, within the sizes'
    range."""
    if spec.size is not None:
        return SIZES[spec.size]
    background = np.asarray(BACKGROUNDS[spec.background], dtype=np.float64) / 127.5 - 1
    color = np.asarray(COLORS[spec.color], dtype=np.float64) / 127.5 - 1
    half_contrast = np.linalg.norm(color - background) / 2
    if not present.any():
        return SIZES["medium"]
    frames = pixels[present]
    area = (np.linalg.norm(frames - background, axis=-1) > half_contrast).mean(axis=(1, 2))
    side = float(np.sqrt(np.median(area) / shape_area(spec.shape, 1.0)))
    return float(np.clip(side, *SIDE_RANGE))


def ideal_frames(
    pixels: torch.Tensor, specs: list[PromptSpec], track: SoftTrack
) -> tuple[torch.Tensor, torch.Tensor]:
    """For decoded frames ``pixels`` (B, 3, T, S, S) in [-1, 1] and their ``track``: the caption's
    object (colour, shape, side from :func:`object_side`) drawn on its background where the track
    puts the object, (B, 3, T, S, S) in [-1, 1] without gradient, and each video's side (B,).

    The track's centroid is the object's area centroid; the ideal is placed so that its own area
    centroid falls there (an apex-up triangle's sits d/6 below its box's centre), wholly inside the
    canvas. In a frame the track finds no object in, the ideal object sits where the nearest frame
    that shows one has it (the canvas centre when none does)."""
    size = pixels.shape[-1]
    frames = pixels.detach().float().permute(0, 2, 3, 4, 1).cpu().numpy()  # (B, T, S, S, 3)
    centroids = track.centroid.detach().cpu().numpy().astype(np.float64)
    present = track.present.cpu().numpy()
    ideals, sides = [], []
    for video, spec, centers, shown in zip(frames, specs, centroids, present, strict=True):
        side = object_side(video, spec, shown)
        centers = centers.copy()
        if not shown.all():
            shown_at = np.flatnonzero(shown)
            if len(shown_at):
                frame = np.arange(len(shown))
                nearest = shown_at[np.abs(frame[:, None] - shown_at[None]).argmin(axis=1)]
                centers = centers[nearest]
            else:
                centers[:] = 0.5
        if spec.shape == "triangle":
            centers[:, 1] -= side / 6
        centers = np.clip(centers, side / 2, 1 - side / 2)
        scene = Scene(spec.background, spec.color, spec.shape, "medium", "slow", "left")
        drawn, _ = draw_path(scene, centers, size, side=side)
        ideals.append(drawn)
        sides.append(side)
    ideal = torch.from_numpy(np.stack(ideals)).to(pixels.device).permute(0, 4, 1, 2, 3).float() / 127.5 - 1
    return ideal, torch.tensor(sides, device=pixels.device)


def frame_penalty(
    pixels: torch.Tensor, specs: list[PromptSpec], track: SoftTrack, judged: torch.Tensor
) -> torch.Tensor:
    """The squared distance of ``pixels`` (B, 3, T, S, S) from their ideal frames, summed over a
    frame and divided by the ideal object's area in pixels, the mean over the frames ``judged``
    (B, T) marks (0 with the graph when none): a wrong shape costs about its mismatched share of
    the object times the squared colour contrast."""
    ideal, sides = ideal_frames(pixels, specs, track)
    size = pixels.shape[-1]
    area = torch.tensor(
        [shape_area(spec.shape, float(side)) for spec, side in zip(specs, sides, strict=True)],
        device=pixels.device,
    ) * (size * size)
    error = (pixels.float() - ideal).square().sum(dim=(1, 3, 4)) / area[:, None]  # (B, T)
    return (error * judged).sum() / judged.sum().clamp(min=1)
