"""Rectified-flow noise schedule and few-step samplers, as Wan and its causal descendants use them.

Noising: ``x_sigma = (1 - sigma) * x_0 + sigma * noise`` with sigma in [0, 1]; the model sees
``timestep = 1000 * sigma`` and predicts the velocity ``noise - x_0``. A shift ``s`` spends more
steps at high noise: ``sigma' = s * sigma / (1 + (s - 1) * sigma)`` (Wan uses 3-5).

Samplers (:class:`~vidgen.config.SamplerKind`, the config's ``generation.sampler``): ``euler``
integrates the flow; ``x0_renoise`` predicts the clean sample at each step and re-noises it to the
next level with fresh noise (the few-step sampler of CausVid and Self Forcing, for distilled models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch

from vidgen.config import SamplerKind

NUM_TRAIN_TIMESTEPS = 1000


def shift_sigma(sigma: torch.Tensor | float, shift: float) -> torch.Tensor | float:
    return shift * sigma / (1 + (shift - 1) * sigma)


@dataclass(frozen=True)
class FlowSchedule:
    """The sigmas of an N-step sampling run, from 1 down to 0."""

    num_steps: int
    shift: float = 3.0
    sampler: SamplerKind = SamplerKind.EULER
    timesteps: tuple[float, ...] = ()
    """Explicit timesteps (1000 * sigma, decreasing) instead of the shifted uniform grid, as a
    distilled model was trained with them (CausVid: 1000, 757, 522)."""

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"num_inference_steps must be >= 1, got {self.num_steps}")
        if self.shift <= 0:
            raise ValueError(f"shift must be > 0, got {self.shift}")
        if self.timesteps and len(self.timesteps) != self.num_steps:
            raise ValueError(
                f"num_inference_steps={self.num_steps} but the model's timesteps are {list(self.timesteps)}: "
                f"use {len(self.timesteps)} steps"
            )
        object.__setattr__(self, "sampler", SamplerKind(self.sampler))

    @property
    def sigmas(self) -> list[float]:
        """``num_steps + 1`` levels, the last one 0."""
        if self.timesteps:
            return [t / NUM_TRAIN_TIMESTEPS for t in self.timesteps] + [0.0]
        base = [1.0 - i / self.num_steps for i in range(self.num_steps)]
        return [float(shift_sigma(s, self.shift)) for s in base] + [0.0]

    def step(
        self,
        sample: torch.Tensor,
        velocity: torch.Tensor,
        index: int,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Move ``sample`` from level ``sigmas[index]`` to ``sigmas[index + 1]``."""
        sigmas = self.sigmas
        return self.step_between(sample, velocity, sigmas[index], sigmas[index + 1], generator)

    def step_between(
        self,
        sample: torch.Tensor,
        velocity: torch.Tensor,
        sigma: float,
        sigma_next: float,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Move ``sample`` from level ``sigma`` to ``sigma_next`` (two levels of a chunk's plan)."""
        if self.sampler == SamplerKind.EULER or sigma_next == 0.0:
            if self.sampler == SamplerKind.X0_RENOISE:
                return sample - sigma * velocity  # predicted clean sample
            return sample + (sigma_next - sigma) * velocity
        clean = sample - sigma * velocity
        noise = torch.randn(sample.shape, generator=generator, device=sample.device, dtype=sample.dtype)
        return add_noise(clean, noise, sigma_next)


_Sigma = TypeVar("_Sigma", torch.Tensor, float)


def add_noise(clean: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor | float) -> torch.Tensor:
    """``(1 - sigma) * clean + sigma * noise``; ``sigma`` broadcasts (a float or a tensor)."""
    return (1 - sigma) * clean + sigma * noise


def timestep_of(sigma: _Sigma) -> _Sigma:
    return sigma * NUM_TRAIN_TIMESTEPS
