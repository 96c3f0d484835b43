"""Shapes World: the procedural world the default vidgen model is trained on, and its evaluator.

- ``world``: attribute tables, ``Scene``, storyboards and the clip renderer (``render_clip``).
- ``prompts``: ``PromptSpec``, the attribute vocabulary, and ``parse_prompt``.
- ``captions``: canonical, paraphrased and held-out captions for scenes and storyboards.
- ``measure``: what each frame shows (background, object colour, mask, shape, centroid).
- ``motion``: the motion rules (speed, direction, bounces).
- ``evaluate``: ``evaluate_video`` judges a video against a prompt or storyboard; ``summarize``.

Pure numpy, light to import.
"""

from vidgen.shapes.captions import (
    HELD_OUT_TEMPLATES,
    TRAINING_TEMPLATES,
    canonical_caption,
    caption,
    storyboard_captions,
    storyboard_from_text,
)
from vidgen.shapes.evaluate import VideoReport, evaluate_video, summarize
from vidgen.shapes.measure import FrameMeasurements, measure_frames
from vidgen.shapes.prompts import PromptSpec, parse_prompt
from vidgen.shapes.world import (
    BACKGROUNDS,
    COLORS,
    DIRECTIONS,
    FPS,
    SHAPES,
    SIZES,
    SPEEDS,
    Clip,
    Scene,
    render_clip,
    sample_scene,
    sample_storyboard,
)

__all__ = [
    "BACKGROUNDS",
    "COLORS",
    "DIRECTIONS",
    "FPS",
    "HELD_OUT_TEMPLATES",
    "SHAPES",
    "SIZES",
    "SPEEDS",
    "TRAINING_TEMPLATES",
    "Clip",
    "FrameMeasurements",
    "PromptSpec",
    "Scene",
    "VideoReport",
    "canonical_caption",
    "caption",
    "evaluate_video",
    "measure_frames",
    "parse_prompt",
    "render_clip",
    "sample_scene",
    "sample_storyboard",
    "storyboard_captions",
    "storyboard_from_text",
    "summarize",
]
