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

import json
import os
import time
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vidgen.config import GenerationConfig, VidgenConfig, cpu_has_native_bf16
from vidgen.models import KVCache, drop_cast_weights
from vidgen.pipelines.denoiser import ChunkDenoiser, Conditioning, write_held
from vidgen.pipelines.drift import DriftMeasures, DriftMonitor, StatsAnchor
from vidgen.pipelines.plan import ChunkPlanner, DriftAction, GenerationMode, PlannedChunk
from vidgen.pipelines.scheduler import FlowSchedule
from vidgen.pipelines.vae_stream import spatial_factor, streaming_decoder, video_to_uint8
from vidgen.validation import InputError

STATE_FORMAT = "vidgen-run-state-1"
"""The format of a saved generation state (:meth:`VideoRun.save`)."""


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
    cache_seconds: float = 0.0
    """Of ``total_seconds``: writing the chunk into the context (the cache pass) and the drift
    anchor and monitor."""


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
        # asked for every chunk: the model's answer walks its modules (diffusers), and no
        # device changes during a video
        self.device: torch.device = pipe.device
        # the linear layers' kept autocast weights are remade per video: weights changed in place
        # between videos (a LoRA fused through ``.data``) bump no version that would show it
        drop_cast_weights(pipe.transformer)
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
        # a group of frames in the cache -> the conditioning it was written under (write_held)
        self._written: dict[tuple[int, ...], Hashable] = {}
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
    def _hold(self, latents: torch.Tensor, first_frame: int) -> None:
        """Add a chunk's clean latents to the history and drop the frames the cache no longer
        holds: a frame keeps its sink or window slot until a later frame takes it."""
        for i in range(latents.shape[2]):
            self.history[first_frame + i] = latents[:, :, i : i + 1]
        held = self.cache.frames_kept(self.history)
        for frame in [f for f in self.history if f not in held]:
            del self.history[frame]

    @torch.no_grad()
    def rebuild_cache(self, chunk: PlannedChunk, conditioning: Conditioning, full: bool = False) -> None:
        """The one cache pass (:func:`~vidgen.pipelines.denoiser.write_held`): the cache brought to
        the clean latents of the frames it holds, under ``conditioning`` (``chunk``'s). Every write
        of context goes through here (after each chunk, for a clip, for a drift re-cache, on
        resume), and a window frame's keys and values depend on the sinks, its own chunk and the
        conditioning alone, so a resumed video rebuilds exactly the cache the uninterrupted one
        had from the few latents its state holds. After a chunk only that chunk is written;
        ``full`` (a clip, a re-cache, a resume) rewrites everything."""
        key = (chunk.prompt, chunk.previous_prompt, round(chunk.prompt_weight, 4))
        device = self.device
        self._written = write_held(
            self.denoiser,
            self.cache,
            self.history,
            conditioning,
            key,
            self._written,
            lambda first_frame: _chunk_generator(self.seed, first_frame, 1, device),
            full=full,
        )

    @torch.no_grad()
    def prefill(self, prefix: torch.Tensor, negative: str) -> np.ndarray | None:
        """Write the clip's latents into the cache; returns its frames after the autoencoder round
        trip (None without a decoder here)."""
        first = next(iter(self.planner.chunks(None)))
        self._hold(prefix, 0)
        self.rebuild_cache(first, self.pipe._conditioning(first, self.guidance, negative), full=True)
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
            self.rebuild_cache(chunk, conditioning, full=True)

        latents = self._denoise(chunk, conditioning, callback)
        t1 = time.perf_counter()
        corrected = False
        if self.anchor is not None:
            latents, corrected = self.anchor.apply(latents)
            if corrected:
                actions.append("anchor_correction")
        self._hold(latents, chunk.latent_start)
        self.rebuild_cache(chunk, conditioning)  # the chunk joins the context
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
            cache_seconds=t2 - t1,
        )
        return ChunkResult(frames=frames, latents=latents, metrics=metrics)

    def _noise(self, chunk: PlannedChunk) -> torch.Tensor:
        h, w = self.latent_hw
        shape = (1, self.pipe.transformer.config.in_channels, chunk.latent_end - chunk.latent_start, h, w)
        device = self.device
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
        step_generator = _chunk_generator(self.seed, chunk.index, 4, self.device)
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
    def _settings(self) -> dict:
        """What a saved state must agree with to be taken up by this run."""
        g = self.config.generation
        return {
            "latents": [self.pipe.transformer.config.in_channels, *self.latent_hw],
            "sink_frames": g.sink_frames,
            "window_frames": g.window_frames,
            "chunk_frames": g.chunk_frames,
            "guided": self.guidance != 1.0,
            "mode": self.planner.mode.value,
            "ar_step": g.ar_step,
        }

    def save(self, path: str | os.PathLike, chunk_index: int) -> None:
        """Save what determines the rest of the video after chunk ``chunk_index``: the clean latents
        of the frames the cache holds (not the cache: :meth:`load` rebuilds it), the chunks in
        flight, the position in the plan, and the anchor, monitor and decoder state. Written to a
        temporary file and renamed, so ``path`` always holds a whole state."""
        state = {
            "chunk_index": torch.tensor([chunk_index]),
            "seed": torch.tensor([self.seed]),
            "iteration": torch.tensor([self.iteration]),
        }
        for frame, latents in self.history.items():
            state[f"history.{frame}"] = latents
        for key, value in (self.decoder.state() if self.decoder is not None else {}).items():
            state[f"decoder.{key}"] = value
        if self.anchor is not None:
            state.update({f"anchor.{k}": v for k, v in self.anchor.state().items()})
        if self.monitor is not None:
            state.update({f"monitor.{k}": v for k, v in self.monitor.state().items()})
        for order, f in enumerate(self.in_flight):
            state[f"in_flight.{order}.{f.chunk.index}"] = f.latents
        # "extra." as in the files of earlier versions, which held the KV cache beside these
        tensors = {f"extra.{k}": v.detach().cpu().contiguous() for k, v in state.items()}
        metadata = {"format": STATE_FORMAT, "settings": json.dumps(self._settings())}
        tmp = Path(str(path) + ".tmp")
        save_file(tensors, os.fspath(tmp), metadata=metadata)
        os.replace(tmp, path)

    @torch.no_grad()
    def load(self, path: str | os.PathLike, negative: str) -> int:
        """Take up the state saved at ``path`` and rebuild the KV cache from its latents, as the
        chunk it was saved after left it; returns that chunk's index."""
        with safe_open(os.fspath(path), framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != STATE_FORMAT:
            raise InputError(
                f"{path} is not a generation state this vidgen can resume (format {meta.get('format')!r}); "
                "delete it to start the video over"
            )
        saved, settings = json.loads(meta["settings"]), self._settings()
        if saved != settings:
            changed = ", ".join(
                f"{k} {saved.get(k)!r} (now {v!r})" for k, v in settings.items() if saved.get(k) != v
            )
            raise InputError(f"{path} was saved with different settings ({changed})")
        device = self.device
        extra = {
            k.removeprefix("extra."): v for k, v in load_file(os.fspath(path), device=str(device)).items()
        }
        if int(extra["seed"][0]) != self.seed:
            raise InputError(f"{path} was saved with seed {int(extra['seed'][0])}, this run uses {self.seed}")

        def part(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix) :]: v for k, v in extra.items() if k.startswith(prefix)}

        self.history = {int(frame): latents for frame, latents in part("history.").items()}
        if self.decoder is not None:
            self.decoder.load_state(part("decoder."))
        if self.anchor is not None:
            self.anchor.load_state(part("anchor."))
        if self.monitor is not None:
            self.monitor.load_state(part("monitor."))
        chunk_index = int(extra["chunk_index"][0])
        done = next(c for c in self.planner.chunks(None) if c.index == chunk_index)
        self.rebuild_cache(done, self.pipe._conditioning(done, self.guidance, negative), full=True)
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
        latents = {index: value for _, index, value in saved}
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
