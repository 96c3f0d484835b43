"""Generation sessions on a sequence-parallel group: rank 0 holds the sessions, the others follow.

A :class:`~vidgen.pipelines.session.SessionManager` steps one stream per session, whenever its
clients ask. Under sequence parallelism every rank of the group must step the *same* stream at the
*same* time (each step is a run of collectives), so the ranks other than 0 cannot decide anything:

* Rank 0's manager is given a :class:`SessionLeader` as its ``streamer``. Each stream it makes is
  :func:`~vidgen.distributed.parallel_stream.sequence_parallel_stream` on rank 0, and every step of
  it (the first ``next`` opens it, then ``next``, ``close``) first sends the command to the
  followers, so that they take the same step.
* Every other rank runs a :class:`SessionFollower`: it keeps its own stream per session key and
  takes each step it is told to, discarding the chunks (rank 0's are the ones handed out).

How commands travel is the leader's ``send``: by default a broadcast over the group (the followers
run :meth:`SessionFollower.follow`, a loop that waits in that broadcast); a Ray Serve replica sends
them as actor calls instead (:mod:`vidgen.serving.deployment`), so no rank waits in a collective
while the replica is idle -- a torch.distributed wait gives up after the group's timeout.

Persisted sessions: each rank saves its own state file next to rank 0's
(:func:`rank_state_path`). A restore resumes only if every rank's file holds the state after the
same chunk; otherwise (a replica that died between two ranks' saves, or one saved without
sequence parallelism) every rank starts the session again from its first chunk, which makes the
same frames (the manager hands out only those not delivered yet), just more slowly.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vidgen.distributed.parallel_stream import sequence_parallel_stream
from vidgen.distributed.ray_worker import saved_chunk_index
from vidgen.distributed.sequence_parallel import SequenceParallelGroup, validate_degrees
from vidgen.validation import InputError

if TYPE_CHECKING:
    from vidgen.pipelines import LongVideoPipeline, VideoChunk

Command = tuple[Any, ...]
"""``("open", key, kwargs)``, ``("next", key)``, ``("close", key)`` or ``("shutdown",)``."""

Send = Callable[[Command], Callable[[], None]]
"""Delivers a command to the followers; returns what waits for them to have carried it out (and
raises :class:`GroupLost` if one of them is gone)."""


class GroupLost(RuntimeError):
    """A rank of the group is gone (its process died): the group cannot make chunks any more."""


def rank_state_path(state_path: str | Path, rank: int) -> Path:
    """Rank ``rank``'s state file for a session whose rank-0 file is ``state_path``
    (``state.safetensors`` -> ``state.rank1.safetensors``)."""
    path = Path(state_path)
    return path if rank == 0 else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def _session_stream(
    pipe: LongVideoPipeline, group: SequenceParallelGroup, kwargs: dict[str, Any]
) -> Iterator[VideoChunk]:
    """This rank's part of one session's stream (every rank calls it with rank 0's arguments)."""
    kwargs = dict(kwargs)
    if kwargs.get("state_path") is not None:
        state = rank_state_path(kwargs["state_path"], group.rank)
        kwargs["state_path"] = state
        if kwargs.get("resume"):
            index = saved_chunk_index(state) if state.is_file() else None
            if len(set(group.all_gather_object(index))) != 1 or index is None:
                # the ranks' states do not hold the same chunk: start again, every rank
                kwargs["resume"] = False
                state.unlink(missing_ok=True)
    yield from sequence_parallel_stream(pipe, group, **kwargs)


def check_frame_tokens(pipe: LongVideoPipeline, group: SequenceParallelGroup, kwargs: dict[str, Any]) -> None:
    """:class:`InputError` unless the video's latent frames split evenly over the group."""
    overrides = kwargs.get("overrides") or {}
    g = (pipe.config.replace(**overrides) if overrides else pipe.config).generation
    latent_h, latent_w = pipe.latent_size(kwargs.get("height") or g.height, kwargs.get("width") or g.width)
    tokens = pipe.transformer.frame_tokens(latent_h, latent_w)
    try:
        validate_degrees(pipe.transformer.config, group.size, 1, group.size, tokens, group.kind)
    except ValueError as err:
        raise InputError(str(err)) from None


class SessionLeader:
    """Rank 0's ``streamer`` for a ``SessionManager``: ``leader(**stream_kwargs)`` is a session's
    stream, run by the whole group.

    ``send``: how commands reach the followers (None: a broadcast over ``group``). Every step is
    taken under one lock, so that two threads of a server never interleave their collectives.
    """

    def __init__(
        self, pipe: LongVideoPipeline, group: SequenceParallelGroup, send: Send | None = None
    ) -> None:
        if group.rank != 0:
            raise ValueError(f"the leader of a group is its rank 0, not rank {group.rank}")
        self.pipe = pipe
        self.group = group
        self.send: Send = send or self._broadcast
        self.lock = threading.RLock()
        self._keys = itertools.count()
        self.lost: GroupLost | None = None
        """Set once ``send`` reports a follower gone; every later step raises it at once."""

    def _broadcast(self, command: Command) -> Callable[[], None]:
        self.group.broadcast_object(command)
        return lambda: None

    def __call__(self, **stream_kwargs: Any) -> Iterator[VideoChunk]:
        check_frame_tokens(self.pipe, self.group, stream_kwargs)  # said at open, not at the first chunk
        return _LeaderStream(self, next(self._keys), stream_kwargs)

    def step(self, command: Command, own: Callable[[], Any]) -> Any:
        """Send ``command`` to the followers, then run ``own`` (rank 0's part of it)."""
        with self.lock:
            if self.lost is not None:
                raise self.lost
            done = self.send(command)
            try:
                result = own()
            except BaseException as error:  # StopIteration too: the followers' streams end with rank 0's
                try:
                    done()
                except GroupLost as lost:  # the cause of rank 0's error (a collective without its peer)
                    self.lost = lost
                    raise lost from error
                except Exception:  # the same error, met there: rank 0's is raised
                    pass
                raise
            try:
                done()
            except GroupLost as lost:
                self.lost = lost
                raise
            return result

    def shutdown(self) -> None:
        """End the followers' loops (their streams are closed)."""
        self.step(("shutdown",), lambda: None)


class _LeaderStream(Iterator["VideoChunk"]):
    """One session's stream on rank 0; opened by its first ``next`` (nothing runs before)."""

    def __init__(self, leader: SessionLeader, key: int, kwargs: dict[str, Any]) -> None:
        self._leader = leader
        self._key = key
        self._kwargs = kwargs
        self._stream: Iterator[VideoChunk] | None = None

    def __next__(self) -> VideoChunk:
        if self._stream is None:
            shared = {k: v for k, v in self._kwargs.items() if k != "control"}  # read on rank 0 only
            self._stream = _session_stream(self._leader.pipe, self._leader.group, self._kwargs)
            return self._leader.step(("open", self._key, shared), lambda: next(self._stream))
        stream = self._stream
        return self._leader.step(("next", self._key), lambda: next(stream))

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            # sent even after the end: a follower drops a stream it no longer has
            self._leader.step(("close", self._key), getattr(stream, "close", lambda: None))


class SessionFollower:
    """A rank other than 0: the streams of rank 0's sessions, stepped as rank 0 says."""

    def __init__(self, pipe: LongVideoPipeline, group: SequenceParallelGroup) -> None:
        if group.rank == 0:
            raise ValueError("rank 0 of a group leads it (SessionLeader); followers are ranks 1 and up")
        self.pipe = pipe
        self.group = group
        self.streams: dict[int, Iterator[VideoChunk]] = {}
        self.steps = 0
        """Chunks made so far (every session's)."""

    def handle(self, command: Command) -> bool:
        """Carry out one command; False after ``shutdown``. An error in a stream drops that stream
        and is raised (rank 0's stream meets the same one)."""
        op, *args = command
        if op == "shutdown":
            for key in list(self.streams):
                self._close(key)
            return False
        if op == "close":
            self._close(args[0])
            return True
        if op == "open":
            key, kwargs = args
            self.streams[key] = _session_stream(self.pipe, self.group, kwargs)
        elif op != "next":
            raise ValueError(f"unknown session command {op!r}")
        key = args[0]
        try:
            next(self.streams[key])
            self.steps += 1
        except StopIteration:
            self.streams.pop(key, None)
        except BaseException:
            self.streams.pop(key, None)
            raise
        return True

    def _close(self, key: int) -> None:
        stream = self.streams.pop(key, None)
        close = getattr(stream, "close", None)
        if close is not None:
            close()

    def follow(self) -> None:
        """Take commands broadcast by rank 0 (a leader with the default ``send``) until ``shutdown``."""
        while True:
            command = self.group.broadcast_object(None)
            try:
                if not self.handle(command):
                    return
            except Exception as err:  # rank 0's stream meets the same error and reports it
                print(f"vidgen: rank {self.group.rank}: session stream failed: {err}", file=sys.stderr)


__all__ = ["GroupLost", "SessionFollower", "SessionLeader", "check_frame_tokens", "rank_state_path"]
