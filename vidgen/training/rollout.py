"""What the student runs and how it is judged, for ``vidgen.training.distill``.

:class:`Rollout` makes chunks exactly as ``LongVideoPipeline`` does in ``chunkwise`` mode (the
pipeline's ``ChunkDenoiser`` steps against a KV cache, the finished chunk written back as context),
for a batch of prompts, keeping the graph of one step per chunk. The losses score a whole rollout at
once with a pattern that shows each chunk what the cache showed it: the DMD2 generator loss (real
and fake score models) and the fake score's flow-matching loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vidgen.attention import AttentionPattern
from vidgen.config import VidgenConfig
from vidgen.models import CausalWanTransformer, KVCache
from vidgen.pipelines.denoiser import ChunkDenoiser, Conditioning, write_held
from vidgen.pipelines.scheduler import FlowSchedule, add_noise, shift_sigma, timestep_of
from vidgen.training.configs import DistillTrainConfig

# ----------------------------------------------------------------------------- the pipeline's chunk loop


class Rollout:
    """Runs chunks exactly as the pipeline's chunkwise loop does (``ChunkDenoiser`` steps against a
    KV cache, the finished chunk written back as context), for a batch of prompts, with gradients
    at one chosen step of each chunk only."""

    def __init__(
        self,
        config: VidgenConfig,
        latent_hw: tuple[int, int],
        schedule: FlowSchedule,
        *,
        autocast: torch.dtype | None = None,
    ) -> None:
        g = config.generation
        self.config = config
        self.latent_hw = latent_hw
        self.schedule = schedule
        self.chunk_frames = g.chunk_frames
        self.autocast = autocast
        self._caches: dict[tuple, KVCache] = {}
        self.last_cache: KVCache | None = None
        """The cache of the latest ``run``, as it left it."""

    def denoiser(self, model: CausalWanTransformer) -> ChunkDenoiser:
        g = self.config.generation
        return ChunkDenoiser(
            model,
            self.schedule,
            rope_mode=g.rope_mode,
            context_noise=g.addnoise_condition,
            chunk_frames=g.chunk_frames,
            autocast=self.autocast,
        )

    def cache(self, model: CausalWanTransformer, batch: int) -> KVCache:
        """An empty cache (allocated once per model and batch, then reset)."""
        key = (id(model), batch)
        if key not in self._caches:
            g = self.config.generation
            self._caches[key] = model.make_kv_cache(
                batch_size=batch,
                latent_height=self.latent_hw[0],
                latent_width=self.latent_hw[1],
                sink_frames=g.sink_frames,
                window_frames=g.window_frames,
                dtype=torch.bfloat16 if self.autocast is not None else torch.float32,
            )
        cache = self._caches[key]
        cache.reset()
        return cache

    def run(
        self,
        model: CausalWanTransformer,
        conditioning: Conditioning,
        noises: Sequence[torch.Tensor],
        exits: Sequence[int] | None = None,
        *,
        grad: bool = False,
        step_generators: Sequence[torch.Generator | None] | None = None,
        write_generators: Sequence[torch.Generator | None] | None = None,
        record: Sequence[int] = (),
        write_last: bool = False,
        grad_from: int = 0,
    ) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
        """Make ``len(noises)`` chunks from their noise (B, C, chunk_frames, h, w).

        ``exits[i]``: the step at which chunk i stops, its output being the clean estimate there
        (None: every chunk runs all steps, as the pipeline does); with ``grad`` that step keeps its
        graph, from chunk ``grad_from`` on (the chunks before it make context without one).
        ``record``: step indices whose input latents are returned, per chunk.
        ``write_last``: write the last chunk to the cache too, as the pipeline does before the next
        chunk (``last_cache`` then holds the whole rollout as context for one).
        Returns the video (B, C, F, h, w) and the recorded latents.
        """
        schedule = self.schedule
        sigmas = schedule.sigmas
        last = schedule.num_steps - 1
        denoiser = self.denoiser(model)
        batch = noises[0].shape[0]
        cache = self.cache(model, batch * (2 if conditioning.guided else 1))
        self.last_cache = cache
        # a fresh copy of chunk i's write generator for each time its frames are written again
        write_states = [g.get_state() if g is not None else None for g in write_generators or []]
        held: dict[int, torch.Tensor] = {}  # latent frame -> clean latents, the frames the cache holds
        written: dict = {}  # what the cache holds (write_held)
        outputs, recorded = [], []
        for i, noise in enumerate(noises):
            offset = i * self.chunk_frames
            exit_step = last if exits is None else exits[i]
            generator = step_generators[i] if step_generators is not None else None
            x = noise.float()
            levels = []
            for index in range(exit_step + 1):
                if index in record:
                    levels.append(x)
                level = torch.full((batch, x.shape[2]), sigmas[index], device=x.device)
                keep = grad and i >= grad_from and index == exit_step
                with torch.set_grad_enabled(keep):
                    reads = reading_view(cache) if keep else cache
                    velocity = denoiser.predict(x, level, conditioning, reads, offset)
                    if index == last:
                        x = schedule.step(x, velocity, index, generator)  # the pipeline's last step
                    elif index == exit_step:
                        x = x - sigmas[index] * velocity  # the clean estimate: Self Forcing's exit
                    else:
                        x = schedule.step(x, velocity, index, generator)
            outputs.append(x)
            recorded.append(levels)
            if write_last or i + 1 < len(noises):  # otherwise nothing reads the last chunk's context
                written = self._write_context(
                    denoiser, x.detach(), conditioning, cache, offset, held, written, write_states
                )
        return torch.cat(outputs, dim=2), recorded

    def _write_context(self, denoiser, clean, conditioning, cache, offset, held, written, write_states):
        """The pipeline's cache pass (``VideoRun.rebuild_cache``, :func:`write_held`): the chunk
        joins the held frames, frames that left the window leave them, and the cache is brought to
        them; returns what the cache holds (the ``written`` of the next call)."""
        f = self.chunk_frames
        for k in range(clean.shape[2]):
            held[offset + k] = clean[:, :, k : k + 1]
        kept = cache.frames_kept(held)
        for frame in [frame for frame in held if frame not in kept]:
            del held[frame]

        def generator(first_frame: int) -> torch.Generator | None:
            chunk = first_frame // f
            if first_frame % f or chunk >= len(write_states) or write_states[chunk] is None:
                return None
            fresh = torch.Generator()
            fresh.set_state(write_states[chunk])
            return fresh

        return write_held(denoiser, cache, held, conditioning, "rollout", written, generator)


def reading_view(cache: KVCache) -> KVCache:
    """The cache as a forward with gradients reads it: the same buffers, this moment's slot map.

    Gradient checkpointing runs such a forward again in the backward pass, after later chunks have
    been written: with its own slot map it reads the same frames again, which are unchanged as long
    as no later write evicts one (the rollout fits in the sinks + window + one chunk)."""
    view = KVCache.__new__(KVCache)
    nn.Module.__init__(view)
    for name in ("num_layers", "frame_tokens", "sink_frames", "window_frames", "capacity_frames"):
        setattr(view, name, getattr(cache, name))
    view.register_buffer("k", cache.k, persistent=False)
    view.register_buffer("v", cache.v, persistent=False)
    view.slot_frames = list(cache.slot_frames)
    # no rotated workspace: its staleness stamp follows the shared buffers' writes, not this view's
    # slot map, so the view rotates what it reads in every call
    view.use_workspace = False
    view._init_workspace()
    return view


def text_embeddings(encoder: nn.Module, prompts: list[str], config: VidgenConfig, device) -> torch.Tensor:
    """What the pipeline feeds ``encode_text`` for a chunk without a transition: ``[prompt ‖ prompt]``
    for ``with_previous`` models, else the prompt."""
    embedded = encoder(prompts)
    if config.model.text_conditioning == "with_previous":
        embedded = torch.cat([embedded, embedded], dim=1)
    return embedded.to(device)


def conditioning(
    model: CausalWanTransformer,
    text: torch.Tensor,
    uncond: torch.Tensor | None = None,
    guidance_scale: float = 1.0,
) -> Conditioning:
    """The pipeline's per-chunk conditioning; the text projection keeps its graph when grad is on."""
    cond = model.encode_text(text)
    if uncond is None or guidance_scale == 1.0:
        return Conditioning(cond)
    return Conditioning(cond, model.encode_text(uncond), guidance_scale)


# ----------------------------------------------------------------------------- losses


def score_pattern(
    model: CausalWanTransformer, config: VidgenConfig, latent_hw, teacher_attention: str = "causal"
) -> AttentionPattern | None:
    """How the teacher and the score models see a whole video: ``causal``, block-causal with each
    chunk attending to the sinks and the window before it, as the cache showed it chunk by chunk;
    ``full`` (a bidirectional teacher such as Wan 2.1 T2V), everything (None)."""
    if teacher_attention == "full":
        return None
    g = config.generation
    return AttentionPattern.sliding_window(
        model.frame_tokens(*latent_hw), g.chunk_frames, g.window_frames, g.sink_frames
    )


def velocity(
    model: CausalWanTransformer,
    noisy: torch.Tensor,
    sigma_frames: torch.Tensor,
    text: torch.Tensor,
    pattern: AttentionPattern | None,
    *,
    uncond: torch.Tensor | None = None,
    guidance_scale: float = 1.0,
    autocast: torch.dtype | None = None,
) -> torch.Tensor:
    """A score model's velocity on a whole noisy video (B, C, F, h, w) at per-frame ``sigma_frames``
    (B, F), with classifier-free guidance when ``uncond`` is given and the scale is not 1."""
    guided = uncond is not None and guidance_scale != 1.0
    x = torch.cat([noisy, noisy]) if guided else noisy
    s = torch.cat([sigma_frames, sigma_frames]) if guided else sigma_frames
    t = torch.cat([text, uncond]) if guided else text
    with torch.autocast(x.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        v = model(
            x.to(model.dtype),
            timestep_of(s).to(model.dtype),
            t.to(model.dtype),
            attention_pattern=pattern,
            return_dict=False,
        )[0].float()
    if guided:
        cond, unc = v.chunk(2)
        v = unc + guidance_scale * (cond - unc)
    return v


def clean_estimate(model, noisy: torch.Tensor, sigma_frames: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """``x - sigma * v`` (arguments as :func:`velocity`)."""
    v = velocity(model, noisy, sigma_frames, *args, **kwargs)
    return noisy - sigma_frames[:, None, :, None, None] * v


def sample_sigmas(
    batch: int, chunks: int, chunk_frames: int, config: DistillTrainConfig, shift: float, generator
) -> torch.Tensor:
    """Per-chunk noise levels in [dmd_sigma_min, dmd_sigma_max], shifted as the schedule is: (B, F)."""
    u = torch.rand(batch, chunks, generator=generator)
    u = config.dmd_sigma_min + (config.dmd_sigma_max - config.dmd_sigma_min) * u
    return shift_sigma(u, shift).repeat_interleave(chunk_frames, dim=1)


def dmd_loss(
    video: torch.Tensor,
    real: CausalWanTransformer,
    fake: CausalWanTransformer,
    text: torch.Tensor,
    uncond: torch.Tensor,
    sigma_frames: torch.Tensor,
    noise: torch.Tensor,
    pattern: AttentionPattern | None,
    guidance_scale: float,
    autocast: torch.dtype | None = None,
    context_frames: int = 0,
) -> torch.Tensor:
    """Distribution matching (DMD2): a loss whose gradient on ``video`` is the difference of the fake
    and real clean estimates of the noised video, normalised by the real estimate's distance. The
    first ``context_frames`` latent frames are context the score models read (give them sigma 0)
    and the loss leaves out."""
    with torch.no_grad():
        noisy = add_noise(video.detach(), noise, sigma_frames[:, None, :, None, None])
        fake_x0 = clean_estimate(fake, noisy, sigma_frames, text, pattern, autocast=autocast)
        real_x0 = clean_estimate(
            real,
            noisy,
            sigma_frames,
            text,
            pattern,
            uncond=uncond,
            guidance_scale=guidance_scale,
            autocast=autocast,
        )
        judged = slice(context_frames, None)
        distance = (video.detach() - real_x0)[:, :, judged]
        normalizer = distance.abs().mean(dim=(1, 2, 3, 4), keepdim=True).clamp(min=1e-6)
        direction = torch.nan_to_num((fake_x0 - real_x0)[:, :, judged] / normalizer)
    judged_video = video[:, :, judged]
    target = (judged_video - direction).detach()
    return 0.5 * (judged_video.float() - target).square().mean()


def flow_matching_loss(
    model: CausalWanTransformer,
    video: torch.Tensor,
    text: torch.Tensor,
    sigma_frames: torch.Tensor,
    noise: torch.Tensor,
    pattern: AttentionPattern | None,
    autocast: torch.dtype | None = None,
    weight: torch.Tensor | None = None,
    source: torch.Tensor | None = None,
    temporal_weight: float = 0.0,
) -> torch.Tensor:
    """The fake score's loss: the ordinary velocity regression on (detached) student rollouts; with
    ``weight`` (B, F, h, w), the mean weighted by it (normalised: weights of one value give the
    plain mean).

    ``temporal_weight`` adds that many times the mean square of the clean estimate's error changing
    from one latent frame to the next (``sigma * (v - target)`` differenced over frames; weighted,
    with ``weight``, by the larger of the two frames' weights). An error the frames share costs
    nothing there; one that comes and goes from frame to frame -- an object that steps back or
    changes shape between latent frames -- costs it twice (the data term's temporal weight).

    ``source`` (the shape of ``video``) is what gets noised instead of ``video``; the target is
    still the velocity whose clean estimate ``noisy - sigma * v`` is ``video``. Where the two are
    equal it is the ordinary target, exactly (the data term's shape swap)."""
    video = video.detach()
    s = sigma_frames[:, None, :, None, None]
    noisy = add_noise(video if source is None else source.detach(), noise, s)
    target = noise - video
    if source is not None:
        # noisy - s * v = video  <=>  v = noise - video + (1 - s) / s * (source - video)
        target = target + (1 - s) / s.clamp(min=1e-3) * (source.detach() - video)
    with torch.autocast(video.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        v = model(
            noisy.to(model.dtype),
            timestep_of(sigma_frames).to(model.dtype),
            text.to(model.dtype),
            attention_pattern=pattern,
            return_dict=False,
        )[0].float()
    diff = v - target
    err = diff.square()
    w = None if weight is None else weight[:, None].to(err.dtype)  # (B, 1, F, h, w), every channel
    loss = err.mean() if w is None else (err * w).mean() / w.mean()
    if temporal_weight > 0:
        jitter = (s * diff).diff(dim=2).square()
        if w is None:
            loss = loss + temporal_weight * jitter.mean()
        else:
            moved = torch.maximum(w[:, :, 1:], w[:, :, :-1])
            loss = loss + temporal_weight * (jitter * moved).mean() / moved.mean()
    return loss
