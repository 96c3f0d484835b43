"""A differentiable measure of Shapes World motion on decoded frames, for the distillation's motion
term (``vidgen train distill --motion-weight``).

Shapes World objects move at constant velocity except where they bounce off a wall (the spec's
"Motion"); the evaluator's rule 8 fails a reversal anywhere else, and rule 6 a window slower than
0.4x the named speed. The evaluator measures on hard masks, which give no gradient; here the object
is a soft weight on every pixel, its distance from the caption's background colour beyond a noise
floor, and the position is that weight's centroid. Away from the walls its second difference
should be zero and its speed on each axis the caption's; both are penalised where the centroid is
far enough from every wall that no true bounce can fall inside the frames compared. On the axis an
axis-aligned caption leaves still, rule 8 fails any sideways wobble whose 5-frame average exceeds
0.002 S a frame both ways: the still term holds that average under half of it. An object whose
pixels reach a wall bounces off it in the world; the wall term makes it leave."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vidgen.shapes.motion import MOVING_AVERAGE, STILL, WALL_MARGIN
from vidgen.shapes.prompts import PromptSpec
from vidgen.shapes.world import BACKGROUNDS, DIRECTIONS, SPEEDS

NOISE_FLOOR = 0.25
"""Distance from the background (RGB in [-1, 1], 32 of 255 levels) below which a pixel weighs
nothing: the autoencoder's ripple on a flat background stays under it, every colour of the table
is at least 0.73 from every background."""
MIN_MASS = 0.002
"""The soft weight's sum over a frame, as a fraction of the frame's pixels, below which the frame
shows no object (half the smallest triangle at the weakest contrast weighs 0.0029)."""
STRONG = 0.25
"""The share of a frame's largest soft weight from which a pixel counts as the object's for its reach
(``SoftTrack.gap``): a circle's pixel at the wall it touches is only partly covered."""
SLOW = SPEEDS["slow"]
FAST = max(SPEEDS.values())


@dataclass
class SoftTrack:
    """Per frame of each video: the soft weight's ``centroid`` (B, T, 2) as (x, y) fractions of the
    side, with gradient; ``present`` (B, T) bool, ``half_extent`` (B, T, 2) and ``gap`` (B, T, 2, 2),
    all without. ``gap[..., a, 0]`` is the distance on axis ``a`` from the low wall (x = 0, y = 0) to
    the nearest pixel holding at least :data:`STRONG` of the frame's largest weight, ``gap[..., a,
    1]`` from the high wall; a frame showing no object has gaps of 1."""

    centroid: torch.Tensor
    present: torch.Tensor
    half_extent: torch.Tensor
    gap: torch.Tensor


def background_colors(specs: list[PromptSpec], device: torch.device | str = "cpu") -> torch.Tensor:
    """The captions' background colours as the decoder writes pixels: (B, 3) in [-1, 1]."""
    rgb = torch.tensor([BACKGROUNDS[spec.background] for spec in specs], dtype=torch.float32)
    return (rgb / 127.5 - 1.0).to(device)


def soft_track(pixels: torch.Tensor, background: torch.Tensor) -> SoftTrack:
    """``pixels`` (B, 3, T, S, S) in [-1, 1] (decoded), ``background`` (B, 3) likewise."""
    diff = pixels.float() - background[:, :, None, None, None].float()
    distance = (diff.square().sum(dim=1) + 1e-8).sqrt()  # (B, T, S, S)
    weight = torch.relu(distance - NOISE_FLOOR)
    side = pixels.shape[-1]
    pos = (torch.arange(side, dtype=weight.dtype, device=weight.device) + 0.5) / side
    mass = weight.sum(dim=(-2, -1))  # (B, T)
    safe = mass.clamp(min=1e-6)
    columns, rows = weight.sum(dim=-2), weight.sum(dim=-1)  # (B, T, S) along x and along y
    cx = (columns * pos).sum(-1) / safe
    cy = (rows * pos).sum(-1) / safe
    with torch.no_grad():
        # a flat shape of side d has variance d^2/12 on an axis: half its extent is sqrt(3 var)
        vx = (columns * (pos - cx[..., None]).square()).sum(-1) / safe
        vy = (rows * (pos - cy[..., None]).square()).sum(-1) / safe
        half = (3 * torch.stack([vx, vy], dim=-1)).sqrt()
        present = mass / (side * side) > MIN_MASS
        strong = weight >= STRONG * weight.amax(dim=(-2, -1), keepdim=True).clamp(min=1e-6)
        gaps = []
        for covered in (strong.any(dim=-2), strong.any(dim=-1)):  # (B, T, S): columns, rows
            index = torch.arange(side, device=weight.device).expand_as(covered)
            first = torch.where(covered, index, side).amin(-1)
            last = torch.where(covered, index, -1).amax(-1)
            gaps.append(torch.stack([first, side - 1 - last], dim=-1).float() / side)
        gap = torch.stack(gaps, dim=-2)
        gap = torch.where(present[..., None, None], gap, torch.ones_like(gap))
    return SoftTrack(torch.stack([cx, cy], dim=-1), present, half, gap)


def named_axis_speed(spec: PromptSpec) -> tuple[float, float] | None:
    """The caption's speed on each axis (fractions of the side per frame), ``None`` when it names no
    direction (then neither axis's speed is known)."""
    if spec.direction is None:
        return None
    speed = SPEEDS[spec.speed or "slow"]
    dx, dy = DIRECTIONS[spec.direction]  # unit vectors
    return abs(dx) * speed, abs(dy) * speed


def motion_penalties(
    track: SoftTrack, axis_speed: torch.Tensor, known: torch.Tensor, lag: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The constant-velocity and the speed penalty of ``track``, each the mean over the (video, frame,
    axis) entries it judges, in units of the slow speed's travel over ``lag`` frames (squared).

    - constant velocity: the centroid's second difference over ``lag`` frames;
    - speed: the first difference's magnitude over ``lag`` frames against ``axis_speed`` (B, 2) times
      ``lag`` (judged where ``known`` (B,) holds: the caption names a direction).

    An entry is judged only where every frame it compares shows an object whose centroid sits
    farther than its half extent plus ``WALL_MARGIN + lag * FAST`` from both walls of the axis: the
    farthest an object travels in ``lag`` frames, so no bounce falls between the frames."""
    c, present, half = track.centroid, track.present, track.half_extent
    margin = WALL_MARGIN + lag * FAST
    clear = (c.detach() - half > margin) & (1 - c.detach() - half > margin) & present[..., None]  # (B, T, 2)
    unit = SLOW * lag
    zero = c.sum() * 0.0
    if c.shape[1] > 2 * lag:
        second = (c[:, 2 * lag :] - 2 * c[:, lag:-lag] + c[:, : -2 * lag]) / unit
        judged = clear[:, 2 * lag :] & clear[:, lag:-lag] & clear[:, : -2 * lag]
        constant = (second.square() * judged).sum() / judged.sum().clamp(min=1)
    else:
        constant = zero
    if c.shape[1] > lag:
        first = (c[:, lag:] - c[:, :-lag]).abs() / unit
        target = axis_speed[:, None, :].to(c) * lag / unit
        judged = clear[:, lag:] & clear[:, :-lag] & known[:, None, None].to(clear.device)
        speed = ((first - target).square() * judged).sum() / judged.sum().clamp(min=1)
    else:
        speed = zero
    return constant, speed


def still_axes(spec: PromptSpec) -> tuple[bool, bool]:
    """The axes the caption's direction leaves still (right: y; down-left: neither; none named:
    neither, the object's own heading is not known)."""
    if spec.direction is None:
        return False, False
    dx, dy = DIRECTIONS[spec.direction]
    return dx == 0, dy == 0


STILL_FREE = 0.5
"""The still term's free band: a 5-frame average under this share of rule 8's 0.002 S a frame costs
nothing (the soft centroid is not the evaluator's hard-mask one: the margin covers the difference)."""


def still_penalty(track: SoftTrack, still: torch.Tensor) -> torch.Tensor:
    """Rule 8 on a still axis: the centroid's 5-frame average displacement ``(c[t+5] - c[t]) / 5``
    in units of the rule's 0.002 S a frame, beyond :data:`STILL_FREE` of it, squared; the mean over
    the (video, frame, axis) entries where ``still`` (B, 2) marks the axis and both frames show the
    object. An object that stays on its line costs nothing; one that drifts sideways at 0.009 S a
    frame (the shipped student's, traced) costs (4.5 - 0.5)^2 = 16 an entry."""
    c, present = track.centroid, track.present
    n = MOVING_AVERAGE
    if c.shape[1] <= n:
        return c.sum() * 0.0
    average = (c[:, n:] - c[:, :-n]) / (n * STILL)  # (B, T - n, 2)
    judged = still[:, None, :].to(present.device) & (present[:, n:] & present[:, :-n])[..., None]
    excess = torch.relu(average.abs() - STILL_FREE)
    return (excess.square() * judged).sum() / judged.sum().clamp(min=1)


WALL_TOUCH = 0.0
"""The wall term's contact: an object whose pixels (:data:`STRONG`) come within this of a wall
touches it (0: they reach the canvas's outermost row or column, where a pixel a third or more
covered by the object counts: the object is within two thirds of a pixel of the wall)."""
WALL_LAG = 8
"""Frames over which an object touching a wall must have left it."""
WALL_LEAVE = 0.25
"""The share of its axis's named travel over :data:`WALL_LAG` frames by which an object touching a
wall must have moved away from it. A world object two thirds of a pixel from the wall, still coming
in at the slow speed on a diagonal's axis (0.0071 S a frame), leaves by 0.63 of it: it costs
nothing."""


def wall_penalty(track: SoftTrack, axis_speed: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """Bounces (the spec's "Motion"): an object whose pixels touch a wall on an axis the caption
    moves along leaves it. Where frame ``t`` touches a wall (:data:`WALL_TOUCH`) and frames ``t`` and
    ``t + WALL_LAG`` show the object, its centroid must have moved away from that wall by
    :data:`WALL_LEAVE` of the axis's named travel ``axis_speed * WALL_LAG``; the shortfall, in units
    of that distance, squared: an object pressed against the wall costs 1 an entry, one that bounces
    nothing. The mean over the judged (video, frame, axis, wall) entries: ``known`` (B,) marks the
    captions naming a direction, an axis they leave still is not judged. The gradient moves the later
    frame's centroid only (the touching frame's is detached)."""
    c, present, gap = track.centroid, track.present, track.gap
    lag = WALL_LAG
    if c.shape[1] <= lag:
        return c.sum() * 0.0
    need = WALL_LEAVE * axis_speed.to(c) * lag  # (B, 2)
    moves = known[:, None].to(present.device) & (need > 0)  # (B, 2)
    both = (present[:, lag:] & present[:, :-lag])[..., None] & moves[:, None, :]  # (B, T - lag, 2)
    touch = gap[:, :-lag] <= WALL_TOUCH  # (B, T - lag, 2, 2): low wall, high wall
    step = c[:, lag:] - c[:, :-lag].detach()  # (B, T - lag, 2)
    away = torch.stack([step, -step], dim=-1)  # from the low wall: +, from the high wall: -
    safe = need.clamp(min=1e-6)[:, None, :, None]
    shortfall = torch.relu(1.0 - away / safe).square()
    judged = touch & both[..., None]
    return (shortfall * judged).sum() / judged.sum().clamp(min=1)
