"""The sessions a serving replica holds (``SessionStore``, no Ray needed): a session extended by more
seconds, given a new prompt, evicted and restored, or restored after a crash makes exactly the
frames of one uninterrupted ``pipe.stream``."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tiny import FP32, assert_frames_match, tiny_components
from vidgen.pipelines.session import GenerationRequest, SessionNotFound
from vidgen.serving.session_store import SessionStore

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
    store = SessionStore(pipe)
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
    store = SessionStore(pipe, persist_dir=tmp_path, idle_timeout_s=0.0)
    sid = store.open(GenerationRequest(prompt=RED, seconds=seconds, seed=5))
    first = _read(store, sid)
    assert store.idle() == [sid] and store.evict(sid)
    assert store.describe()["sessions"] == [] and (tmp_path / sid / "session.json").is_file()

    other = SessionStore(pipe, persist_dir=tmp_path)  # e.g. another replica, or this one later
    other.extend(sid, 1.0)
    rest = _read(other, sid)
    other.close()
    assert other.restored == 1
    assert_frames_match(np.concatenate([first, rest]), _uninterrupted(pipe, seconds + 1.0, 5))


def test_session_survives_a_crash_of_its_replica(pipe, tmp_path):
    """No eviction: the state saved after every chunk is all another replica gets."""
    store = SessionStore(pipe, persist_dir=tmp_path)
    sid = store.open(GenerationRequest(prompt=RED, seconds=1.0, seed=6))
    first = _read(store, sid)
    store.close()  # the replica is gone without saving anything more
    survivor = SessionStore(pipe, persist_dir=tmp_path)
    survivor.extend(sid, 1.0)
    rest = _read(survivor, sid)
    survivor.close()
    assert_frames_match(np.concatenate([first, rest]), _uninterrupted(pipe, 2.0, 6))


def test_stop_forgets_the_session(pipe, tmp_path):
    store = SessionStore(pipe, persist_dir=tmp_path)
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
    store = SessionStore(pipe, persist_dir=tmp_path / "sessions")
    sid = store.open(request)
    first = _read(store, sid)
    assert len(first) == 9 + 16  # the clip, then the session's second
    store.close()  # crash: another replica restores it from the saved state
    survivor = SessionStore(pipe, persist_dir=tmp_path / "sessions")
    survivor.extend(sid, 0.5)
    rest = _read(survivor, sid)
    survivor.close()
    whole = pipe.stream(RED, seconds=1.5, generator=4, video=read_video(clip)[0], include_input=True)
    assert_frames_match(np.concatenate([first, rest]), np.concatenate([c.frames for c in whole]))
    with pytest.raises(InputError, match="no such image file"):
        SessionStore(pipe).open(GenerationRequest(prompt=RED, seconds=1.0, image=str(tmp_path / "x.png")))
