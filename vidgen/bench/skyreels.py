"""Side by side with diffusers' ``SkyReelsV2DiffusionForcingPipeline`` on identical random weights.

Part 3 of ``vidgen bench pipeline`` (see :mod:`vidgen.bench.pipeline`). SkyReels-V2's
transformer is Wan 2.1's: ``SkyReelsV2Transformer3DModel`` and our ``CausalWanTransformer`` have
the same parameter names and shapes (every key of one state dict loads into the other, strictly),
and with full attention and the same timesteps they compute the same tensor -- the run checks it
and reports the difference. The comparison is therefore one network, two ways of making a long video:

* **ours**: chunk by chunk against a KV cache (sliding window + sinks): each chunk costs its
  sampler steps on the chunk's own tokens, plus the cache pass that rewrites the window's chunks
  from their clean latents (one pass per chunk in the window; the sinks are kept);
* **SkyReels-V2 diffusion forcing, long-video mode**: windows of ``base_num_frames`` whose first
  ``overlap_history`` frames are the end of the previous window, run through every sampler step
  again (as clean, not updated, frames) so that the new frames see them.

Both make the same number of frames at the same resolution with the same number of sampler steps,
in float32 (our bf16 autocast off), without classifier-free guidance (``guidance_scale=1``: the
distilled few-step preset runs without it), with the same tiny random ``AutoencoderKLWan`` decoding
everything and prompt embeddings passed as tensors (no tokenizer or text encoder:
``tokenizer=None, text_encoder=None``). SkyReels runs in two settings:

* **equal context** (the ratio that has a target): ``base_num_frames`` spans the frames our model
  attends to (sinks + window + chunk latent frames), ``overlap_history`` the cached ones (sinks +
  window), ``causal_block_size`` our chunk, so every new chunk sees as much history on both sides;
  ``ar_step=0`` (synchronous) because asynchronous diffusion forcing adds ``ar_step`` iterations
  per block and is slower, by SkyReels' own documentation;
* **recommended stride** (reported, no target): SkyReels' documented long-video values,
  ``base_num_frames=97, overlap_history=17``, synchronous, where only a fifth of each window is
  re-run -- and new frames at a window's start see 5 latent frames of history instead of 9.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
from torch import nn

from vidgen.config import load_config

PRESET = "wan2.1-t2v-1.3b-causal"
SPEEDUP_TARGET = 3.0
"""SkyReels (equal context) wall time / ours: "several times faster"."""

# A small Wan 2.1 transformer (diffusers' WanTransformer3DModel argument names). Big enough that
# the transformer, not the shared tiny VAE, takes most of the time, as it does at full size.
TRANSFORMER = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=8,
    attention_head_dim=64,
    in_channels=16,
    out_channels=16,
    text_dim=256,
    freq_dim=256,
    ffn_dim=2048,
    num_layers=8,
    rope_max_seq_len=1024,
)
VAE = dict(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1)
TEXT_TOKENS = 64
RECOMMENDED = {"base_num_frames": 97, "overlap_history": 17}


class PromptEmbeddings(nn.Module):
    """Stands in for a text encoder: every prompt gets the same fixed embedding (1, L, text_dim)."""

    def __init__(self, embeddings: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("embeddings", embeddings)

    def forward(self, prompts: str | list[str]) -> torch.Tensor:
        return self.embeddings


class TransformerMeter:
    """Times and counts a transformer's forward calls (hooks; works for both pipelines)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.reset()

    def reset(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.latent_frames = 0  # latent frames through the model, summed over calls and batch
        self._start = 0.0

    def _before(self, module, args, kwargs) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]  # (B, C, F, H, W)
        self.calls += 1
        self.latent_frames += hidden.shape[0] * hidden.shape[2]
        self._start = time.perf_counter()

    def _after(self, module, args, kwargs, output) -> None:
        self.seconds += time.perf_counter() - self._start

    @contextlib.contextmanager
    def attached(self) -> Iterator[TransformerMeter]:
        handles = [
            self.model.register_forward_pre_hook(self._before, with_kwargs=True),
            self.model.register_forward_hook(self._after, with_kwargs=True),
        ]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()


def aligned_frames(requested: int, base_latents: int, chunk: int, t: int) -> int:
    """Frames (1 + t*k) at least ``requested`` whose latent count fills SkyReels' windows exactly
    (``base + n * chunk``): its pipeline fails on a last window with no whole block to make."""
    latents = max(1 + -(-(requested - 1) // t), base_latents + chunk)
    latents += -(latents - base_latents) % chunk
    return 1 + (latents - 1) * t


def build(seed: int):
    """(SkyReels pipeline, our pipeline, prompt embeddings, max |difference| of one forward call)."""
    from diffusers import (
        AutoencoderKLWan,
        SkyReelsV2DiffusionForcingPipeline,
        SkyReelsV2Transformer3DModel,
        UniPCMultistepScheduler,
    )

    from vidgen.models import CausalWanTransformer
    from vidgen.pipelines.pipeline import LongVideoPipeline

    # float32 on both sides: our bf16 autocast (on by default where the CPU has native bf16) is off
    config = load_config(PRESET).replace(
        **{"runtime.device": "cpu", "runtime.dtype": "float32", "runtime.autocast": "off"}
    )
    torch.manual_seed(seed)
    skyreels_transformer = SkyReelsV2Transformer3DModel(**TRANSFORMER).eval().requires_grad_(False)
    ours = CausalWanTransformer(**TRANSFORMER).eval().requires_grad_(False)
    ours.load_state_dict(skyreels_transformer.state_dict(), strict=True)  # same names, same shapes
    vae = AutoencoderKLWan(**VAE).eval().requires_grad_(False)
    embeds = torch.randn(1, TEXT_TOKENS, TRANSFORMER["text_dim"])
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=config.generation.shift
    )
    skyreels = SkyReelsV2DiffusionForcingPipeline(
        tokenizer=None, text_encoder=None, transformer=skyreels_transformer, vae=vae, scheduler=scheduler
    )
    skyreels.set_progress_bar_config(disable=True)
    pipe = LongVideoPipeline(ours, vae, PromptEmbeddings(embeds), config)

    # the same network: one forward call with full attention and per-frame timesteps
    x = torch.randn(1, TRANSFORMER["in_channels"], 3, 8, 8)
    timestep = torch.tensor([[900.0, 500.0, 100.0]])
    with torch.no_grad():
        theirs = skyreels_transformer(x, timestep, embeds, enable_diffusion_forcing=True).sample
        mine = ours(x, timestep, embeds).sample
    return skyreels, pipe, embeds, float((theirs - mine).abs().max())


def _run_skyreels(skyreels, embeds, num_frames, size, steps, seed, settings) -> None:
    skyreels(
        prompt=None,
        prompt_embeds=embeds,
        negative_prompt_embeds=embeds,
        height=size,
        width=size,
        num_frames=num_frames,
        num_inference_steps=steps,
        guidance_scale=1.0,
        generator=torch.Generator().manual_seed(seed),
        addnoise_condition=0,
        output_type="np",
        **settings,
    )


def compare(num_frames: int, size: int, seed: int = 0) -> dict:
    """Time both pipelines making the same long video; returns the JSON-able comparison."""
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()  # its per-window truncation notices are expected
    skyreels, pipe, embeds, max_diff = build(seed)
    g = pipe.config.generation
    t = pipe.temporal_factor
    context = g.sink_frames + g.window_frames
    base_latents = context + g.chunk_frames
    num_frames = aligned_frames(num_frames, base_latents, g.chunk_frames, t)
    steps = g.num_inference_steps
    runs = {
        "equal context": {
            "base_num_frames": 1 + (base_latents - 1) * t,
            "overlap_history": 1 + (context - 1) * t,
            "causal_block_size": g.chunk_frames,
            "ar_step": 0,
        },
    }
    if num_frames > RECOMMENDED["base_num_frames"]:
        runs["recommended stride"] = {**RECOMMENDED, "causal_block_size": 1, "ar_step": 0}

    with torch.no_grad():
        # warm-up: first calls in a process pay one-off costs (allocator, kernels); not timed
        one_chunk = 1 + g.chunk_frames * t
        list(pipe.stream("warm-up", num_frames=one_chunk, height=size, width=size, generator=seed))
        _run_skyreels(skyreels, embeds, one_chunk, size, steps, seed, {"causal_block_size": 1})

        rows = {}
        meter = TransformerMeter(pipe.transformer)
        with meter.attached():
            start = time.perf_counter()
            made = sum(
                len(c.frames)
                for c in pipe.stream(
                    "benchmark", num_frames=num_frames, height=size, width=size, generator=seed
                )
            )
            rows["ours (KV cache)"] = _row(time.perf_counter() - start, meter, made)
        meter = TransformerMeter(skyreels.transformer)
        for name, settings in runs.items():
            meter.reset()
            with meter.attached():
                start = time.perf_counter()
                _run_skyreels(skyreels, embeds, num_frames, size, steps, seed, settings)
                rows[f"SkyReels-V2 DF, {name}"] = _row(time.perf_counter() - start, meter, num_frames)
            rows[f"SkyReels-V2 DF, {name}"]["settings"] = settings

    ours = rows["ours (KV cache)"]
    for row in rows.values():
        row["wall_ratio_vs_ours"] = row["wall_s"] / ours["wall_s"]
        row["transformer_ratio_vs_ours"] = row["transformer_s"] / ours["transformer_s"]
        row["latent_frames_ratio_vs_ours"] = row["latent_frames"] / ours["latent_frames"]
    return {
        "num_frames": num_frames,
        "height": size,
        "width": size,
        "num_inference_steps": steps,
        "guidance": "off for both (guidance_scale=1)",
        "precision": "float32 for both (our autocast off)",
        "transformer": {k: list(v) if isinstance(v, tuple) else v for k, v in TRANSFORMER.items()},
        "vae": VAE,
        "ours": {
            "chunk_frames": g.chunk_frames,
            "sink_frames": g.sink_frames,
            "window_frames": g.window_frames,
            "sampler": g.sampler,
            "shift": g.shift,
        },
        "skyreels_scheduler": f"UniPCMultistepScheduler(flow_prediction, flow_shift={g.shift})",
        "same_network_max_abs_diff": max_diff,
        "rows": rows,
        "speedup_target": SPEEDUP_TARGET,
    }


def _row(wall: float, meter: TransformerMeter, frames: int) -> dict:
    return {
        "wall_s": wall,
        "transformer_s": meter.seconds,
        "transformer_calls": meter.calls,
        "latent_frames": meter.latent_frames,
        "frames": frames,
    }
