"""SessionManager: sessions stepped from worker threads, stopping, freeing; a session extended by
more seconds, given a new prompt, evicted and restored, or restored after a crash makes exactly the
frames of one uninterrupted ``pipe.stream`` (the page's local backend and each Serve replica run it)."""

import contextvars
import json
import threading

import numpy as np
import pytest

from tests.tiny import FP32, assert_frames_match, tiny_components
from vidgen.attention import dispatch
from vidgen.pipelines import InputError
from vidgen.pipelines.session import (
    GenerationRequest,
    ModelInfo,
    RequestLimits,
    SessionManager,
    SessionNotFound,
)

PROMPT = "a red circle moving left on a black background"


@pytest.fixture(scope="module")
def sessions():
    return SessionManager(tiny_components())


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
    assert sum(len(f) for f in frames) == 32
    assert sessions.active == 1  # at its length, it stays (it can be extended) until stopped
    sessions.stop(session_id)
    assert sessions.active == 0
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


def test_a_servers_limits_refuse_a_request_at_open_before_memory_is_spent(sessions):
    """``vidgen serve`` (and each Serve replica) bound one request below the model's own limits:
    by default twice the config's size (64 -> 128) and steps (4 -> 16)."""
    limited = SessionManager(sessions.pipe, limits=RequestLimits())
    info = limited.info
    assert (info.max_side, info.max_steps) == (128, 16) and sessions.info.max_side == 512
    for request, message in [
        (
            GenerationRequest(prompt=PROMPT, height=2048, width=2048),
            "height must be at most 128 on this server",
        ),
        (GenerationRequest(prompt=PROMPT, width=136), "width must be at most 128 on this server"),
        (GenerationRequest(prompt=PROMPT, num_inference_steps=17), "steps must be at most 16 on this server"),
    ]:
        with pytest.raises(InputError, match=message):
            limited.open(request)
    assert limited.active == 0
    # the same requests within the model's own bounds open without the server's limits
    sessions.stop(sessions.open(GenerationRequest(prompt=PROMPT, width=136, num_inference_steps=17)))
    at_the_limit = limited.open(
        GenerationRequest(prompt=PROMPT, height=128, width=128, num_inference_steps=16)
    )
    limited.stop(at_the_limit)
    assert limited.active == 0
    # set explicitly, and never above what the model itself can do
    info = SessionManager(sessions.pipe, limits=RequestLimits(max_side=4096, max_steps=8)).info
    assert (info.max_side, info.max_steps) == (512, 8)


# ---------------------------------------------------------------------- length, persistence
RED = "a red circle moving left on a black background"
BLUE = "a blue square moving up on a white background"
FPS = 16


@pytest.fixture(scope="module")
def pipe():
    return tiny_components(**FP32)  # as the workers' pipeline folder


def _read(store, session_id) -> np.ndarray:
    store.begin_read(session_id)
    try:
        chunks = []
        while (chunk := store.next_chunk(session_id)) is not None:
            chunks.append(chunk)
    finally:
        store.end_read(session_id)
    starts = [c.frame_start for c in chunks]
    assert all(b == a + len(c.frames) for a, b, c in zip(starts, starts[1:], chunks))  # no gap, no repeat
    return np.concatenate([c.frames for c in chunks])


def _uninterrupted(pipe, seconds, seed, storyboard=None) -> np.ndarray:
    board = storyboard or [(0.0, RED)]
    return np.concatenate([c.frames for c in pipe.stream(storyboard=board, seconds=seconds, generator=seed)])


def test_extended_session_continues_seamlessly_with_a_new_prompt(pipe):
    store = SessionManager(pipe)
    sid = store.open(GenerationRequest(prompt=RED, seconds=1.0, seed=3))
    first = _read(store, sid)  # chunks end at 5, 13, 21 frames: the third is cut at 16
    assert len(first) == 16
    store.change_prompt(sid, BLUE)
    store.extend(sid, 0.5)
    second = _read(store, sid)  # the rest of the cut chunk (red), then blue from frame 21
    assert len(second) == 8
    expected = _uninterrupted(pipe, 1.5, 3, [(0.0, RED), (21 / FPS, BLUE)])
    assert_frames_match(np.concatenate([first, second]), expected)
    store.close()


@pytest.mark.parametrize("seconds", [1.0, 13 / FPS], ids=["cut-chunk", "whole-chunks"])
def test_evicted_session_is_restored_from_disk(pipe, tmp_path, seconds):
    store = SessionManager(pipe, persist_dir=tmp_path, idle_timeout_s=0.0)
    sid = store.open(GenerationRequest(prompt=RED, seconds=seconds, seed=5))
    first = _read(store, sid)
    assert store.idle() == [sid] and store.evict(sid)
    assert store.describe()["sessions"] == [] and (tmp_path / sid / "session.json").is_file()

    other = SessionManager(pipe, persist_dir=tmp_path)  # e.g. another replica, or this one later
    other.extend(sid, 1.0)
    rest = _read(other, sid)
    other.close()
    assert other.restored == 1
    assert_frames_match(np.concatenate([first, rest]), _uninterrupted(pipe, seconds + 1.0, 5))


def test_session_survives_a_crash_of_its_replica(pipe, tmp_path):
    """No eviction: the state saved after every chunk is all another replica gets."""
    store = SessionManager(pipe, persist_dir=tmp_path)
    sid = store.open(GenerationRequest(prompt=RED, seconds=1.0, seed=6))
    first = _read(store, sid)
    store.close()  # the replica is gone without saving anything more
    survivor = SessionManager(pipe, persist_dir=tmp_path)
    survivor.extend(sid, 1.0)
    rest = _read(survivor, sid)
    survivor.close()
    assert_frames_match(np.concatenate([first, rest]), _uninterrupted(pipe, 2.0, 6))


def test_stop_forgets_the_session(pipe, tmp_path):
    store = SessionManager(pipe, persist_dir=tmp_path)
    sid = store.open(GenerationRequest(prompt=RED, seconds=1.0, seed=1))
    store.stop(sid)
    assert not (tmp_path / sid).exists()
    with pytest.raises(SessionNotFound):
        store.begin_read(sid)
    reading = store.open(GenerationRequest(prompt=RED, seed=1))  # no end
    store.begin_read(reading)
    assert store.next_chunk(reading) is not None
    with pytest.raises(RuntimeError, match="already being read"):
        store.begin_read(reading)
    store.stop(reading)  # ends before the next chunk, closed by its reader
    assert store.next_chunk(reading) is None
    store.end_read(reading)
    assert store.describe()["sessions"] == []


def test_continuation_session_opens_with_the_clip_and_survives_a_crash(pipe, tmp_path):
    from vidgen.pipelines import InputError
    from vidgen.video import read_video, write_mp4

    clip = tmp_path / "clip.mp4"
    write_mp4(clip, (np.random.default_rng(2).random((9, 64, 64, 3)) * 255).astype(np.uint8), fps=FPS)
    request = GenerationRequest(prompt=RED, seconds=1.0, seed=4, video=str(clip))
    store = SessionManager(pipe, persist_dir=tmp_path / "sessions")
    sid = store.open(request)
    first = _read(store, sid)
    assert len(first) == 9 + 16  # the clip, then the session's second
    store.close()  # crash: another replica restores it from the saved state
    survivor = SessionManager(pipe, persist_dir=tmp_path / "sessions")
    survivor.extend(sid, 0.5)
    rest = _read(survivor, sid)
    survivor.close()
    whole = pipe.stream(RED, seconds=1.5, generator=4, video=read_video(clip)[0], include_input=True)
    assert_frames_match(np.concatenate([first, rest]), np.concatenate([c.frames for c in whole]))
    with pytest.raises(InputError, match="no such image file"):
        SessionManager(pipe).open(GenerationRequest(prompt=RED, seconds=1.0, image=str(tmp_path / "x.png")))


def test_a_session_makes_the_frames_of_the_python_api_for_the_same_request(pipe, tmp_path):
    """The session manager runs a request as the Python API does: its storyboard, negative prompt
    (guidance on), start image, seed and per-video overrides reach the stream (the manager runs it
    without end), and the video is cut at its length as ``pipe.stream`` cuts it."""
    from PIL import Image

    image = tmp_path / "start.png"
    Image.fromarray((np.random.default_rng(4).random((64, 64, 3)) * 255).astype(np.uint8)).save(image)
    board = [(0.0, RED), (0.5, BLUE)]
    request = GenerationRequest(storyboard=board, seconds=1.0, seed=9, image=str(image))
    request.guidance_scale, request.negative_prompt = 3.0, "a green triangle"
    request.overrides["drift.anchor_stats"] = False
    sessions = SessionManager(pipe)
    sid = sessions.open(request)
    got = np.concatenate([c.frames for c in sessions.chunks(sid)])
    sessions.stop(sid)
    api = pipe.stream(**request.stream_kwargs())  # the Python API; the mapping: test_request.py
    expected = np.concatenate([c.frames for c in api])
    assert got.shape == expected.shape == (1 + 16, 64, 64, 3)
    assert np.array_equal(got, expected)
    # and the request a session keeps on disk is the one it was opened with, its seed set
    sessions = SessionManager(pipe, persist_dir=tmp_path / "sessions")
    sid = sessions.open(GenerationRequest(prompt=RED, seconds=1.0, negative_prompt="a blue square"))
    saved = json.loads((tmp_path / "sessions" / sid / "session.json").read_text())
    assert saved["request"]["negative_prompt"] == "a blue square" and saved["request"]["seed"] is not None
    sessions.stop(sid)
    assert not (tmp_path / "sessions" / sid).exists()
