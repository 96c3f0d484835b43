"""Training the default model's causal transformer on Shapes World with diffusion forcing.

Each sample is laid out exactly as the pipeline's rolling KV cache presents context at generation
time: ``sink_frames`` latent frames from the start of a clip, then, after a random gap, the
``window_frames`` that precede a chunk and the chunk itself, at rope positions 0, 1, 2, ... Every
chunk has its own noise level (diffusion forcing) under a block-causal mask, so one forward
teaches the model to make a first chunk from text alone and later chunks from noisy or clean
context. Half the samples give the context a small noise level only, as the pipeline's
``addnoise_condition`` does.

Prompt changes (storyboards): the text is the pair ``[prompt ‖ previous prompt]``. While a change
is fresh (the pipeline's transition), the pair holds the new and the old prompt and the model must
apply what changed -- a new direction too, from wherever the object is. Otherwise it holds the
same prompt twice, and the motion comes from the context: a named direction is the direction at
the start, and after a bounce the object rightly moves against it. Frames that show the old prompt
are context only (no loss).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vidgen.attention import AttentionPattern
from vidgen.models import CausalWanTransformer
from vidgen.models.autoencoder import AutoencoderKLLite
from vidgen.models.text_encoders import MiniLMTextEncoder
from vidgen.pipelines.scheduler import shift_sigma, timestep_of
from vidgen.shapes import captions, world
from vidgen.shapes.prompts import parse_prompt
from vidgen.training.checkpoint import load_transformer
from vidgen.training.configs import TransformerTrainConfig
from vidgen.training.data import clips_to_tensor
from vidgen.training.grow import grow
from vidgen.training.loop import TrainingRun

# ----------------------------------------------------------------------------- samples


@dataclass
class Sample:
    frames: np.ndarray  # (1 + 4 * (L - 1), S, S, 3): frame 0, then the frames of latent frames g..
    masks: np.ndarray  # (1 + 4 * (L - 1), S, S) object coverage of those frames
    text: str
    previous_text: str
    loss_chunks: list[bool]
    other_shape_frames: np.ndarray | None = None  # the same frames with another shape (shape_contrast)
    oversize_frames: np.ndarray | None = None  # the same frames with the object far too large (oversize_swap)
    lag_frames: np.ndarray | None = None  # the same frames with the object some frames behind (lag_swap)
    turned_frames: np.ndarray | None = None  # from the same start in another direction (turn_swap)
    other_direction_frames: np.ndarray | None = None  # the same, for direction_contrast's weight
    own_context: bool = False  # its context chunks are the model's own estimates (self_context)
    false_start: str | None = None  # "still" or "drift": its first chunk is a false start (false_start)
    wall_hold: int = 0  # video frames its object is held at a wall before bouncing (wall_hold)

    @property
    def forced_swap_frames(self) -> np.ndarray | None:
        """The frames a forced swap noises instead (oversize, lag or turn, the first there), if any."""
        for frames in (self.oversize_frames, self.lag_frames, self.turned_frames):
            if frames is not None:
                return frames
        return None


def _video_frames_of_latent(index: int) -> tuple[int, int]:
    """Video frame range of latent frame ``index`` (latent 0 holds frame 0 alone)."""
    return (0, 1) if index == 0 else (1 + 4 * (index - 1), 1 + 4 * index)


def _changed_scene(rng: np.random.Generator, scene: world.Scene, attributes: tuple[str, ...]) -> world.Scene:
    count = 1 + int(rng.random() < 0.25)
    picked = rng.choice(len(attributes), size=min(count, len(attributes)), replace=False)
    changes = {}
    for i in picked:
        attribute = attributes[int(i)]
        options = [v for v in world.choices(attribute) if v != getattr(scene, attribute)]
        changes[attribute] = str(rng.choice(options))
    return scene.replace(**changes)


def fixed_sample_rng(config: TransformerTrainConfig, index: int) -> np.random.Generator:
    """The generator that makes fixed sample ``index`` of an ``overfit_clips`` run."""
    return np.random.default_rng([config.seed, 1 << 40, index])


def sample_rng(config: TransformerTrainConfig, step: int, index: int) -> np.random.Generator:
    """The stream of sample ``index`` of step ``step`` when the samples are drawn in worker
    processes (``data_workers``): each its own, so the batch does not depend on the workers."""
    return np.random.default_rng([config.seed, step, index])


def _ignore_stop_signals() -> None:
    # Ctrl-C reaches the whole process group: the trainer saves the step in flight and closes
    # the pool, which a worker killed by the signal would have broken first
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _worker_samples(config: TransformerTrainConfig, step: int, indices: range) -> list[Sample]:
    samples = [make_sample(sample_rng(config, step, i), config) for i in indices]
    for sample in samples:
        # the training reads the masks only through latent_object_weight's threshold: sent as
        # booleans (a quarter of the bytes, a sixth of a sample's), they weight the same cells
        sample.masks = sample.masks > OBJECT_COVERAGE
    return samples


class SampleWorkers:
    """Draws and renders the batches of the coming steps in ``config.data_workers`` processes
    (spawned: the parent may hold a CUDA context), ``ahead`` steps ahead of the one taken."""

    def __init__(self, config: TransformerTrainConfig, ahead: int = 2, per_task: int = 4) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.config = config
        self.ahead = ahead
        self.spans = [
            range(lo, min(lo + per_task, config.batch_size)) for lo in range(0, config.batch_size, per_task)
        ]
        self.executor = ProcessPoolExecutor(
            config.data_workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_ignore_stop_signals,
        )
        self.pending: dict[int, list] = {}

    def take(self, step: int) -> list[Sample]:
        """Step ``step``'s samples, in index order (and the next steps' set going)."""
        for s in range(step, step + self.ahead + 1):
            if s not in self.pending:
                self.pending[s] = [
                    self.executor.submit(_worker_samples, self.config, s, span) for span in self.spans
                ]
        for stale in [s for s in self.pending if s < step]:  # none, unless a caller skips steps
            for future in self.pending.pop(stale):
                future.cancel()
        return [sample for future in self.pending.pop(step) for sample in future.result()]

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.pending = {}


def _draw_scene(rng: np.random.Generator, config: TransformerTrainConfig) -> world.Scene:
    """A scene; with ``shape_weights``, its shape redrawn by them (drawn only when asked: a run
    without it keeps its random stream)."""
    scene = world.sample_scene(rng)
    if config.shape_weights:
        scene = scene.replace(
            shape=str(rng.choice(world.SHAPES, p=shape_probabilities(config.shape_weights)))
        )
    return scene


BOUNCE_TRIES = 32
"""Starts drawn by :func:`bounce_start` before it gives up."""
WALL_HOLD_FRAMES = (4, 12)
"""The fewest and most video frames ``wall_hold`` holds an object at a wall."""


def turn_frames(velocity: np.ndarray) -> np.ndarray:
    """The frames of a path's velocities (T, 2) whose step is the first after a bounce."""
    return np.flatnonzero((np.sign(velocity[1:]) != np.sign(velocity[:-1])).any(axis=1)) + 1


def bounce_start(
    rng: np.random.Generator, scene: world.Scene, num_frames: int, first: int, last: int | None = None
) -> tuple[float, float] | None:
    """A start the spec allows (:func:`world.start_range`) from which ``scene``'s object bounces off
    a wall at a frame from ``first`` to ``last`` (default ``num_frames - 1``): uniform among such
    starts, by rejection; None when none of ``BOUNCE_TRIES`` draws does (a slow object may not
    reach a wall by then)."""
    last = num_frames - 1 if last is None else last
    if last < first:
        return None
    (x_lo, x_hi), (y_lo, y_hi) = world.start_range(scene)
    for _ in range(BOUNCE_TRIES):
        start = (float(rng.uniform(x_lo, x_hi)), float(rng.uniform(y_lo, y_hi)))
        turns = turn_frames(world.trajectory(scene, num_frames, start)[1])
        if ((turns >= first) & (turns <= last)).any():
            return start
    return None


def _held_at_wall(clip: world.Clip, turn: int, hold: int) -> world.Clip:
    """``clip`` with its object held ``hold`` frames where it bounces (frame ``turn - 1``, the last
    before its step away), then going on along its path from there."""
    t = np.arange(len(clip.centers))
    source = np.where(t < turn, t, np.maximum(t - hold, turn - 1))
    return world.retrace(clip, clip.centers[source])


def _turned_clip(
    rng: np.random.Generator, scene: world.Scene, clip: world.Clip, config: TransformerTrainConfig
) -> tuple[world.Scene, world.Clip]:
    """The object of ``clip`` from its start in another of the eight directions (the scene, the clip)."""
    direction = str(rng.choice([d for d in world.DIRECTIONS if d != scene.direction]))
    turned = scene.replace(direction=direction)
    return turned, world.render_clip(turned, len(clip.frames), size=config.size, start=tuple(clip.centers[0]))


def make_sample(rng: np.random.Generator, config: TransformerTrainConfig) -> Sample:
    c, s, w = config.chunk_frames, config.sink_frames, config.window_frames
    gap = 0 if rng.random() < 0.3 else int(rng.integers(1, config.max_gap + 1))
    first_window = s + gap  # latent index of the first window frame in the source clip
    latent_indices = list(range(s)) + list(range(first_window, first_window + w + c))
    num_chunks = len(latent_indices) // c
    total_frames = _video_frames_of_latent(latent_indices[-1])[1]

    scene = _draw_scene(rng, config)
    kind = rng.choice(
        ["plain", "transition", "late", "gap"],
        p=_kind_probabilities(config, gap),
    )
    change_latent = None  # latent index (in the source clip) where the new prompt starts
    if kind == "transition":
        # the change falls on one of the last two chunk starts (its first second)
        change_latent = first_window + w + c - c * int(rng.integers(1, 3))
        new = _changed_scene(rng, scene, world.ATTRIBUTES)
    elif kind == "late":
        change_latent = first_window + w + c - c * int(rng.integers(1, 3))
        new = _changed_scene(rng, scene, ("color", "shape", "size", "background"))
    elif kind == "gap":
        change_latent = int(rng.integers(s, first_window + 1))
        new = _changed_scene(rng, scene, world.ATTRIBUTES)
    else:
        new = scene

    hold = turn = 0
    if change_latent is None:
        start = None
        target_frame = _video_frames_of_latent(latent_indices[-c])[0]  # the target chunk's first
        window_frame = _video_frames_of_latent(latent_indices[s])[0]
        if config.wall_hold > 0 and rng.random() < config.wall_hold:  # drawn only when asked
            hold = int(rng.integers(WALL_HOLD_FRAMES[0], WALL_HOLD_FRAMES[1] + 1))
            # a bounce in the window, held so that the target chunk shows the object leaving
            start = bounce_start(rng, scene, total_frames, window_frame + 1, target_frame - hold)
            hold = hold if start is not None else 0
        elif config.bounce_focus > 0 and rng.random() < config.bounce_focus:  # drawn only when asked
            start = bounce_start(rng, scene, total_frames, target_frame)
        clip = world.render_clip(scene, total_frames, size=config.size, rng=rng, start=start)
        if hold:
            turns = turn_frames(clip.velocity)
            turn = int(turns[turns > window_frame][0])
            clip = _held_at_wall(clip, turn, hold)
    else:
        change_frame = _video_frames_of_latent(change_latent)[0]
        clip = world.render_clip(
            [(0.0, scene), (change_frame / world.FPS, new)], total_frames, size=config.size, rng=rng
        )
    picked = [0] + [f for i in latent_indices[1:] for f in range(*_video_frames_of_latent(i))]
    frames = clip.frames[picked]
    masks = clip.masks[picked]
    other_shape_frames = None
    if config.shape_contrast > 0 or config.shape_swap > 0:
        # one shape for every scene of the clip: a change of shape inside it stays a change
        other = str(rng.choice([s for s in world.SHAPES if s != clip.scenes[-1].shape]))
        other_shape_frames = world.redraw(clip, config.size, shape=other)[picked]

    if kind == "transition":
        # one omission pattern for both captions: a direction left out of one is not a change
        (_, previous), (_, text) = captions.storyboard_captions(
            [(0.0, scene), (1.0, new)], rng, paraphrase=True
        )
    elif rng.random() < 0.2:
        text = previous = captions.caption(new)  # the canonical template
    else:
        text = previous = captions.caption(new, rng, paraphrase=True)
    if rng.random() < config.caption_dropout:
        text = previous = ""
    oversize_frames = None
    # drawn only when asked (a run without it keeps its random stream), for captioned samples: a
    # dropped caption names no size
    if config.oversize_swap > 0 and text and rng.random() < config.oversize_swap:
        oversize_frames = world.redraw(clip, config.size, scale=config.oversize_scale)[picked]
    lag_frames = None
    if config.lag_swap > 0 and text and oversize_frames is None and rng.random() < config.lag_swap:
        lag = int(rng.integers((config.lag_frames + 1) // 2, config.lag_frames + 1))
        behind = clip.centers[np.maximum(np.arange(len(clip.centers)) - lag, 0)]
        lag_frames = world.redraw(clip, config.size, centers=behind)[picked]
    # a caption that names no direction allows every direction
    sets_off = (
        bool(text)
        and gap == 0
        and change_latent is None
        and not hold
        and parse_prompt(text).direction is not None
    )

    false_start = None
    if (
        config.false_start > 0  # drawn only when asked: keeps a run's stream
        and sets_off
        and oversize_frames is None
        and lag_frames is None
        and rng.random() < config.false_start
    ):
        false_start = "still" if rng.random() < config.false_start_still else "drift"
        clip = _false_start_clip(rng, scene, clip, false_start, _video_frames_of_latent(c - 1)[1] - 1)
        frames, masks = clip.frames[picked], clip.masks[picked]
        if other_shape_frames is not None:
            other_shape_frames = world.redraw(clip, config.size, shape=other)[picked]
        sets_off = False  # the other start-of-clip draws (turn, contrast) assume a true start

    turned_frames = None
    if (
        config.turn_swap > 0
        and sets_off
        and oversize_frames is None
        and lag_frames is None
        and rng.random() < config.turn_swap
    ):
        turned_frames = _turned_clip(rng, scene, clip, config)[1].frames[picked]
    other_direction_frames = None
    if config.direction_contrast > 0 and sets_off:  # drawn only when asked: keeps a run's stream
        other_direction_frames = _turned_clip(rng, scene, clip, config)[1].frames[picked]
    if change_latent is None:
        loss_chunks = [True] * num_chunks
    else:
        loss_chunks = [latent_indices[k * c] >= change_latent for k in range(num_chunks)]
    if hold:
        # a chunk that shows the object held (frames turn .. turn + hold - 1 repeat the one before)
        # is a context the sampler may make, not one to learn
        for k in range(num_chunks):
            first = _video_frames_of_latent(latent_indices[k * c])[0]
            last = _video_frames_of_latent(latent_indices[k * c + c - 1])[1]
            if first < turn + hold and turn < last:
                loss_chunks[k] = False
    if false_start == "drift":
        loss_chunks[0] = False  # a context the sampler may make, not a start to learn
    # drawn only when asked; a context of the old prompt or without a caption has nothing to estimate
    own_context = bool(
        config.self_context > 0 and text and all(loss_chunks) and rng.random() < config.self_context
    )
    return Sample(
        frames=frames,
        masks=masks,
        text=text,
        previous_text=previous,
        loss_chunks=loss_chunks,
        other_shape_frames=other_shape_frames,
        oversize_frames=oversize_frames,
        lag_frames=lag_frames,
        turned_frames=turned_frames,
        other_direction_frames=other_direction_frames,
        own_context=own_context,
        false_start=false_start,
        wall_hold=hold,
    )


def _false_start_clip(
    rng: np.random.Generator, scene: world.Scene, clip: world.Clip, kind: str, hold: int
) -> world.Clip:
    """``clip`` set off ``hold`` frames late: until frame ``hold`` (the first chunk's last frame) the
    object holds still at its start (``kind`` "still") or drifts into it at its speed from another of
    the eight directions ("drift"; kept inside the canvas), then follows the clip's path. A path of
    the same clip delayed, so the caption's direction still holds for a second before any wall."""
    t = np.arange(len(clip.centers))
    centers = clip.centers[np.maximum(t - hold, 0)].copy()
    if kind == "drift":
        other = scene.replace(
            direction=str(rng.choice([d for d in world.DIRECTIONS if d != scene.direction]))
        )
        half = scene.side / 2.0
        early = t <= hold
        drift = clip.centers[0] + (t[early, None] - hold) * np.asarray(other.velocity)
        centers[early] = np.clip(drift, half, 1.0 - half)
    return world.retrace(clip, centers)


@dataclass
class DirectionPair:
    """A clip start (``sink_frames + window_frames + chunk_frames`` latent frames, no gap) and the
    same object from the same place setting off another of the eight ways, with their captions: the
    same phrasing and omissions, but for the direction, which both name."""

    frames: np.ndarray
    turned_frames: np.ndarray
    text: str
    turned_text: str


def make_direction_pair(rng: np.random.Generator, config: TransformerTrainConfig) -> DirectionPair:
    """One ``direction_pairs`` pair (a fifth with the canonical caption, as ``make_sample``)."""
    latent_frames = config.sink_frames + config.window_frames + config.chunk_frames
    total_frames = _video_frames_of_latent(latent_frames - 1)[1]
    scene = _draw_scene(rng, config)
    clip = world.render_clip(scene, total_frames, size=config.size, rng=rng)
    turned_scene, turned = _turned_clip(rng, scene, clip, config)
    if rng.random() < 0.2:
        text, turned_text = captions.caption(scene), captions.caption(turned_scene)
    else:
        omit = captions.random_omissions(scene, rng, direction=False)
        state = rng.bit_generator.state  # one draw of the phrasing for both captions
        text = captions.caption(scene, rng, paraphrase=True, omit=omit)
        rng.bit_generator.state = state
        turned_text = captions.caption(turned_scene, rng, paraphrase=True, omit=omit)
    return DirectionPair(clip.frames, turned.frames, text, turned_text)


def direction_pair_loss(
    forward: Callable[..., tuple[torch.Tensor, ...]],
    latents: torch.Tensor,
    turned_latents: torch.Tensor,
    text: torch.Tensor,
    turned_text: torch.Tensor,
    config: TransformerTrainConfig,
    generator: torch.Generator,
) -> torch.Tensor:
    """The ``direction_pairs`` term. Both halves of a pair get the same input: the mean of the two
    clips' latents noised to a level per chunk (drawn as the plain loss draws it, mapped onto
    ``[direction_pair_sigma_min, 1]``; every chunk in the loss, no clean context); one
    block-causal forward over both halves, each under its own caption. The loss is the mean squared
    error of the difference of the two clean estimates (``noisy - sigma * prediction``) against
    ``z - z'``, over the mean square of ``z - z'``. With one input, only the captions can tell the
    two estimates apart (inputs noised from each clip would let the model read the direction off the
    input instead): a model that ignores the caption's direction scores 1."""
    pairs, _, frames, height, width = latents.shape
    c = config.chunk_frames
    u = torch.rand(pairs, frames // c, generator=generator).to(latents.device)
    sigma = shift_sigma(u, config.sigma_shift)
    sigma = config.direction_pair_sigma_min + (1 - config.direction_pair_sigma_min) * sigma
    s = sigma.repeat_interleave(c, dim=1)[:, None, :, None, None]  # (P, 1, F, 1, 1)
    noise = torch.randn(latents.shape, generator=generator).to(latents.device)
    noisy = ((1 - s) * (latents + turned_latents) / 2 + s * noise).repeat(2, 1, 1, 1, 1)
    c_p = config.model["patch_size"]
    pattern = AttentionPattern.block_causal((height // c_p[1]) * (width // c_p[2]), c)
    pred = forward(
        noisy,
        timestep_of(sigma.repeat_interleave(c, dim=1).repeat(2, 1)),
        torch.cat([text, turned_text]),
        attention_pattern=pattern,
        return_dict=False,
    )[0].float()
    estimate = noisy - s.repeat(2, 1, 1, 1, 1) * pred
    wanted = latents - turned_latents
    error = (estimate[:pairs] - estimate[pairs:]) - wanted
    return error.square().mean() / wanted.square().mean().clamp(min=1e-8)


def _kind_probabilities(config: TransformerTrainConfig, gap: int) -> list[float]:
    gap_p = config.gap_change_prob if gap > 0 else 0.0
    changes = [config.transition_prob, config.late_appearance_prob, gap_p]
    return [1.0 - sum(changes)] + changes


# ----------------------------------------------------------------------------- model pieces


def load_autoencoder(path: str | Path) -> AutoencoderKLLite:
    vae = AutoencoderKLLite.from_pretrained(str(path)).eval().requires_grad_(False)
    if vae.config.latents_mean is None or vae.config.latents_std is None:
        raise ValueError(f"{path}: the autoencoder has no latents_mean/latents_std; run finalize first")
    return vae


def latent_stats(vae) -> tuple[torch.Tensor, torch.Tensor]:
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    return mean, std


def text_pair(encoder: MiniLMTextEncoder, texts: list[str], previous: list[str]) -> torch.Tensor:
    """Cross-attention input ``[prompt ‖ previous prompt]``: (B, 2 * max_length, 384)."""
    return torch.cat([encoder(texts), encoder(previous)], dim=1)


def text_pair_batched(encoder: MiniLMTextEncoder, texts: list[str], previous: list[str]) -> torch.Tensor:
    """``text_pair`` with the distinct prompts of a batch encoded in one call.

    Training captions are paraphrased, so a cache rarely hits, and one encoder call per prompt
    costs ~2x one batched call on this CPU. (Inference encodes prompt by prompt for bit-exact
    embeddings across processes; training needs no such guarantee.)
    """
    unique = list(dict.fromkeys([*texts, *previous]))
    embedded = dict(zip(unique, encoder.encode_uncached(unique)))
    return torch.cat(
        [torch.stack([embedded[t] for t in texts]), torch.stack([embedded[p] for p in previous])], dim=1
    )


class GuidanceTeacher:
    """The guidance term of guidance distillation (``TransformerTrainConfig.guidance_scale``):
    ``(scale - 1) * (teacher(x, caption) - teacher(x, no caption))``, the frozen teacher run once on
    both texts (the pipeline's unconditional text, the pair ``"" ‖ ""``). Zero for a sample whose
    caption was dropped, whose text is that pair: the unconditional prediction stays unguided."""

    def __init__(
        self, teacher: CausalWanTransformer, scale: float, uncond_text: torch.Tensor, compile: bool = False
    ) -> None:
        self.teacher = teacher.eval().requires_grad_(False)
        # compiled as the trained model is: the teacher's forward is ~40 % of a step in eager mode
        self.forward = torch.compile(self.teacher) if compile else self.teacher
        self.scale = scale
        self.uncond_text = uncond_text  # (1, L, D)

    @torch.no_grad()
    def term(
        self, noisy: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, pattern: AttentionPattern
    ) -> torch.Tensor:
        uncond = self.uncond_text.to(text.dtype).expand(text.shape[0], -1, -1)
        both = self.forward(
            torch.cat([noisy, noisy]),
            torch.cat([timestep, timestep]),
            torch.cat([text, uncond]),
            attention_pattern=pattern,
            return_dict=False,
        )[0].float()
        cond, free = both.chunk(2)
        return (self.scale - 1.0) * (cond - free)


def diffusion_forcing_loss(
    model: CausalWanTransformer | Callable,
    latents: torch.Tensor,
    text: torch.Tensor,
    loss_chunks: torch.Tensor,
    config: TransformerTrainConfig,
    generator: torch.Generator,
    object_weight: torch.Tensor | None = None,
    guidance: GuidanceTeacher | None = None,
    guidance_where: torch.Tensor | None = None,
    other_shape_latents: torch.Tensor | None = None,
    forced_swap: torch.Tensor | None = None,
    *,
    own_context: torch.Tensor | None = None,
    context_latents: torch.Tensor | None = None,
) -> torch.Tensor:
    """Flow-matching loss with an independent noise level per chunk, block-causal attention;
    ``object_weight`` (B, F, h, w) weights the latent cells of the object, or (B, C, F, h, w) each
    latent value; ``guidance`` adds its guidance term to the target (guidance distillation), only
    on the latent cells where ``guidance_where`` (B, F, h, w) is true if it is given.

    With ``other_shape_latents`` (the clip redrawn with another shape) and ``config.shape_swap``,
    a share of the samples noise those latents instead on their loss chunks at sigma >=
    ``config.shape_swap_sigma``; the target stays the one whose clean estimate ``noisy - sigma *
    target`` is the captioned clip's latents. ``forced_swap`` (B,) bool swaps those samples
    whatever the draw (their ``other_shape_latents`` hold the ``oversize_swap`` or ``lag_swap`` clip).

    ``own_context`` (B,) bool marks the samples whose context chunks (all but the last, lightly
    noised as a clean context is) are ``context_latents`` -- the model's own estimates
    (``own_context_estimates``) -- and leave the loss; their last chunk is unchanged."""
    batch, _, frames, height, width = latents.shape
    device = latents.device
    c = config.chunk_frames
    num_chunks = frames // c
    # every draw from the CPU generator, then moved: the noise does not depend on the device
    u = torch.rand(batch, num_chunks, generator=generator).to(device)
    sigma = shift_sigma(u, config.sigma_shift)
    clean_context = (torch.rand(batch, generator=generator) < config.clean_context_prob).to(device)
    if own_context is not None:
        clean_context = clean_context | own_context
    small = (torch.rand(batch, num_chunks, generator=generator) * config.context_sigma_max).to(device)
    context_mask = torch.zeros(batch, num_chunks, dtype=torch.bool, device=device)
    context_mask[clean_context, :-1] = True
    context_mask |= ~loss_chunks  # frames of the old prompt are context
    sigma = torch.where(context_mask, small, sigma)
    sigma_frames = sigma.repeat_interleave(c, dim=1)  # (B, F)

    noise = torch.randn(latents.shape, generator=generator).to(device)
    s = sigma_frames[:, None, :, None, None]
    noisy = (1 - s) * latents + s * noise
    target = noise - latents
    if own_context is not None and context_latents is not None:
        estimated = own_context[:, None] & context_mask  # (B, chunks)
        e = estimated.repeat_interleave(c, dim=1)[:, None, :, None, None]
        noisy = torch.where(e, (1 - s) * context_latents + s * noise, noisy)
        loss_chunks = loss_chunks & ~estimated
    if other_shape_latents is not None and (config.shape_swap > 0 or forced_swap is not None):
        # drawn after the noise: a run without the swap keeps its random stream
        swapped = (torch.rand(batch, generator=generator) < config.shape_swap).to(device)
        if forced_swap is not None:
            swapped = swapped | forced_swap
        where = swapped[:, None] & ~context_mask & (sigma >= config.shape_swap_sigma)  # (B, chunks)
        w = where.repeat_interleave(c, dim=1)[:, None, :, None, None]
        noisy = torch.where(w, (1 - s) * other_shape_latents + s * noise, noisy)
        # the x0 that noisy - s * target recovers is still the captioned clip's
        target = torch.where(w, (noisy - latents) / s.clamp(min=1e-3), target)
    c_p = config.model["patch_size"]
    pattern = AttentionPattern.block_causal((height // c_p[1]) * (width // c_p[2]), c)
    timestep = timestep_of(sigma_frames)
    if guidance is not None:
        term = guidance.term(noisy, timestep, text, pattern)
        if guidance_where is not None:
            term = term * guidance_where[:, None].to(term.dtype)
        target = target + term
    pred = model(noisy, timestep, text, attention_pattern=pattern, return_dict=False)[0]
    diff = pred.float() - target  # (B, C, F, h, w)
    err = diff.square()
    cells = None
    if object_weight is not None:
        cells = object_weight[:, None] if object_weight.ndim == 4 else object_weight
        err = err * cells
    err = err.mean(dim=(1, 3, 4))  # (B, F)
    weight = loss_chunks.repeat_interleave(c, dim=1).float()
    loss = (err * weight).sum() / weight.sum().clamp(min=1)
    if config.temporal_weight > 0 and frames > 1:
        # the clean estimate's error (noisy - s * pred against the clip) changing between frames
        jitter = (s * diff).diff(dim=2).square()  # (B, C, F - 1, h, w)
        if cells is not None:
            jitter = jitter * torch.maximum(cells[:, :, 1:], cells[:, :, :-1])
        pairs = weight[:, 1:] * weight[:, :-1]  # both frames in the loss
        jitter = jitter.mean(dim=(1, 3, 4))  # (B, F - 1)
        loss = loss + config.temporal_weight * (jitter * pairs).sum() / pairs.sum().clamp(min=1)
    return loss


@torch.no_grad()
def own_context_estimates(
    model: CausalWanTransformer | Callable,
    latents: torch.Tensor,
    text: torch.Tensor,
    config: TransformerTrainConfig,
    generator: torch.Generator,
) -> torch.Tensor:
    """``latents`` with every chunk but the last replaced by the model's one-step estimate of it,
    chunk by chunk as a rollout makes them: chunk k is the clip's chunk noised to a level drawn from
    ``config.self_context_sigma_min``..``_max`` and estimated against the estimates of chunks < k,
    which it sees at timestep 0 as the pipeline caches its finished chunks."""
    return rollout_estimates(
        model,
        latents,
        text,
        config.chunk_frames,
        (config.self_context_sigma_min, config.self_context_sigma_max),
        tuple(config.model["patch_size"]),
        generator,
        chunks=latents.shape[2] // config.chunk_frames - 1,
    )


def rollout_estimates(
    model: CausalWanTransformer | Callable,
    latents: torch.Tensor,
    text: torch.Tensor,
    chunk_frames: int,
    sigma_range: tuple[float, float],
    patch_size: tuple[int, ...],
    generator: torch.Generator,
    chunks: int | None = None,
) -> torch.Tensor:
    """``latents`` (B, C, F, h, w) with its first ``chunks`` chunks (default: all) replaced by the
    model's one-step estimates, as :func:`own_context_estimates` describes (noise levels drawn
    uniformly from ``sigma_range``, one per sample and chunk)."""
    batch, _, frames, height, width = latents.shape
    device = latents.device
    c = chunk_frames
    chunks = frames // c if chunks is None else chunks
    low, high = sigma_range
    sigma = (low + (high - low) * torch.rand(batch, chunks, generator=generator)).to(device)
    noise = torch.randn(latents[:, :, : chunks * c].shape, generator=generator).to(device)
    pattern = AttentionPattern.block_causal((height // patch_size[1]) * (width // patch_size[2]), c)
    out = latents.clone()
    for k in range(chunks):
        here = slice(k * c, (k + 1) * c)
        s = sigma[:, k, None, None, None, None]
        noisy = (1 - s) * latents[:, :, here] + s * noise[:, :, here]
        sigma_frames = torch.cat(
            [torch.zeros(batch, k * c, device=device), sigma[:, k, None].expand(batch, c)], dim=1
        )
        pred = model(
            torch.cat([out[:, :, : k * c], noisy], dim=2),
            timestep_of(sigma_frames),
            text,
            attention_pattern=pattern,
            return_dict=False,
        )[0]
        out[:, :, here] = noisy - s * pred[:, :, -c:].float()
    return out


def shape_contrast_weight(
    latents: torch.Tensor, other_shape_latents: torch.Tensor, strength: float, per_sample_cap: float = 0.0
) -> torch.Tensor:
    """(B, C, F, h, w) weights ``1 + strength * |z - z'|`` (capped at 3 latent stds), scaled to mean 1,
    where ``z'`` encodes the same clip with another shape (or, for ``direction_contrast``, the same
    start in another direction): large exactly on the values that carry the shape (the direction),
    so the loss cannot be lowered much while it is wrong. The mean is kept at 1 so
    that the loss scale (and gradient clipping) stay as without it.

    ``per_sample_cap`` > 0 scales each sample's ``|z - z'|`` to the batch's mean per-sample amount
    (by at most that factor up or down): a small object's shape is fewer, smaller latent values,
    so without it the shapes of small objects get less of the extra weight than large ones'. A
    sample whose two versions are the same gets no extra weight (one weight throughout)."""
    contrast = (latents - other_shape_latents).abs().clamp(max=3.0)
    if per_sample_cap > 0:
        amount = contrast.flatten(1).mean(dim=1)  # (B,)
        scale = amount.mean() / amount.clamp(min=1e-12)
        scale = scale.clamp(min=1.0 / per_sample_cap, max=per_sample_cap)
        contrast = contrast * scale.view(-1, *([1] * (contrast.dim() - 1)))
    weight = 1.0 + strength * contrast
    return weight / weight.mean()


OBJECT_COVERAGE = 0.05
"""A pixel whose object coverage is above this counts as the object's (``latent_object_weight``)."""


def latent_object_weight(masks: torch.Tensor, temporal: int, spatial: int, strength: float) -> torch.Tensor:
    """``1 + strength`` on latent cells the object covers (and their neighbours), 1 elsewhere.

    masks: (B, 1 + t*k, S, S) coverage (or coverage > ``OBJECT_COVERAGE`` as 0/1: the same weights)
    -> (B, 1 + k, S/s, S/s). The object is a few percent of a
    frame; weighting its cells makes the model learn its colour, shape and motion sooner. The
    weighted regression has the same minimiser, per element, as the plain one.
    """
    first, rest = masks[:, :1], masks[:, 1:]
    grouped = torch.cat([first, rest.unflatten(1, (-1, temporal)).amax(dim=2)], dim=1)  # (B, 1 + k, S, S)
    cells = torch.nn.functional.max_pool2d(grouped, spatial)  # (B, 1 + k, S/s, S/s)
    near = torch.nn.functional.max_pool2d(cells, 3, stride=1, padding=1)
    return 1.0 + strength * (near > OBJECT_COVERAGE).float()


# ----------------------------------------------------------------------------- loop


def caption_velocities(
    texts: Sequence[str], config: TransformerTrainConfig, temporal: int, spatial: int
) -> torch.Tensor:
    """(B, 2) the velocity each caption names, as ``--text-velocity`` learns it: latent-grid rows
    and columns per latent frame (the named direction at the named speed, the default speed when
    none is named); zero for a caption that names no direction and for a dropped one."""
    patch_h = dict(config.model).get("patch_size", (1, 2, 2))[1]
    cells_per_canvas = config.size / (spatial * patch_h)
    out = torch.zeros(len(texts), 2)
    for i, text in enumerate(texts):
        if not text:
            continue
        spec = parse_prompt(text)
        if spec.direction is None:
            continue
        ux, uy = world.DIRECTIONS[spec.direction]
        per_frame = world.SPEEDS[spec.speed or world.DEFAULT_SPEED] * cells_per_canvas * temporal
        out[i] = torch.tensor([uy * per_frame, ux * per_frame])
    return out


def _parameter_groups(model: CausalWanTransformer, config: TransformerTrainConfig) -> list[dict]:
    """One group, or one more for each added part that learns at its own rate: the position table
    (``spatial_pos_lr_scale``, no weight decay) and the text modulation
    (``text_modulation_lr_scale``) and the text velocity (``text_velocity_lr_scale``); ``lr_scale``
    is read by the training loop's schedule."""
    for name in ("spatial_pos_lr_scale", "text_modulation_lr_scale", "text_velocity_lr_scale"):
        if getattr(config, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(config, name)}")
    own: list[dict] = []
    if getattr(model, "spatial_pos", None) is not None and config.spatial_pos_lr_scale != 1.0:
        own.append(
            {"params": [model.spatial_pos], "lr_scale": config.spatial_pos_lr_scale, "weight_decay": 0.0}
        )
    if getattr(model, "text_to_modulation", None) is not None and config.text_modulation_lr_scale != 1.0:
        own.append(
            {
                "params": list(model.text_to_modulation.parameters()),
                "lr_scale": config.text_modulation_lr_scale,
            }
        )
    if getattr(model, "text_to_velocity", None) is not None and config.text_velocity_lr_scale != 1.0:
        assert model.velocity_gain is not None  # made together
        own.append(
            {
                "params": [*model.text_to_velocity.parameters(), model.velocity_gain],
                "lr_scale": config.text_velocity_lr_scale,
            }
        )
    apart = {id(p) for group in own for p in group["params"]}
    return [{"params": [p for p in model.parameters() if id(p) not in apart]}, *own]


@functools.lru_cache(maxsize=8)  # parsed once, not for every sample
def shape_probabilities(weights: str) -> np.ndarray:
    """``circle:square:triangle`` relative weights (``--shape-weights``) as probabilities over
    ``world.SHAPES``; ValueError, in one line, for anything else."""
    parts = weights.split(":")
    try:
        values = np.array([float(p) for p in parts])
    except ValueError:
        values = np.array([])
    if (
        len(values) != len(world.SHAPES)
        or not np.all(np.isfinite(values))
        or (values < 0).any()
        or values.sum() <= 0
    ):
        raise ValueError(
            f"--shape-weights takes {len(world.SHAPES)} non-negative numbers, not all 0, as "
            f"{':'.join(world.SHAPES)} (e.g. 1:1:2), got {weights!r}"
        )
    return values / values.sum()


def check_config(config: TransformerTrainConfig) -> None:
    """Raise ValueError, in one line, for settings that cannot train."""
    if config.shape_weights:
        shape_probabilities(config.shape_weights)
    if config.guidance_scale != 1.0 and not config.guidance_teacher:
        raise ValueError(
            "--guidance-scale needs --guidance-teacher: the frozen model whose guidance is distilled"
        )
    if config.oversize_swap > 0 and config.oversize_scale <= 1:
        raise ValueError(f"--oversize-scale must be above 1 (a larger object), got {config.oversize_scale}")
    if config.lag_swap > 0 and config.lag_frames < 1:
        raise ValueError(f"--lag-frames must be at least 1 (video frames of lag), got {config.lag_frames}")
    if not 0 <= config.direction_pair_sigma_min < 1:
        raise ValueError(
            f"--direction-pair-sigma-min is a noise level: 0 to below 1, got {config.direction_pair_sigma_min}"
        )
    if config.direction_pairs < 0 or config.direction_pair_weight < 0:
        raise ValueError(
            "--direction-pairs (pairs per step) and --direction-pair-weight are 0 or more, got "
            f"{config.direction_pairs} and {config.direction_pair_weight}"
        )
    for name in ("shape_contrast", "direction_contrast", "temporal_weight"):
        if getattr(config, name) < 0:
            raise ValueError(
                f"--{name.replace('_', '-')} is an extra weight: 0 or more, got {getattr(config, name)}"
            )
    if config.shape_contrast_per_sample and config.shape_contrast_per_sample < 1:
        raise ValueError(
            "--shape-contrast-per-sample is the most a sample's contrast is scaled by: 0 (off) or at least 1, "
            f"got {config.shape_contrast_per_sample}"
        )
    for name in (
        "oversize_swap",
        "lag_swap",
        "turn_swap",
        "bounce_focus",
        "wall_hold",
        "self_context",
        "false_start",
        "false_start_still",
    ):
        if not 0 <= getattr(config, name) <= 1:
            raise ValueError(f"--{name.replace('_', '-')} is a share: 0 to 1, got {getattr(config, name)}")
    if config.data_workers < 0:
        raise ValueError(f"--data-workers is a number of processes: 0 or more, got {config.data_workers}")
    try:
        torch.device(config.device)
    except RuntimeError as err:
        raise ValueError(f"--device {config.device!r}: {err}") from None
    low, high = config.self_context_sigma_min, config.self_context_sigma_max
    if config.self_context > 0 and not 0 <= low <= high < 1:
        raise ValueError(
            f"--self-context-sigma-min/-max must satisfy 0 <= min <= max < 1, got {low} and {high}"
        )


def train_transformer(config: TransformerTrainConfig) -> Path:
    check_config(config)
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    device = torch.device(config.device)
    vae = load_autoencoder(config.autoencoder).to(device)
    mean, std = (t.to(device) for t in latent_stats(vae))
    temporal, spatial = vae.config.scale_factor_temporal, vae.config.scale_factor_spatial
    text_encoder = MiniLMTextEncoder.load(max_length=config.text_max_length, device=device)

    architecture = dict(config.model)
    if config.spatial_pos:
        _, p_h, p_w = architecture.get("patch_size", (1, 2, 2))
        architecture["spatial_pos_grid"] = (config.size // spatial // p_h, config.size // spatial // p_w)
    if config.text_modulation:
        architecture["text_modulation"] = True
    if config.text_velocity:
        architecture["text_velocity"] = True
    if config.num_layers:
        architecture["num_layers"] = config.num_layers
    if config.ffn_dim:
        architecture["ffn_dim"] = config.ffn_dim
    model = CausalWanTransformer(**architecture)
    if config.grow_from and not (Path(config.run_dir) / "latest" / "state.json").is_file():
        grown = grow(load_transformer(config.grow_from), architecture["num_layers"], architecture["ffn_dim"])
        missing = sorted(set(model.state_dict()) ^ set(grown.state_dict()))
        if missing:
            raise ValueError(
                f"--grow-from {config.grow_from}: its architecture differs from the run's in more than "
                f"depth and width (first differing tensor: {missing[0]}); pass the flags it was trained with"
            )
        model.load_state_dict(grown.state_dict())
    model = model.to(device)
    optimizer = torch.optim.AdamW(
        _parameter_groups(model, config), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.99)
    )
    run = TrainingRun(config, model, optimizer, lr_floor=0.1)
    guidance = None
    if config.guidance_scale != 1.0:
        guidance = GuidanceTeacher(
            load_transformer(config.guidance_teacher).to(device),
            config.guidance_scale,
            text_pair_batched(text_encoder, [""], [""]),
            compile=config.compile,
        )
    # inductor fuses the many small elementwise ops around the matmuls (~1.7x per CPU step here)
    forward = torch.compile(model) if config.compile else model
    if config.compile or device.type == "cuda":
        # the blocks' region resumes after a graph break once per layer index and grad mode (the
        # guidance teacher and the estimates run without gradients): past dynamo's default limit
        # of 8 the remaining layers would run eagerly. On CUDA the attention is compiled
        # FlexAttention, recompiled per grad mode and shape (the teacher's doubled batch, the
        # estimates' shorter contexts): past the limit it ran unfused (0.8 s a step at batch
        # 128 on an H200, eager model, measured)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    step_seconds = 0.0  # the previous step, logged with the share spent making its data
    autocast = functools.partial(torch.autocast, device.type, dtype=torch.bfloat16, enabled=config.bf16)
    workers = SampleWorkers(config) if config.data_workers > 0 and not config.overfit_clips else None
    try:
        while not run.done:
            started = time.perf_counter()
            rng = np.random.default_rng([config.seed, run.step])  # data is a function of the step: resumable
            generator = torch.Generator().manual_seed(config.seed * 1_000_003 + run.step)
            if config.overfit_clips:
                picks = [
                    (run.step * config.batch_size + i) % config.overfit_clips
                    for i in range(config.batch_size)
                ]
                samples = [make_sample(fixed_sample_rng(config, k), config) for k in picks]
            elif workers is not None:
                samples = workers.take(run.step)
            else:
                samples = [make_sample(rng, config) for _ in range(config.batch_size)]
            with torch.no_grad():
                clips = [s.frames for s in samples]
                other_shape = config.shape_contrast > 0 or config.shape_swap > 0
                if other_shape:  # both versions through the encoder in one batch
                    clips += [s.other_shape_frames for s in samples]
                forced = [k for k, s in enumerate(samples) if s.forced_swap_frames is not None]
                clips += [samples[k].forced_swap_frames for k in forced]  # and the oversize and lag swaps'
                turning = [k for k, s in enumerate(samples) if s.other_direction_frames is not None]
                clips += [samples[k].other_direction_frames for k in turning]  # and the direction contrast's
                video = clips_to_tensor(clips, device)
                # bf16 halves the encoder's time; the latents then get noise far above its rounding
                with autocast():
                    latents = vae.encode(video).latent_dist.mode().float()
                latents = (latents - mean) / std
                latents, forced_latents, turned_latents = latents.split(
                    [len(latents) - len(forced) - len(turning), len(forced), len(turning)]
                )
                other_shape_latents = None
                if other_shape:
                    latents, other_shape_latents = latents.chunk(2)
                text = text_pair_batched(
                    text_encoder, [s.text for s in samples], [s.previous_text for s in samples]
                )
            loss_chunks = torch.tensor([s.loss_chunks for s in samples], device=device)
            masks = torch.from_numpy(np.stack([s.masks for s in samples]).astype(np.float32, copy=False)).to(
                device
            )
            object_weight = None
            if config.object_weight > 0:
                object_weight = latent_object_weight(masks, temporal, spatial, config.object_weight)
            if config.shape_contrast > 0 and other_shape_latents is not None:
                contrast = shape_contrast_weight(
                    latents, other_shape_latents, config.shape_contrast, config.shape_contrast_per_sample
                )
                object_weight = contrast if object_weight is None else contrast * object_weight[:, None]
            if turning:  # a sample without the other direction's clip has nothing to tell apart
                other_direction = latents.clone()
                other_direction[turning] = turned_latents
                contrast = shape_contrast_weight(latents, other_direction, config.direction_contrast)
                object_weight = (
                    contrast
                    if object_weight is None
                    else contrast * (object_weight if object_weight.dim() == 5 else object_weight[:, None])
                )
            swap_latents = None
            if config.shape_swap > 0 and other_shape_latents is not None:
                # a sample without a caption has no shape to draw: its swap is the clip itself
                captioned = torch.tensor([bool(s.text) for s in samples], device=device)
                captioned = captioned[:, None, None, None, None]
                swap_latents = torch.where(captioned, other_shape_latents, latents)
            forced_swap = None
            if forced:  # these samples swap to the oversize, lag or turned clip instead (all captioned)
                swap_latents = (latents if swap_latents is None else swap_latents).clone()
                swap_latents[forced] = forced_latents
                forced_swap = torch.zeros(len(samples), dtype=torch.bool, device=device)
                forced_swap[forced] = True
            guidance_where = None
            if guidance is not None and config.guidance_region == "object":
                guidance_where = latent_object_weight(masks, temporal, spatial, 1.0) > 1.0
            data_seconds = time.perf_counter() - started
            own_context = context_latents = None
            if any(s.own_context for s in samples):
                own_context = torch.tensor([s.own_context for s in samples], device=device)
                # the whole batch, so the compiled model keeps its shapes
                with autocast():
                    context_latents = own_context_estimates(forward, latents, text, config, generator)
            model.train()
            with autocast():
                loss = diffusion_forcing_loss(
                    forward,
                    latents,
                    text,
                    loss_chunks,
                    config,
                    generator,
                    object_weight,
                    guidance,
                    guidance_where,
                    swap_latents,
                    forced_swap,
                    own_context=own_context,
                    context_latents=context_latents,
                )
            logged = {}
            if config.direction_pairs:
                pair_started = time.perf_counter()
                pairs = [make_direction_pair(rng, config) for _ in range(config.direction_pairs)]
                with torch.no_grad():
                    video = clips_to_tensor(
                        [p.frames for p in pairs] + [p.turned_frames for p in pairs], device
                    )
                    with autocast():
                        pair_latents = (vae.encode(video).latent_dist.mode().float() - mean) / std
                    texts = [p.text for p in pairs] + [p.turned_text for p in pairs]
                    pair_text = text_pair_batched(text_encoder, texts, texts)  # no prompt change
                data_seconds += time.perf_counter() - pair_started
                with autocast():
                    pair_loss = direction_pair_loss(
                        forward, *pair_latents.chunk(2), *pair_text.chunk(2), config, generator
                    )
                loss = loss + config.direction_pair_weight * pair_loss
                logged["pair"] = round(pair_loss.item(), 4)
            if getattr(model, "text_to_velocity", None) is not None and config.text_velocity_weight > 0:
                target = caption_velocities([s.text for s in samples], config, temporal, spatial).to(device)
                velocity_loss = (model.text_to_velocity(text.float()) - target).square().sum(dim=1).mean()
                loss = loss + config.text_velocity_weight * velocity_loss
                logged["vel"] = round(velocity_loss.item(), 4)
            if not run.update(loss, data_s=round(data_seconds, 3), step_s=round(step_seconds, 3), **logged):
                break
            step_seconds = time.perf_counter() - started
    finally:
        if workers is not None:
            workers.close()
    return run.finish()
