"""The embedded default model: ships inside the package, loads offline, renders a clip that the
Shapes World evaluator judges."""

from __future__ import annotations

import numpy as np
import pytest

from vidgen import LongVideoPipeline
from vidgen.pipelines.loading import default_model_dir
from vidgen.shapes.evaluate import evaluate_video

# the README's prompt: a phrasing ("ball", "bouncing") that no training caption uses verbatim
PROMPT = "a red ball bouncing on a black background"


def test_shipped_files_fit_the_budget_and_are_described():
    folder = default_model_dir()
    files = [f for f in folder.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    assert sum(f.stat().st_size for f in files) <= 25 * 2**20  # the shipped model's budget: 25 MB
    names = {f.relative_to(folder).as_posix() for f in files}
    assert {"model_index.json", "vidgen.toml", "MODEL_CARD.md"} <= names
    assert "transformer/diffusion_pytorch_model.safetensors" in names
    assert "vae/diffusion_pytorch_model.safetensors" in names
    card = (folder / "MODEL_CARD.md").read_text()
    for section in ("## Training", "## Evaluation", "## Limitations"):
        assert section in card


@pytest.fixture(scope="module")
def clip():
    pipe = LongVideoPipeline.from_pretrained()  # no argument: the embedded model, nothing downloaded
    frames = np.concatenate([c.frames for c in pipe.stream(PROMPT, seconds=2, generator=0)])
    return pipe, frames, evaluate_video(frames, PROMPT, fps=pipe.config.generation.fps)


def test_loads_offline_and_renders_the_asked_scene(clip):
    pipe, frames, report = clip
    assert frames.shape == (32, 64, 64, 3) and frames.dtype == np.uint8
    assert all(
        p.dtype == np.float32 or str(p.dtype) == "torch.float32" for p in pipe.transformer.parameters()
    )
    assert pipe.transformer.config.num_layers == 8 and pipe.text_encoder.hidden_size == 384
    # black, as asked, in every frame, and a red object in nearly every one (a random or broken
    # model fails this at once)
    assert not [f.index for f in report.frames if f.reason == "background"]
    assert sum(f.reason in ("no_object", "color") for f in report.frames) <= 0.1 * len(report.frames)


# The targets for the shipped model, and the best levels measured so far on the fixed
# set below (held-out phrasings, 4-s videos, seeds 0..39, float32; `python -m
# tests.vidgen.test_default_model` prints them). Until a target is reached the test asserts the
# measured level minus its margin, so a regression fails; raise MEASURED whenever better weights
# ship. Forty videos, not six: two models level on 120 other videos (their first 1-s windows 60.0
# and 58.3 %) differed by 7 of 24 windows on six (stop 42), so six could not tell a regression
# from a draw. Float32, as the shipped config (`runtime.autocast = "off"`, stop 44) samples: in the
# bfloat16 autocast that "auto" picks on CPUs with native bfloat16 the sampled videos follow the
# CPU's kernels (the shipped model's 1-s windows here were 69.4 % on one AVX-512 machine, 64.4 % on
# another and 63.7 % on the second with its kernels held to AVX2), while in float32 they are the
# same on both paths (stop 43).
FIXED_SET = 40
TARGETS = {"adherence_rate": 0.9, "frame_pass_rate": 0.9, "shape_right_rate": 0.95, "window_pass_rate": 0.9}
MEASURED = {
    "adherence_rate": 0.225,  # stop 42's student: 9 of 40
    "frame_pass_rate": 0.914,  # stop 42's student
    "shape_right_rate": 0.93,  # stop 45's student (stop 42's: 0.924)
    "window_pass_rate": 0.738,  # stop 34's student (stop 42's: 0.669)
}
# the margin covers a new model's draw on 40 videos (a paired difference of 1-s windows has a
# standard error of about 5.5 points) and CPUs whose float32 kernels round differently
MARGIN = 0.08


def _fixed_set_summary() -> dict[str, float]:
    from vidgen.evaluation import held_out_prompts, run_video, summarize

    pipe = LongVideoPipeline.from_pretrained()
    # the shipped config samples in float32, so these levels hold on any CPU (see above)
    assert pipe.config.runtime.autocast == "off"
    prompts = held_out_prompts(FIXED_SET, seed=11)
    return summarize([run_video(pipe, p, seconds=4.0, seed=i)[0] for i, p in enumerate(prompts)])


@pytest.fixture(scope="module")
def fixed_set():
    return _fixed_set_summary()


@pytest.mark.parametrize("figure", sorted(TARGETS))
def test_the_shipped_model_keeps_its_measured_level(fixed_set, figure):
    floor = min(TARGETS[figure], MEASURED[figure] - MARGIN)
    if floor <= 0:
        pytest.skip(f"no {figure} measured above the margin yet: nothing to guard")
    assert fixed_set[figure] >= floor, (figure, fixed_set[figure], floor)


if __name__ == "__main__":
    summary = _fixed_set_summary()
    print({k: round(summary[k], 3) for k in TARGETS})
