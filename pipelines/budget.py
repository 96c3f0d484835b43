"""What a request would cost before it runs: an estimate of its memory against a limit.

The estimate counts what grows with the frame size: the KV cache (every layer's keys and values
for the sink and window frames), the transformer's activations for one chunk, and the decoder's
full-resolution feature maps for one chunk. It is a bound meant to refuse a request that cannot
fit (a 2048x2048 video on a laptop) at once, with what it would need, instead of after minutes
of work or a kill by the kernel; it is not an exact accounting.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vidgen.config import VidgenConfig
from vidgen.pipelines.vae_stream import spatial_factor, temporal_factor
from vidgen.validation import InputError

if TYPE_CHECKING:  # pragma: no cover
    from vidgen.pipelines.pipeline import LongVideoPipeline

GB = 1e9
AVAILABLE_FRACTION = 0.8
"""Share of the machine's available memory a request may plan to use (without runtime.max_memory_gb)."""


@dataclass
class MemoryEstimate:
    kv_cache: int
    activations: int
    decode: int

    @property
    def total(self) -> int:
        return self.kv_cache + self.activations + self.decode

    def describe(self) -> str:
        return (
            f"about {self.total / GB:.1f} GB (KV cache {self.kv_cache / GB:.1f}, activations "
            f"{self.activations / GB:.1f}, decoding {self.decode / GB:.1f})"
        )


def estimate_memory(
    pipe: LongVideoPipeline, config: VidgenConfig, height: int, width: int, guidance: float
) -> MemoryEstimate:
    """Bytes one video of ``height`` x ``width`` needs while a chunk is made and decoded."""
    g, c = config.generation, pipe.transformer.config
    s = spatial_factor(pipe.vae)
    frame_tokens = pipe.transformer.frame_tokens(height // s, width // s)
    branches = 2 if guidance != 1.0 else 1
    itemsize = pipe.transformer.dtype.itemsize
    width_kv = c.num_attention_heads * c.attention_head_dim
    kv = 2 * c.num_layers * branches * (g.sink_frames + g.window_frames) * frame_tokens * width_kv * itemsize
    chunk_tokens = branches * g.chunk_frames * frame_tokens
    # hidden states, q/k/v/out and the feed-forward's inner layer, in float32 under autocast too
    activations = chunk_tokens * (6 * width_kv + 2 * c.ffn_dim) * 4
    vae = getattr(pipe.vae, "config", None)
    channels = getattr(vae, "upsample_channels", None) or getattr(vae, "base_dim", None) or 128
    frames = g.chunk_frames * temporal_factor(pipe.vae)
    decode = 3 * frames * height * width * channels * 4  # a block's input, output and residual
    return MemoryEstimate(kv, activations, decode)


def available_memory(device: torch.device) -> int | None:
    """Bytes free on ``device`` (a CUDA device's, else the machine's MemAvailable); None: unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def check_memory(
    pipe: LongVideoPipeline, config: VidgenConfig, height: int, width: int, guidance: float
) -> MemoryEstimate:
    """The estimate, or :class:`InputError` with what it needs and what may be used."""
    estimate = estimate_memory(pipe, config, height, width, guidance)
    limit_gb = config.runtime.max_memory_gb
    if limit_gb:
        limit, source = int(limit_gb * GB), f"runtime.max_memory_gb = {limit_gb:g}"
    else:
        free = available_memory(pipe.device)
        if free is None:
            return estimate
        limit = int(free * AVAILABLE_FRACTION)
        source = f"{AVAILABLE_FRACTION:.0%} of the {free / GB:.1f} GB available on {pipe.device.type}"
    if estimate.total > limit:
        raise InputError(
            f"a {width}x{height} video needs {estimate.describe()}, more than {limit / GB:.1f} GB "
            f"({source}): lower --height/--width, or raise runtime.max_memory_gb"
        )
    return estimate
