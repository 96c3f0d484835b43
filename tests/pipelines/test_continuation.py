"""Image-to-video and continuation: the video opens with the given frames, inputs of another size
are resized as diffusers' VideoProcessor does, unreadable files are one-line errors, and the
default model carries the clip's colour, background and motion on."""

import numpy as np
import pytest
import torch
from PIL import Image

from tests.tiny import FP32, tiny_components
from vidgen.pipelines import InputError
from vidgen.shapes import captions, world
from vidgen.shapes.evaluate import evaluate_video

PROMPT = "a red circle moving left on a black background"


@pytest.fixture(scope="module")
def pipe():
    return tiny_components(**FP32)


def _round_trip(pipe, frames: np.ndarray) -> np.ndarray:
    """The autoencoder's reconstruction of ``frames`` (1 + 4k of them), computed here directly."""
    video = torch.tensor(frames, dtype=torch.float32).permute(3, 0, 1, 2)[None] / 127.5 - 1
    with torch.no_grad():
        decoded = pipe.vae.decode(pipe.vae.encode(video).latent_dist.mode()).sample
    return ((decoded[0].permute(1, 2, 3, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()


def test_continuation_opens_with_the_clip(pipe):
    clip = (np.random.default_rng(0).random((11, 64, 64, 3)) * 255).astype(np.uint8)
    plain = list(pipe.stream(PROMPT, num_frames=16, generator=0, video=clip))
    whole = list(pipe.stream(PROMPT, num_frames=16, generator=0, video=clip, include_input=True))
    # 11 frames: the newest 9 (1 + 4k) are encoded and come back through the autoencoder; the 2
    # older ones are written as given
    opening = whole[0].frames[:11]
    assert np.array_equal(opening[:2], clip[:2])
    off = np.abs(opening[2:].astype(int) - _round_trip(pipe, clip[2:]).astype(int))
    assert off.max() <= 1  # a float32 rounding step apart at most
    # then the continuation, unchanged; frame_start counts the opening
    assert np.array_equal(whole[0].frames[11:], plain[0].frames)
    assert np.array_equal(whole[1].frames, plain[1].frames)
    assert [c.frame_start for c in whole] == [0, 11 + 8]
    assert sum(len(c.frames) for c in whole) == 11 + 16


def test_an_image_of_another_size_is_resized_as_diffusers_does(pipe, tmp_path):
    image = (np.random.default_rng(1).random((40, 100, 3)) * 255).astype(np.uint8)
    path = tmp_path / "start.png"
    Image.fromarray(image).save(path)
    chunks = list(pipe.stream(PROMPT, num_frames=8, generator=0, image=str(path), include_input=True))
    assert chunks[0].frames.shape == (1 + 8, 64, 64, 3)
    # diffusers' VideoProcessor stretches PIL frames to the size with Lanczos
    expected = np.asarray(Image.fromarray(image).resize((64, 64), Image.Resampling.LANCZOS))
    same_array = list(pipe.stream(PROMPT, num_frames=8, generator=0, image=expected, include_input=True))
    assert np.array_equal(chunks[0].frames, same_array[0].frames)
    assert np.abs(chunks[0].frames[0].astype(int) - _round_trip(pipe, expected[None])[0]).max() <= 1


@pytest.mark.parametrize("kind", ["image", "video"])
def test_unreadable_input_is_a_one_line_input_error(pipe, tmp_path, kind):
    bad = tmp_path / "notes.txt"
    bad.write_text("not a picture")
    with pytest.raises(InputError, match=f"not an? {kind} file: .*notes.txt") as info:
        next(pipe.stream(PROMPT, num_frames=8, generator=0, **{kind: str(bad)}))
    assert "\n" not in str(info.value)
    with pytest.raises(InputError, match=f"no such {kind} file"):
        next(pipe.stream(PROMPT, num_frames=8, generator=0, **{kind: str(tmp_path / "missing")}))


@pytest.fixture(scope="module")
def default_pipe():
    from vidgen.pipelines import LongVideoPipeline

    return LongVideoPipeline.from_pretrained(None)


STARTS = {"right": (0.3, 0.5), "left": (0.7, 0.5), "up": (0.5, 0.7), "down": (0.5, 0.3)}


def test_default_model_continues_colour_background_and_motion(default_pipe):
    """The default model is weak on shapes, so the continued part is judged on what it does
    carry: the object's colour and the background in every frame, and the direction of motion
    (mean displacement over the first continued second) for most of the four directions."""
    along = []
    for direction, start in STARTS.items():
        scene = world.Scene("black", "red", "square", "medium", "slow", direction)
        clip = world.render_clip(scene, 17, size=64, start=start)
        caption = captions.caption(scene)
        video = default_pipe(caption, seconds=2, generator=1, video=clip.frames, include_input=True).frames
        frames = (video * 255).round().astype(np.uint8)
        assert len(frames) == 17 + 32
        # the opening: the clip after the trained autoencoder's round trip
        assert np.abs(frames[:17].astype(int) - clip.frames.astype(int)).mean() < 4
        report = evaluate_video(frames[17:], caption)
        assert all(r.color == "red" for r in report.frames), direction
        assert all(max(r.background) < 16 for r in report.frames), direction
        centroids = np.array([r.centroid for r in report.frames[:16]], dtype=float)
        step = np.nanmean(np.diff(centroids, axis=0), axis=0)
        along.append(float(step @ np.array(world.DIRECTIONS[direction])))
    assert sum(a > 0 for a in along) >= 3, along


def test_a_resumed_continuation_equals_an_uninterrupted_one(pipe, tmp_path):
    clip = (np.random.default_rng(4).random((9, 64, 64, 3)) * 255).astype(np.uint8)
    kwargs = dict(num_frames=24, generator=2, video=clip, include_input=True)
    full = list(pipe.stream(PROMPT, **kwargs))
    state = tmp_path / "state.safetensors"
    stream = pipe.stream(PROMPT, state_path=state, **kwargs)
    first = [next(stream) for _ in range(2)]
    stream.close()  # killed holding chunk 1: the state after chunk 0 is saved
    rest = list(pipe.stream(PROMPT, state_path=state, resume=True, **kwargs))
    assert [c.index for c in rest] == [1, 2]
    assert [c.frame_start for c in first[:1] + rest] == [c.frame_start for c in full]
    made = np.concatenate([c.frames for c in first[:1] + rest])
    assert np.array_equal(made, np.concatenate([c.frames for c in full]))
