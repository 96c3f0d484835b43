"""Drift correction and monitoring on the latent stream.

* :class:`StatsAnchor` -- latent statistics anchoring: the per-channel mean/std of the opening
  chunks (after the start or a prompt change) become the anchor; a later chunk whose statistics
  have wandered further than a tolerance is pulled part of the way back. This is the cure for the
  slow colour and brightness shift of long autoregressive rollouts.
* :class:`DriftMonitor` -- per-chunk measures: distance of the chunk's statistics to the anchor,
  temporal change energy, freeze detection (no change for a while) and repetition detection (the
  chunk is a near copy of an earlier, non-adjacent one).

Both keep fixed-size state, so a ten-hour video costs what a ten-second one does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch


def channel_stats(latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std over frames and space of (B, C, F, h, w) -> (B, C) each."""
    return latents.mean(dim=(2, 3, 4)), latents.std(dim=(2, 3, 4))


class StatsAnchor:
    def __init__(self, chunks: int, strength: float, tolerance: float) -> None:
        self.chunks = chunks
        self.strength = strength
        self.tolerance = tolerance
        self.reset()

    def reset(self) -> None:
        self.collected = 0
        self.mean: torch.Tensor | None = None
        self.std: torch.Tensor | None = None

    @property
    def ready(self) -> bool:
        return self.collected >= self.chunks

    def distance(self, latents: torch.Tensor) -> float:
        """Largest per-channel deviation from the anchor, in units of the anchor's std."""
        if self.mean is None or self.std is None:
            return 0.0
        mean, std = channel_stats(latents)
        scale = self.std.clamp(min=1e-3)
        return float(torch.maximum((mean - self.mean).abs() / scale, (std - self.std).abs() / scale).max())

    def apply(self, latents: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Collect anchor statistics from opening chunks, or pull a drifted chunk back.

        Returns the (possibly corrected) latents and whether a correction was applied.
        """
        mean, std = channel_stats(latents)
        if not self.ready:
            weight = 1.0 / (self.collected + 1)
            self.mean = mean if self.mean is None else self.mean + weight * (mean - self.mean)
            self.std = std if self.std is None else self.std + weight * (std - self.std)
            self.collected += 1
            return latents, False
        if self.strength == 0 or self.distance(latents) <= self.tolerance:
            return latents, False
        assert self.mean is not None and self.std is not None  # distance() is 0 without an anchor
        target_mean = mean + self.strength * (self.mean - mean)
        target_std = std + self.strength * (self.std - std)
        scale = (target_std / std.clamp(min=1e-6))[:, :, None, None, None]
        corrected = (latents - mean[:, :, None, None, None]) * scale + target_mean[:, :, None, None, None]
        return corrected, True

    def state(self) -> dict[str, torch.Tensor]:
        if self.mean is None or self.std is None:
            return {"anchor_collected": torch.tensor([self.collected])}
        return {
            "anchor_collected": torch.tensor([self.collected]),
            "anchor_mean": self.mean,
            "anchor_std": self.std,
        }

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.collected = int(tensors["anchor_collected"][0])
        self.mean = tensors.get("anchor_mean")
        self.std = tensors.get("anchor_std")


@dataclass
class DriftMeasures:
    stats_distance: float
    """Per-channel deviation of the chunk's latent statistics from the anchor (anchor stds)."""
    change_energy: float
    """Mean absolute latent change between consecutive latent frames."""
    frozen: bool
    """The video has barely changed for ``freeze_chunks`` chunks."""
    repetition: float
    """Highest cosine similarity to an earlier, non-adjacent chunk (1: an exact repeat)."""
    corrected: bool
    """Statistics anchoring pulled this chunk back."""


class DriftMonitor:
    def __init__(self, freeze_threshold: float = 0.002, freeze_chunks: int = 4, history: int = 16) -> None:
        self.freeze_threshold = freeze_threshold
        self.freeze_chunks = freeze_chunks
        self.history: deque[torch.Tensor] = deque(maxlen=history)
        self.quiet_chunks = 0
        self.last_frame: torch.Tensor | None = None

    def reset(self) -> None:
        self.history.clear()
        self.quiet_chunks = 0
        self.last_frame = None

    def state(self) -> dict[str, torch.Tensor]:
        """Tensors to save for resuming: the chunks compared against, the quiet count, the last frame."""
        out = {"quiet_chunks": torch.tensor([self.quiet_chunks])}
        if self.history:
            out["history"] = torch.stack(list(self.history))
        if self.last_frame is not None:
            out["last_frame"] = self.last_frame
        return out

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.reset()
        self.quiet_chunks = int(tensors["quiet_chunks"][0])
        self.history.extend(tensors["history"].unbind(0) if "history" in tensors else [])
        self.last_frame = tensors.get("last_frame")

    def measure(self, latents: torch.Tensor, anchor: StatsAnchor | None, corrected: bool) -> DriftMeasures:
        frames = latents.float()
        if self.last_frame is not None:
            frames = torch.cat([self.last_frame, frames], dim=2)
        energy = float(frames.diff(dim=2).abs().mean()) if frames.shape[2] > 1 else 0.0
        self.quiet_chunks = self.quiet_chunks + 1 if energy < self.freeze_threshold else 0
        flat = latents.float().flatten(1)
        flat = flat / flat.norm(dim=1, keepdim=True).clamp(min=1e-8)
        older = list(self.history)[:-1]  # skip the adjacent chunk: it is meant to look alike
        repetition = max((float((flat * h).sum(dim=1).min()) for h in older), default=0.0)
        self.history.append(flat)
        self.last_frame = latents[:, :, -1:].float()
        return DriftMeasures(
            stats_distance=anchor.distance(latents) if anchor is not None else 0.0,
            change_energy=energy,
            frozen=self.quiet_chunks >= self.freeze_chunks,
            repetition=repetition,
            corrected=corrected,
        )
