"""The diffusion denoiser: makes one chunk (or a few in flight) against the KV cache.

``denoise`` runs the sampler's steps of the transformer on a noisy chunk that attends to the cached
context; ``write_context`` then runs the transformer once more on the finished chunk -- clean, or
re-noised to a small level (``addnoise_condition``, which makes the model forgive its own small
errors in the context) -- with ``update_cache=True`` so the following chunks attend to it.

What that context pass attends to is ``generation.context_pass``: ``window`` (the published
systems) runs it against everything the cache holds (:meth:`ChunkDenoiser.write_context` as is,
and :func:`recache_window` for a re-cache); ``sinks`` writes every non-sink chunk seeing only the
sinks and itself (:func:`write_held`), so the cache is a function of the latents it holds.

Classifier-free guidance batches the conditional and unconditional branches together; the cache
then holds both (batch 2B), since their keys and values differ after the first cross-attention.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

import torch

from vidgen.attention import AttentionPattern
from vidgen.models import CausalWanTransformer, KVCache, RopePositionMode, TextContext
from vidgen.pipelines.batching import current_batcher
from vidgen.pipelines.scheduler import FlowSchedule, add_noise, timestep_of


@dataclass
class Conditioning:
    """Cross-attention context of one chunk: conditional, and unconditional when guiding."""

    cond: TextContext
    uncond: TextContext | None = None
    guidance_scale: float = 1.0

    @property
    def guided(self) -> bool:
        return self.uncond is not None and self.guidance_scale != 1.0

    def batched(self) -> TextContext:
        return (
            TextContext.cat([self.cond, self.uncond])
            if self.uncond is not None and self.guided
            else self.cond
        )


def context_groups(frames, chunk_frames: int) -> list[list[int]]:
    """The writes of one cache pass: ``frames`` in order, in contiguous runs of at most one chunk."""
    groups: list[list[int]] = []
    for frame in sorted(frames):
        if groups and frame == groups[-1][-1] + 1 and len(groups[-1]) < chunk_frames:
            groups[-1].append(frame)
        else:
            groups.append([frame])
    return groups


def write_held(
    denoiser: ChunkDenoiser,
    cache: KVCache,
    held: Mapping[int, torch.Tensor],
    conditioning: Conditioning,
    key: Hashable,
    written: dict[tuple[int, ...], Hashable],
    generator_of: Callable[[int], torch.Generator | None],
    full: bool = False,
) -> dict[tuple[int, ...], Hashable]:
    """The cache pass: bring ``cache`` to the clean latents ``held`` (latent frame -> (B, C, 1, h, w)),
    written under ``conditioning`` in contiguous runs of at most one chunk (groups); returns what
    the cache then holds (group -> ``key``), to pass back as ``written`` next time.

    The sinks are written in order, each group seeing the sink groups before it; every other group
    sees only the sinks and itself (:meth:`KVCache.sinks_only`). So a group's keys and values
    depend on the sinks, its own latents and the conditioning alone -- never on frames that have
    left the window -- and the cache is a function of ``held`` and ``key``. What ``written`` says is
    already there under the same ``key`` is kept (after a chunk, only that chunk is written); an
    empty ``written``, new sink groups, a new ``key`` or ``full`` rewrite everything. ``generator_of(first_frame)``: the
    context noise of a group (same group, same draw)."""
    groups = [tuple(g) for g in context_groups(held, denoiser.chunk_frames)]
    sinks = cache.sink_frames
    if full or not written or any(written.get(g) != key for g in groups if g[0] < sinks):
        cache.reset()
        written = {}
    for group in groups:
        if written.get(group) == key:
            continue
        latents = torch.cat([held[f] for f in group], dim=2)
        with contextlib.nullcontext() if group[0] < sinks else cache.sinks_only():
            denoiser.write_context(latents, conditioning, cache, group[0], generator_of(group[0]))
    return dict.fromkeys(groups, key)


def recache_window(
    denoiser: ChunkDenoiser,
    cache: KVCache,
    held: Mapping[int, torch.Tensor],
    conditioning: Conditioning,
    generator: torch.Generator | None = None,
) -> None:
    """LongLive's re-cache at a prompt switch (``context_pass = "window"``): one pass of the model at
    the context noise level over the latest frames, under ``conditioning`` (the new prompt), the
    frames attending to each other both ways (one call, no mask) and to the sinks.

    Its attention span is ``sinks + window + chunk`` latent frames (LongLive's ``local_attn_size``).
    While the video is no longer than that, every frame is re-written, the sinks included; past it,
    the sinks keep the keys and values they were written with and the newest ``window + chunk``
    frames are re-written (of which the cache keeps the newest ``window``: the oldest chunk of them
    leaves when the next chunk arrives, as in LongLive's cache). ``held``: latent frame -> clean
    (B, C, 1, h, w), holding at least the sinks and those newest frames."""
    sinks, window, chunk = cache.sink_frames, cache.window_frames, denoiser.chunk_frames
    end = max(held) + 1
    context: contextlib.AbstractContextManager[None]
    if end <= sinks + window + chunk:
        joint, context = list(range(end)), contextlib.nullcontext()
        cache.reset()
    else:
        joint, context = list(range(end - window - chunk, end)), cache.sinks_only()
    missing = [f for f in joint if f not in held]
    if missing:
        raise RuntimeError(f"the re-cache needs latent frames {missing}, which are no longer held")
    latents = torch.cat([held[f] for f in joint], dim=2)
    with context:
        denoiser.write_context(latents, conditioning, cache, joint[0], generator, joint=True)


class ChunkDenoiser:
    def __init__(
        self,
        model: CausalWanTransformer,
        schedule: FlowSchedule,
        *,
        rope_mode: RopePositionMode | str = RopePositionMode.ROLLING,
        context_noise: float = 0.0,
        chunk_frames: int = 1,
        autocast: torch.dtype | None = None,
        attention: str = "dense",
    ) -> None:
        self.model = model
        self.autocast = autocast
        self.schedule = schedule
        self.rope_mode = RopePositionMode(rope_mode)
        self.context_noise = context_noise
        self.chunk_frames = chunk_frames
        self.attention = attention
        """``dense`` or ``radial`` (``generation.attention``)."""

    def _pattern(
        self, latents: torch.Tensor, cache: KVCache, frame_offset: int, joint: bool = False
    ) -> AttentionPattern | None:
        """Dense: block-causal among several chunks in flight, one chunk sees everything it is given.
        Radial: the frame layout of [cached frames | these frames] for a radial pattern. ``joint``
        (a re-cache pass): every frame sees everything it is given."""
        if joint:
            return None
        frames, height, width = latents.shape[2:]
        if self.attention == "radial":
            return AttentionPattern.radial(
                self.model.latent_grid(height, width),
                cache.cached_frames + list(range(frame_offset, frame_offset + frames)),
                chunk_frames=self.chunk_frames,
                query_frames=frames,
                sink_frames=cache.sink_frames,
            )
        if frames <= self.chunk_frames:
            return None
        return AttentionPattern.block_causal(self.model.frame_tokens(height, width), self.chunk_frames)

    def predict(
        self,
        latents: torch.Tensor,
        sigmas: torch.Tensor,
        conditioning: Conditioning,
        cache: KVCache,
        frame_offset: int,
        update_cache: bool = False,
        joint: bool = False,
        position_shift: int | None = None,
    ) -> torch.Tensor:
        """Guided velocity for ``latents`` (B, C, F, h, w) at per-frame noise levels ``sigmas`` (B, F);
        ``joint``: the frames attend to each other both ways (a re-cache pass, Rolling Forcing's
        window); ``position_shift``: the model's, given explicitly."""
        guided = conditioning.guided
        x = torch.cat([latents, latents]) if guided else latents
        sig = torch.cat([sigmas, sigmas]) if guided else sigmas
        with torch.autocast(
            x.device.type, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None
        ):
            velocity = self._call_model(
                x, sig, conditioning, cache, frame_offset, update_cache, latents, joint, position_shift
            )
        velocity = velocity.float()
        if not guided:
            return velocity
        cond, uncond = velocity.chunk(2)
        return uncond + conditioning.guidance_scale * (cond - uncond)

    def _call_model(
        self,
        x,
        sig,
        conditioning,
        cache,
        frame_offset,
        update_cache,
        latents,
        joint=False,
        position_shift=None,
    ) -> torch.Tensor:
        kwargs = dict(
            hidden_states=x.to(self.model.dtype),
            timestep=timestep_of(sig).to(self.model.dtype),
            text_context=conditioning.batched(),
            kv_cache=cache,
            frame_offset=frame_offset,
            update_cache=update_cache,
            rope_mode=self.rope_mode,
            position_shift=position_shift,
            attention_pattern=self._pattern(latents, cache, frame_offset, joint),
        )
        batcher = current_batcher()  # a session stepped with others (vidgen.pipelines.batching)
        if batcher is not None:
            return batcher.call(self.model, kwargs)
        return self.model(**kwargs, return_dict=False)[0]

    @torch.no_grad()
    def denoise(
        self,
        noise: torch.Tensor,
        conditioning: Conditioning,
        cache: KVCache,
        frame_offset: int,
        generator: torch.Generator | None = None,
        callback=None,
        sigmas: list[float] | None = None,
    ) -> torch.Tensor:
        """All sampler steps for one chunk starting from pure ``noise``; returns clean latents.
        ``sigmas``: the chunk's noise levels as planned (default: the schedule's)."""
        levels = list(self.schedule.sigmas if sigmas is None else sigmas)
        latents = noise.float()
        batch, _, frames = latents.shape[:3]
        for index, (sigma, sigma_next) in enumerate(zip(levels, levels[1:])):
            sigmas_now = torch.full((batch, frames), sigma, device=latents.device)
            velocity = self.predict(latents, sigmas_now, conditioning, cache, frame_offset)
            latents = self.schedule.step_between(latents, velocity, sigma, sigma_next, generator)
            if callback is not None:
                callback(index, sigma, latents)
        return latents

    @torch.no_grad()
    def write_context(
        self,
        clean: torch.Tensor,
        conditioning: Conditioning,
        cache: KVCache,
        frame_offset: int,
        generator: torch.Generator | None = None,
        joint: bool = False,
    ) -> None:
        """Run the model on the finished chunk at the context noise level, writing its K/V; it
        attends to what ``cache`` shows and to itself (``joint``: its frames both ways)."""
        batch, _, frames = clean.shape[:3]
        sigma = self.context_noise
        context = clean
        if sigma > 0:
            noise = torch.randn(clean.shape, generator=generator, device=clean.device, dtype=clean.dtype)
            context = add_noise(clean, noise, sigma)
        sigmas = torch.full((batch, frames), sigma, device=clean.device)
        # the prediction itself is not needed, only the keys/values written on the way
        self.predict(context, sigmas, conditioning, cache, frame_offset, update_cache=True, joint=joint)
