"""OverlappedDecoder on CPU: same frames as the pipeline's own decode, handed back one chunk late."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tiny import FP32, tiny_components
from vidgen.config import ConfigError, load_config
from vidgen.pipelines.overlap import OverlappedDecoder

PROMPT = "a red circle moving left on a black background"


def test_overlapped_decode_gives_the_pipeline_frames_one_chunk_late():
    pipe = tiny_components(**FP32)
    expected = [c.frames for c in pipe.stream(PROMPT, seconds=2, generator=1)]
    decoder = OverlappedDecoder(pipe.vae, pipe.device)
    assert not decoder.overlapping  # CPU: decoded on submit, collected with the same lag
    got, lags = [], []
    for chunk in pipe.stream(PROMPT, seconds=2, generator=1, decode=False):
        assert chunk.frames.shape[0] == 0 and chunk.latents is not None
        decoder.submit(chunk.latents, chunk.index * pipe.config.generation.chunk_frames)
        ready = list(decoder.ready())
        lags.append(len(ready))
        got.extend(ready)
    got.extend(decoder.finish())
    assert lags == [0] + [1] * (len(expected) - 1)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        # the pipeline trims the last chunk to the requested length; the decoder does not
        assert np.array_equal(a[: len(b)], b)


def test_compile_mode_reaches_the_compiled_blocks(monkeypatch):
    pipe = tiny_components(**{"runtime.compile_mode": "max-autotune-no-cudagraphs"})
    calls = []
    monkeypatch.setattr(pipe.transformer, "compile_blocks", lambda **kw: calls.append(kw))
    pipe.compile()
    assert calls == [{"mode": "max-autotune-no-cudagraphs"}]
    calls.clear()
    pipe.compile("default")
    assert calls == [{"mode": None}]
    with pytest.raises(ConfigError, match="runtime.compile_mode='fast'"):
        load_config("default").replace(**{"runtime.compile_mode": "fast"})
