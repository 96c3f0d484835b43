"""Ray Serve sessions (``RaySessions`` over 2 replicas): every request of a session reaches the
replica holding its KV cache; an idle session is evicted and, persisted, resumes with the frames of
an uninterrupted video; nothing listens off loopback."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.distributed.ray_network import listeners_off_loopback
from tests.tiny import FP32, assert_frames_match, tiny_components
from vidgen.pipelines import InputError
from vidgen.pipelines.session import GenerationRequest, RequestLimits, SessionNotFound
from vidgen.serving.affinity import fallback_replica, owner_of

RED = "a red circle moving left on a black background"
BLUE = "a blue square moving up on a white background"
IDLE_S = 3.0


@pytest.fixture(scope="module")
def sessions(ray_cluster, tiny_model_dir, tmp_path_factory):
    from ray import serve

    from vidgen.serving import RaySessions

    backend = RaySessions.from_pretrained(
        str(tiny_model_dir),
        replicas=2,
        persist_dir=tmp_path_factory.mktemp("sessions"),
        idle_timeout_s=IDLE_S,
        check_every_s=0.25,
        cpus_per_replica=0.5,
        limits=RequestLimits(),  # as vidgen serve --backend ray: twice the tiny model's 64x64, 4 steps
    )
    yield backend
    backend.shutdown()
    serve.shutdown()


@pytest.fixture(scope="module")
def pipe():
    return tiny_components(**FP32)  # as the workers' pipeline folder


def _read(sessions, session_id) -> np.ndarray:
    return np.concatenate([c.frames for c in sessions.chunks(session_id)])


def _uninterrupted(pipe, seconds, seed, storyboard=None) -> np.ndarray:
    board = storyboard or [(0.0, RED)]
    return np.concatenate([c.frames for c in pipe.stream(storyboard=board, seconds=seconds, generator=seed)])


def test_requests_of_a_session_reach_the_replica_holding_it(sessions, pipe):
    assert sessions.info.fps == 16
    opened = []
    while len({owner_of(s) for s in opened}) < 2 and len(opened) < 12:  # until both replicas hold one
        opened.append(sessions.open(GenerationRequest(prompt=RED, seconds=1.0, seed=len(opened))))
    assert len({owner_of(s) for s in opened}) == 2
    assert listeners_off_loopback() == []
    for seed, sid in enumerate(opened):
        first = _read(sessions, sid)
        where = sessions.replica_of(sid)
        assert where == {"replica": owner_of(sid), "live": True}
        sessions.change_prompt(sid, BLUE)  # continuing the session: a new prompt, more seconds
        sessions.extend(sid, 0.5)
        assert sessions.replica_of(sid) == where
        second = _read(sessions, sid)
        expected = _uninterrupted(pipe, 1.5, seed, [(0.0, RED), (21 / 16, BLUE)])
        assert_frames_match(np.concatenate([first, second]), expected)
    for sid in opened:
        sessions.stop(sid)
    with pytest.raises(SessionNotFound):  # at the call, as SessionManager.chunks does
        sessions.chunks(opened[0])
    with pytest.raises(SessionNotFound):
        sessions.change_prompt(opened[0], BLUE)


def test_idle_session_is_evicted_then_resumes_from_its_persisted_cache(sessions, pipe):
    sid = sessions.open(GenerationRequest(prompt=RED, seconds=1.0, seed=11))
    first = _read(sessions, sid)
    deadline = time.monotonic() + IDLE_S + 20
    while sessions.replica_of(sid)["live"]:  # asking does not count as activity
        assert time.monotonic() < deadline, "the idle session was not evicted"
        time.sleep(0.25)
    sessions.extend(sid, 1.0)  # restored from disk on its replica
    assert sessions.replica_of(sid) == {"replica": owner_of(sid), "live": True}
    rest = _read(sessions, sid)
    assert_frames_match(np.concatenate([first, rest]), _uninterrupted(pipe, 2.0, 11))
    sessions.stop(sid)


def test_a_session_is_rewound_and_forked_on_its_replica(sessions, pipe):
    """Through the handle as through SessionManager: back one second with the same prompt, the
    same frames again; a fork with another prompt lives on the same replica and makes the video
    whose storyboard changes there."""
    sid = sessions.open(GenerationRequest(prompt=RED, seconds=2.0, seed=21))
    whole = _read(sessions, sid)
    at = sessions.rewind(sid, 1.0)
    assert 0 < at <= 1.0 and sessions.history(sid)["position"] == at
    rest = _read(sessions, sid)
    start = round(at * 16)
    np.testing.assert_array_equal(rest, whole[start:])
    branch = sessions.fork(sid, 0.5, prompt=BLUE)
    assert owner_of(branch) == owner_of(sid)
    forked = _read(sessions, branch)
    fork_at = sessions.history(branch)["prompts"][-1][0]
    expected = _uninterrupted(pipe, 2.0, 21, [(0.0, RED), (fork_at, BLUE)])
    assert_frames_match(forked, expected[len(expected) - len(forked) :])
    for session in (sid, branch):
        sessions.stop(session)


def test_a_session_started_from_an_image_opens_with_it(sessions, pipe, tmp_path):
    from PIL import Image

    image = (np.random.default_rng(5).random((64, 64, 3)) * 255).astype(np.uint8)
    Image.fromarray(image).save(tmp_path / "start.png")
    sid = sessions.open(
        GenerationRequest(prompt=RED, seconds=1.0, seed=12, image=str(tmp_path / "start.png"))
    )
    made = _read(sessions, sid)
    expected = pipe.stream(RED, seconds=1.0, generator=12, image=image, include_input=True)
    assert len(made) == 1 + 16  # the image, then the second asked for
    assert_frames_match(made, np.concatenate([c.frames for c in expected]))
    sessions.stop(sid)


def test_each_replica_refuses_a_request_beyond_the_servers_limits(sessions):
    assert (sessions.info.max_side, sessions.info.max_steps) == (128, 16)
    with pytest.raises(InputError, match="height must be at most 128 on this server"):
        sessions.open(GenerationRequest(prompt=RED, seconds=1.0, height=2048, width=2048))
    with pytest.raises(InputError, match="steps must be at most 16 on this server"):
        sessions.open(GenerationRequest(prompt=RED, seconds=1.0, num_inference_steps=17))


def test_fallback_replica_is_stable():
    replicas = ["a1", "b2", "c3"]
    chosen = fallback_replica("x.1", replicas)
    assert chosen in replicas
    assert fallback_replica("x.1", list(reversed(replicas))) == chosen
    others = [r for r in replicas if r != chosen]
    survivor = fallback_replica("x.1", others + [chosen])
    assert survivor == chosen  # unchanged while it lives, whatever the order
    assert owner_of("abc.123") == "abc" and owner_of("nodot") == ""
