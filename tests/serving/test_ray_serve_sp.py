"""A Ray Serve replica with sequence parallelism (``RaySessions.from_pretrained(sp=2)``: the replica
is rank 0, one follower actor rank 1, ring attention for the 3-head model): a session hands out the
frames of one process's video through a prompt change and more seconds, is evicted and restored
from both ranks' states, and nothing listens off loopback (gloo included). Slow: a replica whose
follower died is replaced, and the session goes on there."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from tests.distributed.ray_network import listeners_off_loopback
from tests.tiny import FP32, assert_frames_match, save_tiny_pipeline, tiny_components
from vidgen.pipelines.session import GenerationRequest

RED = "a red circle moving left on a black background"
BLUE = "a blue square moving up on a white background"
IDLE_S = 3.0


@pytest.fixture(scope="module")
def sessions(ray_cluster, tmp_path_factory):
    from ray import serve

    from vidgen.serving import RaySessions

    model = save_tiny_pipeline(tmp_path_factory.mktemp("sp-serve") / "pipe", heads=3, **FP32)
    backend = RaySessions.from_pretrained(
        str(model),
        replicas=1,
        sp=2,
        persist_dir=tmp_path_factory.mktemp("sp-sessions"),
        idle_timeout_s=IDLE_S,
        check_every_s=0.25,
        cpus_per_replica=0.5,
    )
    yield backend
    backend.shutdown()
    serve.shutdown()
    assert not Path(backend._scratch).exists()  # the replicas' rendezvous folders went with them


def _read(sessions, session_id) -> np.ndarray:
    return np.concatenate([c.frames for c in sessions.chunks(session_id)])


def _stats(sessions) -> dict:
    return sessions.handle.stats.remote().result()


def test_a_session_on_two_ranks_hands_out_one_process_frames(sessions):
    """Tolerance: ``assert_frames_match`` (a uint8 value one step off in 1e-3 of them), as ring
    attention's float32 log-sum-exp merge is ~1e-7 from one process's SDPA."""
    pipe = tiny_components(heads=3, **FP32)  # as the replica's pipeline folder
    sid = sessions.open(GenerationRequest(prompt=RED, seconds=1.0, seed=5))
    first = _read(sessions, sid)
    sessions.change_prompt(sid, BLUE)
    sessions.extend(sid, 0.5)
    second = _read(sessions, sid)
    stats = _stats(sessions)
    assert stats["sp_kind"] == "ring"  # auto: 3 heads do not split over 2 ranks
    [follower] = stats["followers"]
    assert follower["steps"] >= 3 and follower["open"] == 1  # rank 1 made the chunks too
    # in the bundles Serve reserved for the replica (one node), not wherever Ray found room
    assert follower["placement_group"] == stats["placement_group"] is not None
    assert len(list(Path(sessions._scratch).glob("vidgen-sp-*"))) == 1  # the replica's rendezvous
    assert listeners_off_loopback() == []

    deadline = time.monotonic() + IDLE_S + 30
    while sessions.replica_of(sid)["live"]:  # evicted: both ranks save their state
        assert time.monotonic() < deadline, "the idle session was not evicted"
        time.sleep(0.25)
    sessions.extend(sid, 0.5)  # restored on both ranks from their states
    third = _read(sessions, sid)
    sessions.stop(sid)
    # one without end, stopped while it is being read: its reader ends it on both ranks
    endless = sessions.open(GenerationRequest(prompt=RED, seed=7))
    reading = sessions.chunks(endless)
    next(reading)
    sessions.stop(endless)
    assert len(list(reading)) < 10  # ends within a chunk or two
    stats = _stats(sessions)
    assert stats["evicted"] == 1 and stats["restored"] == 1
    assert stats["sessions"] == [] and stats["followers"][0]["open"] == 0  # rank 1's streams closed too

    board = [(0.0, RED), (21 / 16, BLUE)]  # the change applies from the end of the chunk made then
    expected = np.concatenate([c.frames for c in pipe.stream(storyboard=board, seconds=2.0, generator=5)])
    assert_frames_match(np.concatenate([first, second, third]), expected)


@pytest.mark.slow
def test_a_replica_whose_follower_died_is_replaced_and_the_session_goes_on(sessions):
    """Killing rank 1 breaks the replica's group: it fails Serve's health check, Serve starts a new
    replica (with a new follower), and the persisted session continues there with the frames of an
    uninterrupted video."""
    pipe = tiny_components(heads=3, **FP32)
    sid = sessions.open(GenerationRequest(prompt=RED, seconds=1.0, seed=6))
    first = _read(sessions, sid)
    owner = sessions.replica_of(sid)["replica"]
    [follower] = _stats(sessions)["followers"]
    os.kill(follower["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 240
    while sessions.replica_of(sid)["replica"] == owner:
        assert time.monotonic() < deadline, "the replica with a dead follower was not replaced"
        time.sleep(1.0)
    sessions.extend(sid, 0.5)  # restored by the new replica, on both of its ranks
    rest = _read(sessions, sid)
    stats = _stats(sessions)
    assert stats["restored"] == 1 and stats["followers"][0]["pid"] != follower["pid"]
    sessions.stop(sid)
    expected = np.concatenate([c.frames for c in pipe.stream(RED, seconds=1.5, generator=6)])
    assert_frames_match(np.concatenate([first, rest]), expected)
