"""``generation.attention = "radial"``: the pattern generation builds from the KV cache's layout."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.tiny import FP32, tiny_components
from vidgen.attention import PatternKind
from vidgen.config import ConfigError, load_config
from vidgen.pipelines.denoiser import ChunkDenoiser

PROMPT = "a red circle moving left on a black background"


def _record_patterns(monkeypatch, edit=None):
    """Record (pattern, cached frames, frame_offset) of every model call; ``edit`` may change the pattern."""
    seen = []
    original = ChunkDenoiser._pattern

    def recording(self, latents, cache, frame_offset, joint=False):
        pattern = original(self, latents, cache, frame_offset, joint)
        if pattern is not None and edit is not None:
            pattern = edit(pattern)
        seen.append((pattern, list(cache.cached_frames), frame_offset, latents.shape[2]))
        return pattern

    monkeypatch.setattr(ChunkDenoiser, "_pattern", recording)
    return seen


def test_radial_pattern_follows_the_cache_ring(monkeypatch):
    # default model geometry: chunks of 2 frames, 2 sinks, a window of 4: the ring wraps by chunk 4
    pipe = tiny_components(**FP32, **{"generation.attention": "radial"})
    seen = _record_patterns(monkeypatch)
    latents = pipe(PROMPT, seconds=3, generator=0, output_type="latent").frames
    assert torch.isfinite(latents).all()
    wrapped = 0
    for pattern, cached, offset, frames in seen:
        assert pattern.kind is PatternKind.RADIAL
        keys = cached + list(range(offset, offset + frames))
        newest = max(keys)
        assert pattern.frame_times == tuple(f - newest for f in keys)
        assert pattern.sink_frames == sum(1 for f in cached if f < 2)
        wrapped += cached != sorted(cached)
    assert wrapped > 0, "the video should be long enough for the window ring to wrap"


def test_radial_that_sees_everything_is_dense(monkeypatch):
    # with the band as wide as the frame the radial pattern hides nothing: the video must equal
    # the dense one, which checks the key layout and lengths it is run with end to end
    dense = tiny_components(**FP32)
    expected = dense(PROMPT, seconds=2, generator=0, output_type="latent").frames
    seen = _record_patterns(monkeypatch, edit=lambda p: dataclasses.replace(p, band_rows=64))
    radial = tiny_components(**FP32, **{"generation.attention": "radial"})
    got = radial(PROMPT, seconds=2, generator=0, output_type="latent").frames
    assert seen and all(p.kind is PatternKind.RADIAL for p, *_ in seen)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    monkeypatch.undo()
    sparse = tiny_components(**FP32, **{"generation.attention": "radial"})
    assert not torch.allclose(sparse(PROMPT, seconds=2, generator=0, output_type="latent").frames, expected)


def test_unknown_attention_is_a_config_error():
    with pytest.raises(ConfigError, match="generation.attention='sparse' is not one of 'dense', 'radial'"):
        load_config("default").replace(**{"generation.attention": "sparse"})
