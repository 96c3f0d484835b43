"""The sessions one serving replica holds: live KV caches, idle eviction, persistence and restore.

No Ray here: :class:`SessionStore` is what a Ray Serve replica (``vidgen.serving.deployment``) wraps,
and it runs the same in a plain process. A session is one video for one client. Its stream runs
without end on the replica's pipeline; the session hands out frames up to its current length
(``seconds``) and keeps the rest of a cut chunk, so a session that is extended by more seconds
continues exactly where it stopped, with the frames an uninterrupted video would have.

Persistence (``persist_dir``): each session keeps ``<persist_dir>/<session id>/session.json`` (the
request, seed, storyboard with the prompt changes made so far, frames delivered) and the pipeline's
state file. An idle session is evicted after ``idle_timeout_s``: its stream is ended so that the
pipeline saves the state after the last chunk delivered, and its memory is freed. A later request
for it restores the stream from that state (on this replica or, if this one is gone, another) and
goes on seamlessly. The pipeline saves its state after every chunk, so a session also survives the
crash of its replica (it then makes its last chunk again, and hands out only the frames not yet
delivered).
"""

from __future__ import annotations

import contextvars
import json
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vidgen.pipelines import StreamControl, VideoChunk
from vidgen.pipelines.session import GenerationRequest, SessionNotFound


@dataclass
class SessionRecord:
    """What is needed to make a session's video again from a saved state (``session.json``)."""

    request: dict[str, Any]
    seed: int
    storyboard: list[tuple[float, str]]
    """The request's storyboard (or prompt at 0 s) plus every prompt change made while it ran."""
    limit_frames: int | None
    """Frames the session may hand out (None: no end); ``extend`` raises it."""
    delivered: int = 0
    """Frames handed out so far."""
    pending_prompt: str | None = None
    """A prompt change asked for that applies from the next chunk made."""
    opening_frames: int = 0
    """Given frames the video opens with (``image`` / ``video``); prompt times count after them."""

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        temp = folder / "session.json.tmp"
        temp.write_text(json.dumps(asdict(self)))
        temp.replace(folder / "session.json")

    @classmethod
    def load(cls, folder: Path) -> SessionRecord:
        data = json.loads((folder / "session.json").read_text())
        data["storyboard"] = [(float(t), str(p)) for t, p in data["storyboard"]]
        return cls(**data)


@dataclass
class _Live:
    record: SessionRecord
    stream: Iterator[VideoChunk]
    control: StreamControl
    context: contextvars.Context
    """Every step of the stream runs in this context (the pipeline sets context variables around
    its loop; sessions interleave on one thread)."""
    fps: int
    frame_end: int = 0
    """End of the last chunk the stream made (a prompt change applies from there)."""
    carry: VideoChunk | None = None
    """The part of a chunk beyond the session's length, handed out if it is extended."""
    stopped: bool = False
    pulling: bool = False
    last_active: float = field(default_factory=time.monotonic)


class SessionStore:
    """Sessions on one pipeline. Call :meth:`next_chunk` and :meth:`evict` from one thread (the
    replica's compute thread); the other methods only set flags and may come from any thread."""

    def __init__(
        self,
        pipe,
        *,
        persist_dir: str | Path | None = None,
        idle_timeout_s: float = 600.0,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self.pipe = pipe
        self.persist_dir = Path(persist_dir) if persist_dir else None
        self.idle_timeout_s = idle_timeout_s
        self.new_id = new_id or (lambda: uuid.uuid4().hex)
        self.sessions: dict[str, _Live] = {}
        self.lock = threading.Lock()
        self.evicted = 0
        self.restored = 0

    # ------------------------------------------------------------------ opening
    def open(self, request: GenerationRequest) -> str:
        """Start a session (its first chunk is made when it is first read)."""
        config = self.pipe.config.replace(**request.overrides) if request.overrides else self.pipe.config
        fps = config.generation.fps
        seed = (
            request.seed if request.seed is not None else int.from_bytes(uuid.uuid4().bytes[:4], "big") >> 1
        )
        board = (
            [(float(t), str(p)) for t, p in request.storyboard]
            if request.storyboard is not None
            else [(0.0, request.prompt)]
        )
        opening = _opening_frames(request)
        limit = opening + round(request.seconds * fps) if request.seconds is not None else None
        record = SessionRecord(asdict(request), seed, board, limit, opening_frames=opening)
        # fail now on a bad request (InputError), not at the first chunk
        self.pipe.check_inputs(
            storyboard=board, num_frames=limit or fps, height=request.height, width=request.width
        )
        session_id = self.new_id()
        live = self._start(session_id, record, resume=False)
        with self.lock:
            self.sessions[session_id] = live
        if self.persist_dir is not None:
            record.save(self.persist_dir / session_id)
        return session_id

    def _start(self, session_id: str, record: SessionRecord, resume: bool) -> _Live:
        request = GenerationRequest(**record.request)
        control = StreamControl()
        state = self.persist_dir / session_id / "state.safetensors" if self.persist_dir else None
        stream = self.pipe.stream(
            storyboard=record.storyboard,
            height=request.height,
            width=request.width,
            num_inference_steps=request.num_inference_steps,
            guidance_scale=request.guidance_scale,
            generator=record.seed,
            control=control,
            state_path=state,
            resume=resume,
            overrides=request.overrides or None,
            **request.stream_input(),
        )
        config = self.pipe.config.replace(**request.overrides) if request.overrides else self.pipe.config
        return _Live(record, stream, control, contextvars.copy_context(), config.generation.fps)

    def _restore(self, session_id: str) -> _Live | None:
        folder = self.persist_dir / session_id if self.persist_dir else None
        if folder is None or not (folder / "session.json").is_file():
            return None
        record = SessionRecord.load(folder)
        live = self._start(session_id, record, resume=(folder / "state.safetensors").is_file())
        self.restored += 1
        return live

    def get(self, session_id: str) -> _Live:
        """The live session, restored from disk if it was evicted; :class:`SessionNotFound` if gone."""
        with self.lock:
            live = self.sessions.get(session_id)
            if live is None:
                live = self._restore(session_id)
                if live is None:
                    raise SessionNotFound(session_id)
                self.sessions[session_id] = live
            live.last_active = time.monotonic()
            return live

    # ------------------------------------------------------------------ reading
    def begin_read(self, session_id: str) -> _Live:
        live = self.get(session_id)
        with self.lock:
            if live.pulling:
                raise RuntimeError(f"session {session_id} is already being read")
            live.pulling = True
        return live

    def end_read(self, session_id: str) -> None:
        with self.lock:
            live = self.sessions.get(session_id)
            if live is None:
                return
            live.pulling = False
            live.last_active = time.monotonic()
            stopped = live.stopped
        if stopped:
            self._close(session_id, forget=True)

    def next_chunk(self, session_id: str) -> VideoChunk | None:
        """The session's next frames, or None when it is stopped or has reached its length."""
        live = self.get(session_id)
        record = live.record
        while True:
            if live.stopped or (record.limit_frames is not None and record.delivered >= record.limit_frames):
                return None
            if live.carry is not None:
                chunk, live.carry = live.carry, None
            else:
                if record.pending_prompt is not None:
                    prompt, record.pending_prompt = record.pending_prompt, None
                    live.control.change_prompt(prompt)
                    _add_change(
                        record.storyboard, (live.frame_end - record.opening_frames) / live.fps, prompt
                    )
                try:
                    chunk = live.context.run(next, live.stream)
                except StopIteration:
                    return None
                live.frame_end = chunk.frame_start + len(chunk.frames)
            chunk = _after(chunk, record.delivered, live.fps)  # a restored stream makes some frames again
            if chunk is not None:
                break
        if record.limit_frames is not None and chunk.frame_start + len(chunk.frames) > record.limit_frames:
            keep = record.limit_frames - chunk.frame_start
            live.carry = _slice(chunk, live.fps, keep)
            chunk = _slice(chunk, live.fps, 0, keep)
        record.delivered = chunk.frame_start + len(chunk.frames)
        live.last_active = time.monotonic()
        if self.persist_dir is not None:
            record.save(self.persist_dir / session_id)
        return chunk

    # ------------------------------------------------------------------ steering
    def change_prompt(self, session_id: str, prompt: str) -> None:
        """From the next chunk made on (frames already made but not handed out keep their prompt)."""
        if prompt and prompt.strip():
            live = self.get(session_id)
            live.record.pending_prompt = prompt.strip()
            if self.persist_dir is not None:
                live.record.save(self.persist_dir / session_id)

    def extend(self, session_id: str, seconds: float) -> None:
        """Make the session ``seconds`` longer (a session without end stays so)."""
        live = self.get(session_id)
        if live.record.limit_frames is not None:
            live.record.limit_frames += round(seconds * live.fps)
            if self.persist_dir is not None:
                live.record.save(self.persist_dir / session_id)

    def stop(self, session_id: str) -> None:
        """End the session for good (its persisted state too). One being read ends before its
        next chunk and is closed by its reader."""
        with self.lock:
            live = self.sessions.get(session_id)
            if live is None:
                self._forget(session_id)
                return
            live.stopped = True
            reading = live.pulling
        if not reading:
            self._close(session_id, forget=True)

    # ------------------------------------------------------------------ eviction
    def idle(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        with self.lock:
            return [
                sid
                for sid, live in self.sessions.items()
                if not live.pulling and now - live.last_active >= self.idle_timeout_s
            ]

    def evict(self, session_id: str) -> bool:
        """Free an idle session's cache, saving its state first when sessions persist."""
        with self.lock:
            live = self.sessions.get(session_id)
            if live is None or live.pulling:
                return False
        self._close(session_id, forget=False)
        self.evicted += 1
        return True

    def _close(self, session_id: str, forget: bool) -> None:
        with self.lock:
            live = self.sessions.pop(session_id, None)
        if live is None:
            return
        if self.persist_dir is not None and not forget and live.carry is None:
            # Stopped, the stream saves the state after its last chunk as it ends. With part of
            # that chunk not handed out, the state before it is kept: a restore makes it again.
            live.control.stop()
            live.context.run(_drain, live.stream)
        live.context.run(live.stream.close)
        if forget:
            self._forget(session_id)

    def _forget(self, session_id: str) -> None:
        if self.persist_dir is not None:
            shutil.rmtree(self.persist_dir / session_id, ignore_errors=True)

    def close(self) -> None:
        """Drop every live session without saving anything more (what is on disk stays)."""
        with self.lock:
            lives, self.sessions = list(self.sessions.values()), {}
        for live in lives:
            live.context.run(live.stream.close)

    def describe(self) -> dict[str, Any]:
        with self.lock:
            return {
                "sessions": sorted(self.sessions),
                "reading": sorted(sid for sid, live in self.sessions.items() if live.pulling),
                "evicted": self.evicted,
                "restored": self.restored,
            }


def _opening_frames(request: GenerationRequest) -> int:
    """How many frames the session's start input holds (read now: an unreadable file fails the
    request at ``open``)."""
    from vidgen.pipelines import InputError
    from vidgen.video import read_image, read_video

    try:
        if request.image:
            read_image(request.image)
            return 1
        if request.video:
            return len(read_video(request.video)[0])
    except (FileNotFoundError, ValueError) as err:
        raise InputError(str(err).splitlines()[0]) from None
    return 0


def _drain(stream: Iterator[VideoChunk]) -> None:
    for _ in stream:
        pass


def _add_change(board: list[tuple[float, str]], seconds: float, prompt: str) -> None:
    """As the planner's ``add_change``; a change at the time of the last entry replaces it (the
    planner would use the later of the two)."""
    if board and abs(board[-1][0] - seconds) < 1e-9:
        board[-1] = (board[-1][0], prompt)
    else:
        board.append((seconds, prompt))


def _slice(chunk: VideoChunk, fps: int, start: int, stop: int | None = None) -> VideoChunk:
    """Frames ``start:stop`` of ``chunk`` as a chunk of their own (same index)."""
    return VideoChunk(
        index=chunk.index,
        frame_start=chunk.frame_start + start,
        start_time=chunk.start_time + start / fps,
        frames=chunk.frames[start:stop],
        prompt=chunk.prompt,
        metrics=chunk.metrics,
    )


def _after(chunk: VideoChunk, delivered: int, fps: int) -> VideoChunk | None:
    """The part of ``chunk`` from frame ``delivered`` on (None if it is all before)."""
    end = chunk.frame_start + len(chunk.frames)
    if end <= delivered:
        return None
    if chunk.frame_start >= delivered:
        return chunk
    return _slice(chunk, fps, delivered - chunk.frame_start)
