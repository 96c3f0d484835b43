"""Decode chunk k while chunk k+1 denoises: the VAE on a second CUDA stream.

``LongVideoPipeline.stream(decode=False)`` yields each chunk's latents as soon as they are made and
makes the next chunk only when asked. An :class:`OverlappedDecoder` fed those chunks enqueues each
decode on its own CUDA stream and returns at once, so the host goes straight on to enqueue the next
chunk's transformer steps on the main stream and the GPU runs both; a chunk's frames are collected
(copied to pinned host memory, then waited for) one chunk later. On a CPU there is nothing to
overlap with: chunks are decoded when submitted, and the same lag-by-one bookkeeping applies, so the
frames and their order are identical everywhere.

    decoder = OverlappedDecoder(pipe.vae, pipe.device)
    for chunk in pipe.stream(prompt, seconds=20, decode=False):
        decoder.submit(chunk.latents, chunk_latent_start)
        for frames in decoder.ready(): ...   # every chunk but the newest
    for frames in decoder.finish(): ...
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from vidgen.pipelines.vae_stream import streaming_decoder, video_to_uint8


@dataclass
class _Pending:
    frames: torch.Tensor
    """(T, H, W, 3) uint8, on the host (pinned when decoded on CUDA)."""
    done: torch.cuda.Event | None
    """Recorded on the decode stream after the host copy; None when decoded synchronously."""


class OverlappedDecoder:
    """A streaming decoder that runs on a side CUDA stream and hands frames back one chunk later."""

    def __init__(self, vae, device: torch.device | str, lag: int = 1) -> None:
        self.device = torch.device(device)
        self.decoder = streaming_decoder(vae)
        self.decoder.reset()
        self.lag = lag
        """Chunks kept in flight: ``ready`` returns all but the newest ``lag``."""
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._pending: deque[_Pending] = deque()

    @property
    def overlapping(self) -> bool:
        """True when decoding runs on its own CUDA stream."""
        return self.stream is not None

    def submit(self, latents: torch.Tensor, latent_start: int) -> None:
        """Decode one chunk's normalised latents (1, C, F, h, w); chunks must come in order."""
        if self.stream is None:
            frames = video_to_uint8(self.decoder.decode(latents, latent_start)).cpu()
            self._pending.append(_Pending(frames, None))
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the latents are made
        with torch.cuda.stream(self.stream):
            latents.record_stream(self.stream)  # not reused by the allocator until decoded
            frames = video_to_uint8(self.decoder.decode(latents, latent_start))
            host = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
            host.copy_(frames, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        self._pending.append(_Pending(host, done))

    def _collect(self, keep: int) -> Iterator[np.ndarray]:
        while len(self._pending) > keep:
            pending = self._pending.popleft()
            if pending.done is not None:
                pending.done.synchronize()
            yield pending.frames.numpy()

    def ready(self) -> Iterator[np.ndarray]:
        """Frames (T, H, W, 3) uint8 of every submitted chunk except the newest ``lag``, in order."""
        return self._collect(self.lag)

    def finish(self) -> Iterator[np.ndarray]:
        """Frames of every chunk still pending, in order."""
        return self._collect(0)
