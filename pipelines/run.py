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

Resume depends on ``generation.context_pass``. With ``sinks`` the cache is a function of the few
latents it holds, and a state holds just those. With ``window`` (the published systems) a chunk's
keys and values depend on every chunk before it, so a state holds the latents of every chunk made
since the last KV snapshot (``runtime.kv_snapshot_every``; none: since the start), and resuming
replays their context passes -- one model call per chunk instead of a chunk's several -- from the
snapshot: the same calls on the same inputs, so the same cache.
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

from vidgen.config import GenerationConfig, VidgenConfig, cpu_has_native_bf16
from vidgen.models import KVCache, drop_cast_weights
from vidgen.pipelines.denoiser import ChunkDenoiser, Conditioning, context_groups, recache_window, write_held
from vidgen.pipelines.drift import DriftMeasures, DriftMonitor, StatsAnchor
from vidgen.pipelines.plan import ChunkPlanner, DriftAction, GenerationMode, PlannedChunk
from vidgen.pipelines.scheduler import FlowSchedule
from vidgen.pipelines.state_file import StateFileError, file_digest, read_state, write_state
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
        num_frames: int | None = None,
    ) -> None:
        g, d = config.generation, config.drift
        self.num_frames = num_frames
        """The video's length (None: without end): the chunks in flight stop at its last chunk."""
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
        self.window_context = g.context_pass == "window"
        # window: what a state holds to replay the cache (see the module's docstring); the stream
        # turns keep_replay on when it saves states, so a live video's memory stays bounded
        self.keep_replay = False
        self.replay: dict[int, torch.Tensor] = {}
        self.snapshot_every = config.runtime.kv_snapshot_every
        self._snapshot_chunk = -1
        self._snapshot_digest: str | None = None  # of the snapshot file, recorded in the state
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
        holds: a frame keeps its sink or window slot until a later frame takes it. With the
        ``window`` context pass, the newest chunk before the window stays too: LongLive's re-cache
        reads ``window + chunk`` frames (:func:`recache_window`)."""
        for i in range(latents.shape[2]):
            clean = latents[:, :, i : i + 1]
            self.history[first_frame + i] = clean
            if self.keep_replay and self.window_context:
                self.replay[first_frame + i] = clean
        held = self.cache.frames_kept(self.history)
        if self.window_context:
            g = self.config.generation
            newest = max(self.history)
            held |= {f for f in self.history if f > newest - g.window_frames - g.chunk_frames}
        for frame in [f for f in self.history if f not in held]:
            del self.history[frame]

    def _context_generator(self, first_frame: int) -> torch.Generator:
        return _chunk_generator(self.seed, first_frame, 1, self.device)

    @torch.no_grad()
    def _write_chunk(self, chunk: PlannedChunk, conditioning: Conditioning, latents: torch.Tensor) -> None:
        """The finished chunk joins the context: with the ``window`` context pass it is run against
        everything the cache holds, as Self Forcing, CausVid and LongLive write it; with ``sinks``,
        through the cache pass (:meth:`rebuild_cache`)."""
        if not self.window_context:
            self.rebuild_cache(chunk, conditioning)
            return
        start = chunk.latent_start
        generator = self._context_generator(start)
        if self.planner.mode == GenerationMode.ROLLING_FORCING:  # the newest span frames, itself included
            span = self.config.generation.sink_frames + self.config.generation.window_frames
            shown = [f for f in self.cache.cached_frames if f >= chunk.latent_end - span]
            with self.cache.showing(shown):
                self.denoiser.write_context(latents, conditioning, self.cache, start, generator)
            return
        self.denoiser.write_context(latents, conditioning, self.cache, start, generator)

    @torch.no_grad()
    def _write_prefix(self, prefix: torch.Tensor, conditioning: Conditioning) -> None:
        """``window``: a clip's latents written chunk by chunk in order, each against the cache as
        it stands (Self Forcing's ``initial_latent``)."""
        for group in context_groups(range(prefix.shape[2]), self.denoiser.chunk_frames):
            latents = prefix[:, :, group[0] : group[-1] + 1]
            self.denoiser.write_context(
                latents, conditioning, self.cache, group[0], self._context_generator(group[0])
            )
        self._hold(prefix, 0)

    @torch.no_grad()
    def rebuild_cache(self, chunk: PlannedChunk, conditioning: Conditioning, full: bool = False) -> None:
        """The one cache pass (:func:`~vidgen.pipelines.denoiser.write_held`): the cache brought to
        the clean latents of the frames it holds, under ``conditioning`` (``chunk``'s). Every write
        of context goes through here (after each chunk, for a clip, for a drift re-cache, on
        resume), and a window frame's keys and values depend on the sinks, its own chunk and the
        conditioning alone, so a resumed video rebuilds exactly the cache the uninterrupted one
        had from the few latents its state holds. After a chunk only that chunk is written;
        ``full`` (a clip, a re-cache, a resume) rewrites everything.

        With the ``window`` context pass this is a re-cache only: LongLive's one joint pass
        (:func:`~vidgen.pipelines.denoiser.recache_window`)."""
        if self.window_context:
            recache_window(
                self.denoiser,
                self.cache,
                self.history,
                conditioning,
                self._context_generator(max(self.history)),
            )
            return
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
        conditioning = self.pipe._conditioning(first, self.guidance, negative)
        if self.window_context:
            self._write_prefix(prefix, conditioning)
        else:
            self._hold(prefix, 0)
            self.rebuild_cache(first, conditioning, full=True)
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
        self._write_chunk(chunk, conditioning, latents)  # the chunk joins the context
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

        if self.planner.mode.staggered:
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
    def _peek_ahead(self) -> PlannedChunk | None:
        """The next planned chunk not yet in flight (the plan, read ahead of the chunk loop); None
        past the video's last chunk."""
        if self._ahead is None:
            self._ahead = self.planner.chunks(self.num_frames)
        if self._next_ahead is None:
            self._next_ahead = next(self._ahead, None)
        return self._next_ahead

    def _take_ahead(self) -> PlannedChunk:
        chunk = self._peek_ahead()
        assert chunk is not None  # taken only after a peek found one
        self._next_ahead = None
        return chunk

    def _predict_in_flight(
        self, x: torch.Tensor, sigmas: torch.Tensor, conditioning: Conditioning, first: int
    ) -> torch.Tensor:
        """One model call over the chunks in flight (``x``, from latent frame ``first``). Rolling
        Forcing's: the chunks attend to each other both ways and see the sinks and the newest held
        frames that fit in ``sink_frames + window_frames`` frames of attention, the sinks placed
        just before those frames (its anchor, re-positioned)."""
        if self.planner.mode != GenerationMode.ROLLING_FORCING:
            return self.denoiser.predict(x, sigmas, conditioning, self.cache, first)
        g = self.config.generation
        budget = g.sink_frames + g.window_frames - x.shape[2] - g.sink_frames
        earlier = sorted(f for f in self.cache.cached_frames if g.sink_frames <= f < first)
        working = earlier[len(earlier) - budget :] if budget > 0 else []
        shown = [*range(g.sink_frames), *working]
        shift = first - len(working) - g.sink_frames if first > 0 else 0  # no sinks before chunk 0 is done
        with self.cache.showing(shown):
            return self.denoiser.predict(
                x, sigmas, conditioning, self.cache, first, joint=True, position_shift=shift
            )

    def _denoise_pipelined(self, chunk: PlannedChunk, conditioning: Conditioning, on_step) -> torch.Tensor:
        """Diffusion forcing: the planned chunks in flight at staggered noise levels, one model call
        advancing all of them; a chunk joins at its ``first_iteration`` and takes its level from its
        own ``sigmas``. Returns ``chunk``, whose last step is run here (the oldest in flight)."""
        schedule = self.denoiser.schedule
        last = chunk.first_iteration + len(chunk.sigmas) - 2  # the model call of its last step
        while self.iteration <= last:
            while (upcoming := self._peek_ahead()) is not None and upcoming.first_iteration <= self.iteration:
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
            velocity = self._predict_in_flight(x, sigmas, conditioning, self.in_flight[0].chunk.latent_start)
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
            "context_pass": g.context_pass,
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
        previous_snapshot = self._snapshot_chunk
        if (
            self.window_context
            and self.snapshot_every
            and chunk_index - previous_snapshot >= self.snapshot_every
        ):
            self._save_snapshot(path, chunk_index)
        state = {
            "chunk_index": torch.tensor([chunk_index]),
            "seed": torch.tensor([self.seed]),
            "iteration": torch.tensor([self.iteration]),
            "snapshot_chunk": torch.tensor([self._snapshot_chunk]),
        }
        if self.window_context:  # the cache is replayed from these (load)
            for frame, latents in self.replay.items():
                state[f"replay.{frame}"] = latents
        else:  # the cache is rebuilt from these (load)
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
        snapshot = {"snapshot_sha256": self._snapshot_digest} if self._snapshot_digest else {}
        write_state(path, {f"extra.{k}": v for k, v in state.items()}, self._settings(), **snapshot)
        if previous_snapshot >= 0 and previous_snapshot != self._snapshot_chunk:
            _snapshot_path(path, previous_snapshot).unlink(missing_ok=True)

    def _save_snapshot(self, path: str | os.PathLike, chunk_index: int) -> None:
        """``window``: the KV cache and the latents it holds after chunk ``chunk_index``, beside the
        state (``<state>.kv-<chunk>``); the state then holds only the chunks made since."""
        target = _snapshot_path(path, chunk_index)
        tmp = Path(str(target) + ".tmp")
        history = {f"history.{frame}": latents.detach().cpu() for frame, latents in self.history.items()}
        self.cache.save(tmp, extra=history)
        os.replace(tmp, target)
        self._snapshot_digest = file_digest(target)
        self._snapshot_chunk = chunk_index
        self.replay = {}

    @torch.no_grad()
    def load(self, path: str | os.PathLike, negative: str) -> int:
        """Take up the state saved at ``path`` and rebuild the KV cache from its latents, as the
        chunk it was saved after left it; returns that chunk's index."""
        device = self.device
        meta, tensors = read_state(path, device=str(device))
        saved, settings = json.loads(meta["settings"]), self._settings()
        if saved != settings:
            changed = ", ".join(
                f"{k} {saved.get(k)!r} (now {v!r})" for k, v in settings.items() if saved.get(k) != v
            )
            raise InputError(f"{path} was saved with different settings ({changed})")
        extra = {k.removeprefix("extra."): v for k, v in tensors.items()}
        if int(extra["seed"][0]) != self.seed:
            raise InputError(f"{path} was saved with seed {int(extra['seed'][0])}, this run uses {self.seed}")

        def part(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix) :]: v for k, v in extra.items() if k.startswith(prefix)}

        if self.decoder is not None:
            self.decoder.load_state(part("decoder."))
        if self.anchor is not None:
            self.anchor.load_state(part("anchor."))
        if self.monitor is not None:
            self.monitor.load_state(part("monitor."))
        chunk_index = int(extra["chunk_index"][0])
        if self.window_context:
            snapshot = int(extra["snapshot_chunk"][0]) if "snapshot_chunk" in extra else -1
            replay = {int(frame): latents for frame, latents in part("replay.").items()}
            self._replay(path, snapshot, replay, chunk_index, negative, meta.get("snapshot_sha256"))
        else:
            self.history = {int(frame): latents for frame, latents in part("history.").items()}
            done = next(c for c in self.planner.chunks(None) if c.index == chunk_index)
            self.rebuild_cache(done, self.pipe._conditioning(done, self.guidance, negative), full=True)
        self._resume_in_flight(extra, chunk_index)
        return chunk_index

    @torch.no_grad()
    def _replay(
        self,
        path: str | os.PathLike,
        snapshot: int,
        replay: dict[int, torch.Tensor],
        chunk_index: int,
        negative: str,
        snapshot_digest: str | None = None,
    ) -> None:
        """``window``: the cache as chunk ``chunk_index`` left it, from the snapshot (or an empty
        cache) and the latents made since, by running the context passes and re-caches of those
        chunks again as the plan has them."""
        self.cache.reset()
        self.history = {}
        if snapshot >= 0:
            snapshot_file = _snapshot_path(path, snapshot)
            if (
                not snapshot_file.is_file()
                or snapshot_digest
                and file_digest(snapshot_file) != snapshot_digest
            ):
                raise StateFileError(f"{snapshot_file} is missing or damaged (its checksum differs)")
            saved, extra = KVCache.load(snapshot_file, device=self.device)
            if saved.k.shape != self.cache.k.shape:
                raise InputError(f"{_snapshot_path(path, snapshot)} holds a KV cache of another geometry")
            self.cache.k.copy_(saved.k)
            self.cache.v.copy_(saved.v)
            self.cache.slot_frames = list(saved.slot_frames)
            self.cache.version += 1  # the held frames changed: the workspace is rebuilt
            self.history = {int(k.removeprefix("history.")): v for k, v in extra.items()}
        self._snapshot_chunk = snapshot
        self._snapshot_digest = snapshot_digest
        self.replay = dict(replay) if self.keep_replay else {}

        def latents_of(start: int, end: int) -> torch.Tensor:
            missing = [f for f in range(start, end) if f not in replay]
            if missing:
                raise InputError(f"the saved state lacks latent frames {missing}; delete it to start over")
            return torch.cat([replay[f] for f in range(start, end)], dim=2)

        keep, self.keep_replay = self.keep_replay, False  # the frames replayed are recorded already
        try:
            for chunk in self.planner.chunks(None):
                if chunk.index > chunk_index:
                    break
                conditioning = self.pipe._conditioning(chunk, self.guidance, negative)
                if snapshot < 0 and chunk.index == 0 and self.planner.prefix_latents:
                    self._write_prefix(latents_of(0, self.planner.prefix_latents), conditioning)
                if chunk.index <= snapshot:
                    continue
                if (
                    DriftAction.RECACHE_PROMPT in chunk.actions
                    or DriftAction.RECACHE_PERIODIC in chunk.actions
                ):
                    self.rebuild_cache(chunk, conditioning, full=True)
                latents = latents_of(chunk.latent_start, chunk.latent_end)
                self._hold(latents, chunk.latent_start)
                self._write_chunk(chunk, conditioning, latents)
        finally:
            self.keep_replay = keep

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
        if not self.planner.mode.staggered:
            return
        while (upcoming := self._peek_ahead()) is not None and upcoming.index <= chunk_index:
            self._take_ahead()
        while (upcoming := self._peek_ahead()) is not None and upcoming.index in latents:
            chunk = self._take_ahead()
            self.in_flight.append(_InFlight(chunk, latents.pop(chunk.index)))
        if latents:
            raise InputError(f"the saved state holds chunks {sorted(latents)} that this plan does not start")


def _snapshot_path(state_path: str | os.PathLike, chunk_index: int) -> Path:
    return Path(f"{os.fspath(state_path)}.kv-{chunk_index}")


def _check_same_steps(planned: PlannedChunk, chunk: PlannedChunk) -> None:
    """The plan read ahead and the chunk loop must agree on what a chunk runs."""
    fields = ("latent_start", "latent_end", "first_iteration", "sigmas")
    if any(getattr(planned, f) != getattr(chunk, f) for f in fields):
        raise RuntimeError(f"chunk {chunk.index}: the plan changed its steps while it was in flight")
