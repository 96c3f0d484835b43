"""The executor: the state of one video being generated, and the chunk steps it runs as planned.

:class:`VideoRun` holds the KV cache, the clean latents of the frames the cache holds, the
streaming decoder and the drift state of one video; :meth:`VideoRun.make_chunk` runs one
:class:`~vidgen.pipelines.plan.PlannedChunk` as the planner laid it out -- its drift actions, its
noise levels (``sigmas``), and in diffusion forcing the model call it starts at
(``first_iteration``) -- then writes the finished chunk to the cache as context. Nothing here
computes a schedule: a chunk's levels and its stagger are read from the plan, as diffusers'
SkyReels-V2 diffusion-forcing loop reads its step matrix.

Every random draw comes from ``(seed, chunk or frame, purpose)``, so a chunk is the same whether the
video is streamed, collected or resumed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vidgen.config import GenerationConfig, VidgenConfig
from vidgen.models import KVCache
from vidgen.pipelines.denoiser import ChunkDenoiser, Conditioning
from vidgen.pipelines.drift import DriftMeasures, DriftMonitor, StatsAnchor
from vidgen.pipelines.plan import ChunkPlanner, DriftAction, GenerationMode, PlannedChunk
from vidgen.pipelines.scheduler import FlowSchedule
from vidgen.pipelines.vae_stream import spatial_factor, streaming_decoder, video_to_uint8
from vidgen.validation import InputError


@dataclass
class ChunkMetrics:
    denoise_seconds: float
    decode_seconds: float
    total_seconds: float
    """Wall time of this chunk, drift actions included."""
    video_seconds: float
    """Seconds of video the chunk adds."""
    real_time_factor: float
    """Video seconds made per wall second so far."""
    actions: list[str]
    drift: DriftMeasures | None = None


@dataclass
class ChunkResult:
    frames: np.ndarray
    latents: torch.Tensor
    metrics: ChunkMetrics


@dataclass
class _InFlight:
    """Diffusion forcing: a planned chunk being denoised, and its latents so far."""

    chunk: PlannedChunk
    latents: torch.Tensor


def _chunk_generator(seed: int, chunk: int, purpose: int, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device="cpu")
    generator.manual_seed((seed * 1_000_003 + chunk * 7_919 + purpose) % (2**63))
    return generator


def _randn(shape, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(device)


def flow_schedule(g: GenerationConfig, steps: int) -> FlowSchedule:
    """The sampler's schedule: the config's explicit timesteps, or ``steps`` shifted uniform levels."""
    try:
        return FlowSchedule(steps, g.shift, g.sampler, tuple(g.timesteps))
    except ValueError as err:
        raise InputError(str(err)) from None


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX-512 BF16 or AMX), from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def autocast_dtype(setting: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``runtime.autocast`` on ``device`` (None: off)."""
    if setting == "off":
        return None
    if setting == "bfloat16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if device.type == "cpu" and cpu_has_native_bf16() else None


def decode_to_frames(decoder, latents: torch.Tensor, latent_start: int) -> np.ndarray:
    """A chunk's (T, H, W, 3) uint8 frames from its latents, through a stateful streaming decoder
    (``vae_stream.streaming_decoder``) that has decoded the chunks before it."""
    video = decoder.decode(latents, latent_start)  # (1, 3, T, H, W) in [-1, 1]
    return video_to_uint8(video).cpu().numpy()


class VideoRun:
    """The state of one video being generated: cache, latent history, decoder, drift state, and in
    diffusion forcing the chunks in flight; :meth:`make_chunk` runs the planned chunks in order."""

    def __init__(
        self,
        pipe,
        config: VidgenConfig,
        planner: ChunkPlanner,
        latent_h: int,
        latent_w: int,
        guidance: float,
        seed: int,
        steps: int,
        decode: bool = True,
    ) -> None:
        g, d = config.generation, config.drift
        self.pipe = pipe
        self.config = config
        self.planner = planner
        self.seed = seed
        self.guidance = guidance
        self.latent_hw = (latent_h, latent_w)
        branches = 2 if guidance != 1.0 else 1
        self.cache: KVCache = pipe.transformer.make_kv_cache(
            batch_size=branches,
            latent_height=latent_h,
            latent_width=latent_w,
            sink_frames=g.sink_frames,
            window_frames=g.window_frames,
        )
        self.denoiser = ChunkDenoiser(
            pipe.transformer,
            flow_schedule(g, steps),
            rope_mode=g.rope_mode,
            context_noise=g.addnoise_condition,
            chunk_frames=g.chunk_frames,
            autocast=autocast_dtype(config.runtime.autocast, pipe.device),
            attention=g.attention,
        )
        self.history: dict[int, torch.Tensor] = {}  # latent frame -> (1, C, 1, h, w), the cached frames
        self.decoder = streaming_decoder(pipe.vae) if decode else None  # None: decoded elsewhere
        if self.decoder is not None:
            self.decoder.reset()
        self.anchor = (
            StatsAnchor(d.anchor_chunks, d.anchor_strength, d.anchor_tolerance) if d.anchor_stats else None
        )
        self.monitor = DriftMonitor(d.freeze_threshold) if d.monitor else None
        # diffusion forcing: the chunks being denoised (oldest first), the next model call's index
        # in the plan's iteration numbering, and the plan read ahead for the chunks that start early
        self.in_flight: list[_InFlight] = []
        self.iteration = 0
        self._ahead: Iterator[PlannedChunk] | None = None
        self._next_ahead: PlannedChunk | None = None

    # -------------------------------------------------------------- cache
    def _remember(self, latents: torch.Tensor, first_frame: int) -> None:
        for i in range(latents.shape[2]):
            self.history[first_frame + i] = latents[:, :, i : i + 1]
        held = set(self.cache.cached_frames)
        for frame in [f for f in self.history if f not in held]:
            del self.history[frame]

    def write(
        self, latents: torch.Tensor, first_frame: int, conditioning: Conditioning, purpose: int
    ) -> None:
        generator = _chunk_generator(self.seed, first_frame, purpose, latents.device)
        self.denoiser.write_context(latents, conditioning, self.cache, first_frame, generator)
        self._remember(latents, first_frame)

    @torch.no_grad()
    def recache(self, conditioning: Conditioning, purpose: int) -> None:
        """Rebuild the cache from the clean latents it holds, under ``conditioning``."""
        frames = sorted(self.history)
        self.cache.reset()
        chunk = self.config.generation.chunk_frames
        groups: list[list[int]] = []
        for frame in frames:  # contiguous runs, at most one chunk long
            if groups and frame == groups[-1][-1] + 1 and len(groups[-1]) < chunk:
                groups[-1].append(frame)
            else:
                groups.append([frame])
        history = dict(self.history)
        for group in groups:
            latents = torch.cat([history[f] for f in group], dim=2)
            self.write(latents, group[0], conditioning, purpose)

    @torch.no_grad()
    def prefill(self, prefix: torch.Tensor, negative: str) -> np.ndarray | None:
        """Write the clip's latents into the cache; returns its frames after the autoencoder round
        trip (None without a decoder here)."""
        first = next(iter(self.planner.chunks(None)))
        conditioning = self.pipe._conditioning(first, self.guidance, negative)
        chunk = self.config.generation.chunk_frames
        for start in range(0, prefix.shape[2], chunk):
            self.write(prefix[:, :, start : start + chunk], start, conditioning, purpose=3)
        # warm the streaming decoder so the continuation decodes seamlessly
        if self.decoder is None:
            return None
        return decode_to_frames(self.decoder, prefix, 0)

    # -------------------------------------------------------------- one chunk
    @torch.no_grad()
    def make_chunk(self, chunk: PlannedChunk, negative: str, callback) -> ChunkResult:
        pipe = self.pipe
        t0 = time.perf_counter()
        conditioning = pipe._conditioning(chunk, self.guidance, negative)
        actions = [a.value for a in chunk.actions]
        if DriftAction.REANCHOR in chunk.actions and self.anchor is not None:
            self.anchor.reset()
        if DriftAction.RECACHE_PROMPT in chunk.actions or DriftAction.RECACHE_PERIODIC in chunk.actions:
            self.recache(conditioning, purpose=2)

        latents = self._denoise(chunk, conditioning, callback)
        t1 = time.perf_counter()
        corrected = False
        if self.anchor is not None:
            latents, corrected = self.anchor.apply(latents)
            if corrected:
                actions.append("anchor_correction")
        self.write(latents, chunk.latent_start, conditioning, purpose=1)
        measures = self.monitor.measure(latents, self.anchor, corrected) if self.monitor is not None else None

        t2 = time.perf_counter()
        if self.decoder is not None:
            frames = decode_to_frames(self.decoder, latents, chunk.latent_start)
        else:
            s = spatial_factor(pipe.vae)
            frames = np.zeros((0, self.latent_hw[0] * s, self.latent_hw[1] * s, 3), dtype=np.uint8)
        t3 = time.perf_counter()
        metrics = ChunkMetrics(
            denoise_seconds=t1 - t0,
            decode_seconds=t3 - t2,
            total_seconds=t3 - t0,
            video_seconds=0.0,
            real_time_factor=0.0,
            actions=actions,
            drift=measures,
        )
        return ChunkResult(frames=frames, latents=latents, metrics=metrics)

    def _noise(self, chunk: PlannedChunk) -> torch.Tensor:
        h, w = self.latent_hw
        shape = (1, self.pipe.transformer.config.in_channels, chunk.latent_end - chunk.latent_start, h, w)
        device = self.pipe.device
        return _randn(shape, _chunk_generator(self.seed, chunk.index, 0, device), device)

    def _denoise(self, chunk: PlannedChunk, conditioning: Conditioning, callback) -> torch.Tensor:
        pipe = self.pipe

        def on_step(index: int, sigma: float, latents: torch.Tensor):
            if callback is None:
                return
            result = callback(pipe, index, sigma * 1000.0, {"latents": latents, "chunk": chunk.index})
            if isinstance(result, dict) and "latents" in result:
                latents.copy_(result["latents"])

        if self.planner.mode == GenerationMode.DIFFUSION_FORCING:
            return self._denoise_pipelined(chunk, conditioning, on_step)
        step_generator = _chunk_generator(self.seed, chunk.index, 4, pipe.device)
        return self.denoiser.denoise(
            self._noise(chunk),
            conditioning,
            self.cache,
            chunk.latent_start,
            generator=step_generator,
            callback=on_step,
            sigmas=chunk.sigmas,
        )

    # -------------------------------------------------------------- diffusion forcing
    def _peek_ahead(self) -> PlannedChunk:
        """The next planned chunk not yet in flight (the plan, read ahead of the chunk loop)."""
        if self._ahead is None:
            self._ahead = self.planner.chunks(None)
        if self._next_ahead is None:
            self._next_ahead = next(self._ahead)
        return self._next_ahead

    def _take_ahead(self) -> PlannedChunk:
        chunk = self._peek_ahead()
        self._next_ahead = None
        return chunk

    def _denoise_pipelined(self, chunk: PlannedChunk, conditioning: Conditioning, on_step) -> torch.Tensor:
        """Diffusion forcing: the planned chunks in flight at staggered noise levels, one model call
        advancing all of them; a chunk joins at its ``first_iteration`` and takes its level from its
        own ``sigmas``. Returns ``chunk``, whose last step is run here (the oldest in flight)."""
        schedule = self.denoiser.schedule
        last = chunk.first_iteration + len(chunk.sigmas) - 2  # the model call of its last step
        while self.iteration <= last:
            while self._peek_ahead().first_iteration <= self.iteration:
                ahead = self._take_ahead()
                self.in_flight.append(_InFlight(ahead, self._noise(ahead)))
            if self.in_flight[0].chunk.index == chunk.index:
                # the loop's own copy of the chunk: a prompt changed while it waited is in it
                _check_same_steps(self.in_flight[0].chunk, chunk)
                self.in_flight[0].chunk = chunk
            it = self.iteration
            x = torch.cat([f.latents for f in self.in_flight], dim=2)
            sigmas = torch.cat(
                [
                    torch.full(
                        (1, f.latents.shape[2]), f.chunk.sigmas[it - f.chunk.first_iteration], device=x.device
                    )
                    for f in self.in_flight
                ],
                dim=1,
            )
            velocity = self.denoiser.predict(
                x, sigmas, conditioning, self.cache, self.in_flight[0].chunk.latent_start
            )
            offset = 0
            for f in self.in_flight:
                s = it - f.chunk.first_iteration
                n = f.latents.shape[2]
                generator = _chunk_generator(self.seed, f.chunk.index, 10 + s, f.latents.device)
                f.latents = schedule.step_between(
                    f.latents,
                    velocity[:, :, offset : offset + n],
                    f.chunk.sigmas[s],
                    f.chunk.sigmas[s + 1],
                    generator,
                )
                offset += n
                if f.chunk.index == chunk.index:
                    on_step(s, f.chunk.sigmas[s], f.latents)
            self.iteration += 1
        finished = self.in_flight.pop(0)
        if finished.chunk.index != chunk.index:
            raise RuntimeError(
                f"diffusion forcing finished chunk {finished.chunk.index}, expected {chunk.index}"
            )
        return finished.latents

    # -------------------------------------------------------------- resume
    def save(self, path: str | os.PathLike, chunk_index: int) -> None:
        extra = {
            "chunk_index": torch.tensor([chunk_index]),
            "seed": torch.tensor([self.seed]),
            "iteration": torch.tensor([self.iteration]),
        }
        for frame, latents in self.history.items():
            extra[f"history.{frame}"] = latents.cpu()
        for key, value in (self.decoder.state() if self.decoder is not None else {}).items():
            extra[f"decoder.{key}"] = value.cpu()
        if self.anchor is not None:
            extra.update({f"anchor.{k}": v.cpu() for k, v in self.anchor.state().items()})
        for order, f in enumerate(self.in_flight):
            extra[f"in_flight.{order}.{f.chunk.index}"] = f.latents.cpu()
        tmp = Path(str(path) + ".tmp")
        self.cache.save(tmp, extra=extra)
        os.replace(tmp, path)

    def load(self, path: str | os.PathLike) -> int:
        """Take up the state saved at ``path``; returns the index of the last chunk it holds."""
        cache, extra = KVCache.load(path, device=self.pipe.device)
        if tuple(cache.k.shape) != tuple(self.cache.k.shape):
            raise InputError(f"{path} was saved with different settings (cache {tuple(cache.k.shape)})")
        if int(extra["seed"][0]) != self.seed:
            raise InputError(f"{path} was saved with seed {int(extra['seed'][0])}, this run uses {self.seed}")
        self.cache = cache
        device = self.pipe.device
        self.history = {
            int(k.split(".")[1]): v.to(device) for k, v in extra.items() if k.startswith("history.")
        }
        if self.decoder is not None:
            self.decoder.load_state(
                {k[len("decoder.") :]: v.to(device) for k, v in extra.items() if k.startswith("decoder.")}
            )
        if self.anchor is not None:
            self.anchor.load_state(
                {k[len("anchor.") :]: v.to(device) for k, v in extra.items() if k.startswith("anchor.")}
            )
        chunk_index = int(extra["chunk_index"][0])
        self._resume_in_flight(extra, chunk_index)
        return chunk_index

    def _resume_in_flight(self, extra: dict[str, torch.Tensor], chunk_index: int) -> None:
        """The chunks in flight, as the plan has them, with their saved latents; the plan read
        ahead up to the first chunk not yet started."""
        self.iteration = int(extra["iteration"][0])
        saved = sorted(
            (int(key.split(".")[1]), int(key.split(".")[2]), value)
            for key, value in extra.items()
            if key.startswith("in_flight.")
        )
        latents = {index: value.to(self.pipe.device) for _, index, value in saved}
        self.in_flight = []
        self._ahead, self._next_ahead = None, None
        if self.planner.mode != GenerationMode.DIFFUSION_FORCING:
            return
        while self._peek_ahead().index <= chunk_index:
            self._take_ahead()
        while self._peek_ahead().index in latents:
            chunk = self._take_ahead()
            self.in_flight.append(_InFlight(chunk, latents.pop(chunk.index)))
        if latents:
            raise InputError(f"the saved state holds chunks {sorted(latents)} that this plan does not start")


def _check_same_steps(planned: PlannedChunk, chunk: PlannedChunk) -> None:
    """The plan read ahead and the chunk loop must agree on what a chunk runs."""
    fields = ("latent_start", "latent_end", "first_iteration", "sigmas")
    if any(getattr(planned, f) != getattr(chunk, f) for f in fields):
        raise RuntimeError(f"chunk {chunk.index}: the plan changed its steps while it was in flight")
