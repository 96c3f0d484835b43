"""Sessions on a sequence-parallel group (``SessionLeader`` on rank 0, ``SessionFollower`` on rank
1, 2 CPU processes, ring attention for the 3-head model) hand out the frames of the same calls on a
plain single-process ``SessionManager``: a prompt change mid-session, more seconds, eviction and
restore from the ranks' persisted states, and a restore whose ranks' states disagree. Then the
leader's steps alone: a lost follower breaks the group for good; an error in a stream does not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.distributed.launch import run_ranks
from tests.tiny import FP32, assert_frames_match, save_tiny_pipeline
from vidgen.pipelines import LongVideoPipeline
from vidgen.pipelines.session import GenerationRequest, SessionManager

RED = "a red circle moving left on a black background"
BLUE = "a blue square moving up on a white background"


def _read(sessions: SessionManager, session_id: str) -> np.ndarray:
    return np.concatenate([c.frames for c in sessions.chunks(session_id)])


def _script(sessions: SessionManager, on_evicted=None) -> dict[str, np.ndarray]:
    """The same calls on any manager: what it hands out, per session."""
    made = {}
    # a prompt change while the session runs, then more seconds, evicted (saved) and restored
    a = sessions.open(GenerationRequest(prompt=RED, seconds=1.0, seed=3))
    first = _read(sessions, a)
    sessions.change_prompt(a, BLUE)
    sessions.extend(a, 0.5)
    second = _read(sessions, a)
    assert sessions.evict(a)
    if on_evicted is not None:
        on_evicted(a, "kept")
    sessions.extend(a, 0.75)
    made["a"] = np.concatenate([first, second, _read(sessions, a)])
    sessions.stop(a)
    # evicted, and a restore that finds the ranks' states disagreeing
    b = sessions.open(GenerationRequest(prompt=BLUE, seconds=0.75, seed=4))
    first = _read(sessions, b)
    assert sessions.evict(b)
    if on_evicted is not None:
        on_evicted(b, "lost")
    sessions.extend(b, 0.5)
    made["b"] = np.concatenate([first, _read(sessions, b)])
    sessions.stop(b)
    return made


def _rank(rank: int, world: int, init_method: str, folder: Path) -> None:
    from vidgen.distributed.sequence_parallel import init_process_group, resolve_kind
    from vidgen.distributed.session_group import SessionFollower, SessionLeader, rank_state_path

    pipe = LongVideoPipeline.from_pretrained(folder / "pipe")
    kind = resolve_kind(pipe.config.runtime.sp_kind, pipe.transformer.config.num_attention_heads, world)
    group = init_process_group(rank, world, init_method, kind=kind)
    if rank != 0:
        follower = SessionFollower(pipe, group)
        follower.follow()
        torch.save({"steps": follower.steps, "open": len(follower.streams)}, folder / "rank1.pt")
        return

    persist = folder / "sp-sessions"
    saved = {}

    def on_evicted(session_id: str, what: str) -> None:
        state = persist / session_id / "state.safetensors"
        saved[what] = [rank_state_path(state, r).is_file() for r in range(world)]
        if what == "lost":  # as if the replica died before rank 1 saved
            rank_state_path(state, 1).unlink()

    leader = SessionLeader(pipe, group)
    sessions = SessionManager(pipe, persist_dir=persist, streamer=leader)
    made = _script(sessions, on_evicted)
    leader.shutdown()
    torch.save(
        {"kind": group.kind, "made": made, "saved": saved, "restored": sessions.restored}, folder / "rank0.pt"
    )


@pytest.fixture(scope="module")
def three_heads(tmp_path_factory) -> Path:
    return save_tiny_pipeline(tmp_path_factory.mktemp("sp-sessions") / "pipe", heads=3, **FP32)


def test_sessions_on_two_ranks_hand_out_the_single_process_frames(three_heads, tmp_path):
    """Ring attention merges per-rank partial softmaxes in its own float32 arithmetic (~1e-7
    relative from one process's SDPA), so a uint8 value on a rounding boundary may land one step
    off: ``assert_frames_match`` allows that in 1e-3 of the values (none seen on the development
    machine). A follower that skipped a step, a state restored on one rank only or a prompt change
    not reaching rank 1 would change most values, or hang the group."""
    (tmp_path / "pipe").symlink_to(three_heads)
    run_ranks(_rank, 2, tmp_path)
    got = torch.load(tmp_path / "rank0.pt", weights_only=False)
    follower = torch.load(tmp_path / "rank1.pt", weights_only=False)

    pipe = LongVideoPipeline.from_pretrained(three_heads)
    expected = _script(SessionManager(pipe, persist_dir=tmp_path / "plain"))

    assert got["kind"] == "ring"  # auto: 3 heads do not split over 2 ranks
    assert got["saved"] == {"kept": [True, True], "lost": [True, True]}  # every rank saved its state
    assert got["restored"] == 2
    assert follower["open"] == 0  # every stream closed, on rank 1 too
    assert follower["steps"] > 0
    assert [len(got["made"][k]) for k in "ab"] == [16 + 8 + 12, 12 + 8]
    for key in "ab":
        assert_frames_match(got["made"][key], expected[key])


def _leader(follower_error: Exception | None):
    """A leader of a 2-rank group whose follower answers every command with ``follower_error``."""
    from vidgen.distributed.sequence_parallel import SequenceParallelGroup
    from vidgen.distributed.session_group import SessionLeader

    sent = []

    def send(command):
        sent.append(command)

        def done() -> None:
            if follower_error is not None:
                raise follower_error

        return done

    group = SequenceParallelGroup(group=None, rank=0, size=2, kind="ring")
    return SessionLeader(None, group, send), sent  # type: ignore[arg-type]  # no pipeline: steps only


def test_a_lost_follower_fails_this_step_and_every_later_one_at_once():
    from vidgen.distributed.session_group import GroupLost

    leader, sent = _leader(GroupLost("rank 1 died"))

    def collective_without_its_peer():
        raise RuntimeError("gloo: connection closed by peer")

    with pytest.raises(GroupLost, match="rank 1 died") as lost:  # the cause, not gloo's symptom
        leader.step(("next", 0), collective_without_its_peer)
    assert isinstance(lost.value.__cause__, RuntimeError)
    ran = []
    with pytest.raises(GroupLost):
        leader.step(("next", 0), lambda: ran.append(1))
    assert ran == [] and len(sent) == 1  # neither sent nor run: the group is broken


def test_rank_zero_error_wins_over_the_one_a_follower_met():
    leader, _ = _leader(ValueError("follower: bad size"))
    with pytest.raises(KeyError):  # rank 0's own error, not the follower's
        leader.step(("open", 0, {}), lambda: {}["missing"])
    with pytest.raises(ValueError, match="follower"):  # a follower's error alone is raised too
        leader.step(("next", 0), lambda: 5)
    assert leader.lost is None  # an error in a stream does not break the group
