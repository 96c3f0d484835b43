"""Pipelines: the chunk planner, the diffusion denoiser, streaming decode and ``LongVideoPipeline``."""

from vidgen.pipelines.loading import ModelLoadError
from vidgen.pipelines.pipeline import (
    ChunkMetrics,
    InputError,
    LongVideoPipeline,
    LongVideoPipelineOutput,
    StreamControl,
    VideoChunk,
)
from vidgen.pipelines.plan import ChunkPlan, DriftAction, GenerationMode, PlannedChunk

__all__ = [
    "ChunkMetrics",
    "ChunkPlan",
    "DriftAction",
    "GenerationMode",
    "InputError",
    "LongVideoPipeline",
    "LongVideoPipelineOutput",
    "ModelLoadError",
    "PlannedChunk",
    "StreamControl",
    "VideoChunk",
]
