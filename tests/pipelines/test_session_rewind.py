"""Rewind and fork (SessionManager): a session keeps its state after each of its last chunks; going
back with the same prompt continues exactly as the video did, going back with another prompt makes
exactly the video whose storyboard changes there, a fork leaves the original as it was."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tiny import FP32, tiny_components
from vidgen.pipelines import InputError
from vidgen.pipelines.session import GenerationRequest, SessionManager

PROMPT = "a red circle moving left on a black background"
OTHER = "a blue square drifting down over a gray background"


@pytest.fixture(scope="module")
def pipe():
    return tiny_components(**FP32)


def _read(store: SessionManager, sid: str, frames: int | None = None) -> tuple[int, np.ndarray]:
    """(first frame, frames) read from the session: all of them, or chunks until ``frames``."""
    got, start = [], None
    reader = store.chunks(sid)
    for chunk in reader:
        start = chunk.frame_start if start is None else start
        got.append(chunk.frames)
        if frames is not None and chunk.frame_start + len(chunk.frames) >= frames:
            reader.close()
            break
    return start, np.concatenate(got)


def _whole(pipe, **request) -> np.ndarray:
    store = SessionManager(pipe, history_mb=0)
    return _read(store, store.open(GenerationRequest(**request)))[1]


def test_a_rewind_with_the_same_prompt_continues_frame_for_frame(pipe):
    fps = pipe.config.generation.fps
    expected = _whole(pipe, prompt=PROMPT, seconds=3.0, seed=5)
    store = SessionManager(pipe)
    sid = store.open(GenerationRequest(prompt=PROMPT, seconds=3.0, seed=5))
    _read(store, sid, frames=2 * fps)
    held = store.history(sid)
    assert held["position"] >= 2.0 and len(held["boundaries"]) >= 3 and 0 < held["bytes"] <= held["budget"]
    at = store.rewind(sid, 1.0)
    assert at in held["boundaries"] and at <= held["position"] - 1.0
    start, rest = _read(store, sid)
    assert start == round(at * fps) and 0 < start < 2 * fps
    np.testing.assert_array_equal(rest, expected[start:])
    store.stop(sid)


def test_a_rewind_with_another_prompt_is_the_video_that_changes_prompt_there(pipe):
    fps = pipe.config.generation.fps
    store = SessionManager(pipe)
    sid = store.open(GenerationRequest(prompt=PROMPT, seconds=3.0, seed=5))
    _, before = _read(store, sid, frames=2 * fps)
    store.change_prompt(sid, "a green triangle")  # made after the point gone back to: dropped
    _read(store, sid, frames=len(before) + 1)
    at = store.rewind(sid, store.history(sid)["position"] - 1.0, prompt=OTHER)
    start, rest = _read(store, sid)
    assert start == round(at * fps)
    expected = _whole(pipe, storyboard=[(0.0, PROMPT), (at, OTHER)], seconds=3.0, seed=5)
    np.testing.assert_array_equal(rest, expected[start:])
    np.testing.assert_array_equal(before[:start], expected[:start])
    assert not np.array_equal(rest, _whole(pipe, prompt=PROMPT, seconds=3.0, seed=5)[start:])
    assert store.history(sid)["prompts"] == [(0.0, PROMPT), (at, OTHER)]


def test_a_fork_branches_off_and_the_original_goes_on_unchanged(pipe):
    fps = pipe.config.generation.fps
    original = _whole(pipe, prompt=PROMPT, seconds=2.5, seed=8)
    store = SessionManager(pipe)
    sid = store.open(GenerationRequest(prompt=PROMPT, seconds=2.5, seed=8))
    _, first = _read(store, sid, frames=fps + 1)
    branch = store.fork(sid, 1.0, prompt=OTHER)
    start, forked = _read(store, branch)
    at = start / fps
    np.testing.assert_array_equal(
        forked, _whole(pipe, storyboard=[(0.0, PROMPT), (at, OTHER)], seconds=2.5, seed=8)[start:]
    )
    rest_start, rest = _read(store, sid)
    np.testing.assert_array_equal(np.concatenate([first, rest]), original)
    assert rest_start == len(first)


def test_the_history_is_bounded_by_its_budget_and_gone_with_the_session(pipe):
    fps = pipe.config.generation.fps
    store = SessionManager(pipe, history_mb=0.001)  # about one state
    sid = store.open(GenerationRequest(prompt=PROMPT, seconds=3.0, seed=2))
    _read(store, sid, frames=2 * fps)
    held = store.history(sid)
    assert len(held["boundaries"]) == 2  # the start and the newest state: the rest went
    at = store.rewind(sid, 10.0)  # further back than held: the oldest point held is the start
    assert at == 0.0
    start, frames = _read(store, sid)
    np.testing.assert_array_equal(frames, _whole(pipe, prompt=PROMPT, seconds=3.0, seed=2))
    folder = store._scratch / sid
    store.stop(sid)
    assert not folder.exists()

    none = SessionManager(pipe, history_mb=0)
    sid = none.open(GenerationRequest(prompt=PROMPT, seconds=1.0, seed=2))
    _read(none, sid)
    assert none._scratch is None and none.history(sid)["boundaries"] == [0.0]


def test_a_rewound_persisted_session_survives_eviction_on_its_branch(pipe, tmp_path):
    fps = pipe.config.generation.fps
    store = SessionManager(pipe, persist_dir=tmp_path)
    sid = store.open(GenerationRequest(prompt=PROMPT, seconds=3.0, seed=4))
    _read(store, sid, frames=2 * fps)
    at = store.rewind(sid, 0.6, prompt=OTHER)
    _, part = _read(store, sid, frames=round(at * fps) + 1)
    assert store.evict(sid)
    _, rest = _read(SessionManager(pipe, persist_dir=tmp_path), sid)
    expected = _whole(pipe, storyboard=[(0.0, PROMPT), (at, OTHER)], seconds=3.0, seed=4)
    np.testing.assert_array_equal(np.concatenate([part, rest]), expected[round(at * fps) :])


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), "2", True])
def test_rewind_and_fork_refuse_what_is_not_a_time(pipe, value):
    store = SessionManager(pipe)
    sid = store.open(GenerationRequest(prompt=PROMPT, seconds=1.0, seed=1))
    with pytest.raises(InputError, match="seconds"):
        store.rewind(sid, value)
    with pytest.raises(InputError, match="at_seconds"):
        store.fork(sid, value)
    store.stop(sid)
