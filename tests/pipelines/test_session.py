"""LocalSessions: sessions stepped from worker threads, stopping, freeing."""

import contextvars
import threading

import numpy as np
import pytest

from tests.tiny import tiny_components
from vidgen.attention import dispatch
from vidgen.pipelines import InputError
from vidgen.pipelines.session import GenerationRequest, LocalSessions, ModelInfo, SessionNotFound

PROMPT = "a red circle moving left on a black background"


@pytest.fixture(scope="module")
def sessions():
    return LocalSessions(tiny_components())


def _in_fresh_thread(fn):
    """Runs ``fn`` in a new thread with a copy of this context, as a server's worker pool does."""
    out, context = [], contextvars.copy_context()
    thread = threading.Thread(target=lambda: out.append(context.run(fn)))
    thread.start()
    thread.join()
    return out[0] if out else None


def test_a_session_stepped_from_different_threads_keeps_its_attention_backend(sessions, monkeypatch):
    chosen = []
    select = dispatch.select_backend

    def spy(*args, **kwargs):
        chosen.append(dispatch._CHOSEN.get())  # what attention_backend(...) set, where attention runs
        return select(*args, **kwargs)

    monkeypatch.setattr(dispatch, "select_backend", spy)
    session_id = sessions.open(
        GenerationRequest(prompt=PROMPT, seconds=2, seed=1, overrides={"runtime.attention_backend": "sdpa"})
    )
    chunks = sessions.chunks(session_id)
    frames = []
    # without one context per session the choice is lost after the first step, and the last
    # step fails resetting a context variable set in another context
    while (chunk := _in_fresh_thread(lambda: next(chunks, None))) is not None:
        frames.append(chunk.frames)
    assert len(frames) == 5 and set(chosen) == {"sdpa"}
    assert sum(len(f) for f in frames) == 32 and sessions.active == 0
    monkeypatch.undo()
    same = np.concatenate([c.frames for c in sessions.pipe.stream(PROMPT, seconds=2, generator=1)])
    assert np.array_equal(np.concatenate(frames), same)


def test_stop_closes_a_session_nobody_reads(sessions):
    session_id = sessions.open(GenerationRequest(prompt=PROMPT, seed=0))
    assert sessions.active == 1
    sessions.stop(session_id)
    assert sessions.active == 0
    with pytest.raises(SessionNotFound):
        sessions.chunks(session_id)
    sessions.stop(session_id)  # stopping twice is harmless


def test_stop_while_reading_ends_before_the_next_chunk(sessions):
    session_id = sessions.open(GenerationRequest(prompt=PROMPT, seed=0))  # until stopped
    chunks = sessions.chunks(session_id)
    next(chunks)
    sessions.stop(session_id)
    assert sessions.active == 1  # the reader closes it
    assert next(chunks, None) is None
    assert sessions.active == 0


def test_a_session_is_read_once(sessions):
    session_id = sessions.open(GenerationRequest(prompt=PROMPT, seconds=1, seed=0))
    chunks = sessions.chunks(session_id)
    with pytest.raises(RuntimeError, match="already being read"):
        sessions.chunks(session_id)
    chunks.close()  # never started: closing it still frees the session
    sessions.stop(session_id)
    assert sessions.active == 0


def test_model_info_checks_sizes_and_overrides(sessions):
    info = sessions.info
    assert isinstance(info, ModelInfo) and info.fps == 16 and info.size_multiple == 8
    info.check_size(64, 128)
    for bad in ((60, 64), (64, 0), (64, -8), (info.max_side + 16, 64)):
        with pytest.raises(InputError, match="height|width"):
            info.check_size(*bad)
    assert info.check_overrides({"generation.window_frames": 8}).generation.window_frames == 8
    with pytest.raises(InputError, match="multiple of chunk_frames"):
        info.check_overrides({"generation.window_frames": 3})
