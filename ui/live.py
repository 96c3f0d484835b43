"""From a session's chunks to what the page plays: stream segments, live figures, the final MP4.

:func:`live_stream` reads a session of any :class:`~vidgen.pipelines.session.SessionBackend`
and yields a :class:`LiveUpdate` for each MPEG-TS segment completed. Segments have one fixed
length (one second by default), each opens on a keyframe and carries its place in the whole
stream's timeline, so the player appends them without stutter; the last may be shorter. Every
frame also goes into an MP4 that is offered for download at the end.

Generation is paced: it runs at most ``max_lead`` seconds of video ahead of what has been
streamed, counting from the first segment, so a prompt change shows within that lead rather than
after everything a fast model has made in advance. Plain Python (no Gradio).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vidgen.pipelines import VideoChunk
from vidgen.pipelines.session import SessionBackend
from vidgen.video import Mp4Writer, SegmentWriter, Upscale

logger = logging.getLogger("vidgen.ui")

DRIFT_MEASURES = {
    "stats_distance": "colour drift",
    "change_energy": "motion",
    "repetition": "repetition",
}
"""The per-chunk drift measures plotted (``vidgen.pipelines.drift.DriftMeasures``) and the plain
names the plot shows them under."""

DRIFT_LEGEND = (
    "**colour drift**: how far colours and brightness have wandered from the opening (bad: climbing "
    "past 1 and staying there). **motion**: how much changes from frame to frame (bad: near 0, the "
    "picture froze). **repetition**: likeness to an earlier chunk (bad: near 1, the video loops)."
)
"""The one-line legend under the plot: what each measure watches and what a bad value looks like."""

ACTION_NAMES = {
    "anchor_correction": "colours pulled back towards the opening's",
    "recache_prompt": "context re-read under the new prompt",
    "recache_periodic": "context refreshed",
    "reanchor": "new colour reference",
}
"""What the status line says for a chunk's drift actions (``ChunkMetrics.actions``)."""


@dataclass
class LiveStats:
    """Figures of one generation so far."""

    fps: float
    """Frame rate of the video."""
    chunks: int = 0
    frames: int = 0
    busy_seconds: float = 0.0
    """Wall time spent making chunks (waits for playback not counted)."""
    prompt: str = ""
    """Prompt of the latest chunk."""
    actions: list[str] = field(default_factory=list)
    """Drift actions of the latest chunk (re-cache, anchor correction, ...)."""
    frozen: bool = False
    drift: deque = field(default_factory=lambda: deque(maxlen=240))
    """``(chunk, measure, value)`` rows of the most recent chunks, for the plot."""

    @property
    def video_seconds(self) -> float:
        return self.frames / self.fps

    @property
    def frames_per_second(self) -> float:
        """Frames generated per second of generation time."""
        return self.frames / self.busy_seconds if self.busy_seconds > 0 else 0.0

    @property
    def real_time_factor(self) -> float:
        """Seconds of video made per second of generation time (above 1: faster than playback)."""
        return self.video_seconds / self.busy_seconds if self.busy_seconds > 0 else 0.0

    def add(self, chunk: VideoChunk, busy_seconds: float) -> None:
        self.chunks += 1
        self.frames += len(chunk.frames)
        self.busy_seconds += busy_seconds
        self.prompt = chunk.prompt
        self.actions = list(chunk.metrics.actions)
        drift = chunk.metrics.drift
        if drift is not None:
            self.frozen = drift.frozen
            for name, label in DRIFT_MEASURES.items():
                value = float(getattr(drift, name))
                if math.isfinite(value):
                    self.drift.append((chunk.index, label, value))


@dataclass
class LiveUpdate:
    segment: Path | None
    """A completed MPEG-TS segment (None on an update that completes none)."""
    stats: LiveStats
    video: Path | None = None
    """The whole video as an MP4, on the last update."""
    done: bool = False
    stopped: bool = False
    """The session ended before its planned length (stopped, or it had none)."""
    time_up: bool = False
    """It was ended by the server's time limit for one video."""


class LiveRecorder:
    """Cuts frames into stream segments and writes them to ``folder/<file_name>`` too, both
    enlarged by ``upscale`` (a factor or :class:`~vidgen.video.Upscale`).

    The MP4 trails the stream by ``hold_seconds``: the newest frames wait in memory, so that a
    session that goes back (:meth:`rewind`) leaves the frames it took back out of the download."""

    def __init__(
        self,
        folder: Path,
        fps: int,
        segment_seconds: float = 1.0,
        file_name: str = "video.mp4",
        upscale: Upscale | int | None = None,
        hold_seconds: float = 0.0,
    ) -> None:
        if segment_seconds < 1:
            raise ValueError(f"stream segments must last at least 1 s, got {segment_seconds}")
        self.folder = Path(folder)
        self.segments = SegmentWriter(
            self.folder, fps, segment_frames=math.ceil(segment_seconds * fps), upscale=upscale
        )
        self.mp4 = Mp4Writer(self.folder / file_name, fps, upscale=upscale)
        self.hold_frames = round(hold_seconds * fps)
        self._held: deque = deque()  # frames not yet in the MP4, oldest first
        self.frames = 0
        """Frames of the video so far (after a rewind: of the branch it is on)."""

    def add(self, frames) -> list[Path]:
        if len(frames) == 0:
            return []
        self._held.extend(frames)
        self.frames += len(frames)
        if len(self._held) > self.hold_frames:
            count = len(self._held) - self.hold_frames
            self.mp4.write(np.stack([self._held.popleft() for _ in range(count)]))
        return self.segments.write(frames)

    def rewind(self, frame: int) -> bool:
        """The video goes on from ``frame``: the frames after it leave the download. False when
        some of them were in the MP4 already (further back than ``hold_seconds``): those stay."""
        drop, held = max(0, self.frames - frame), len(self._held)
        for _ in range(min(drop, held)):
            self._held.pop()
        self.frames = min(self.frames, frame)
        return drop <= held

    def finish(self) -> tuple[list[Path], Path | None]:
        """The last (shorter) segment if any, and the MP4 (None when no frame was made)."""
        last = self.segments.flush()
        if self._held:
            self.mp4.write(np.stack(list(self._held)))
            self._held.clear()
        if self.mp4.frames_written == 0:
            self.mp4.abort()
            return last, None
        return last, self.mp4.close()

    def abort(self) -> None:
        self.mp4.abort()


class Turns:
    """``slots`` places to make a chunk in, handed out first come, first served.

    Each stream takes a turn for one chunk and queues again behind the others for the next, so a
    video that runs until stopped shares the slots with the ones started after it instead of
    holding one for as long as it plays."""

    def __init__(self, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self._busy = 0
        self._waiting: deque[object] = deque()
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        ticket = object()
        with self._changed:
            self._waiting.append(ticket)
            while self._busy >= self.slots or self._waiting[0] is not ticket:
                self._changed.wait()
            self._waiting.popleft()
            self._busy += 1
            self._changed.notify_all()  # the next in line may have a free slot too
        try:
            yield
        finally:
            with self._changed:
                self._busy -= 1
                self._changed.notify_all()

    @property
    def waiting(self) -> int:
        with self._changed:
            return len(self._waiting)


def live_stream(
    backend: SessionBackend,
    session_id: str,
    folder: Path,
    fps: int,
    *,
    segment_seconds: float = 1.0,
    max_lead: float | None = 3.0,
    stop_event: threading.Event | None = None,
    planned_seconds: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    file_name: str = "video.mp4",
    upscale: Upscale | int | None = None,
    turns: Turns | None = None,
    time_limit: float | None = None,
    hold_seconds: float = 0.0,
) -> Iterator[LiveUpdate]:
    """Yields one :class:`LiveUpdate` per completed segment, then a last one with the MP4.

    The session is stopped (its cache freed) however the iteration ends: at its planned length,
    after ``backend.stop``/``stop_event``, on an error, or when the consumer closes this
    generator (a client that went away). Each segment file is deleted once the consumer asks for
    the next update (a streaming player has taken it by then). ``max_lead`` None or 0: no pacing.
    ``file_name``: the downloadable MP4's name; ``upscale``: enlarges segments and MP4.
    ``turns``: each chunk is made in one of its slots (streams sharing a model take turns).
    ``time_limit``: seconds (of ``clock``) after which no further chunk is made, as after Stop.
    ``hold_seconds``: how far back the session may be rewound (``backend.rewind``) with the MP4
    following it: a chunk that starts before the frames recorded so far (the session went back)
    takes the frames after its start out of the MP4 and the figures; the stream plays on.
    """
    stop_event = stop_event or threading.Event()
    stats = LiveStats(fps=float(fps))
    recorder = LiveRecorder(folder, fps, segment_seconds, file_name, upscale, hold_seconds)
    try:
        chunks = backend.chunks(session_id)
    except KeyError:  # SessionNotFound: stopped, and so closed, before its first chunk
        chunks = iter(())
    started_playing: float | None = None
    deadline = clock() + time_limit if time_limit else None
    streamed = 0.0  # seconds of video in the segments handed out
    finished = time_up = False
    try:
        while True:
            if max_lead and started_playing is not None:
                # wait until playback is within max_lead of the video made
                while not stop_event.is_set():
                    ahead = streamed - (clock() - started_playing)
                    if ahead <= max_lead:
                        break
                    stop_event.wait(min(ahead - max_lead, 0.25))
            if deadline is not None and clock() >= deadline and not stop_event.is_set():
                time_up = True
                stop_event.set()
            if stop_event.is_set():
                # no further chunk is taken, even one a remote backend made ahead: the video ends
                # with the chunk that was being made when Stop came
                stop_session(backend, session_id)
                break
            with turns.turn() if turns is not None else contextlib.nullcontext():
                t0 = time.perf_counter()
                chunk = next(chunks, None)
                busy = time.perf_counter() - t0  # the wait for a turn is not generation time
            if chunk is None:
                break
            if chunk.frame_start < recorder.frames:  # the session went back: on from there
                if not recorder.rewind(chunk.frame_start):
                    logger.warning(
                        "session %s went back further than the %g s the download holds",
                        session_id,
                        hold_seconds,
                    )
                stats.frames = min(stats.frames, chunk.frame_start)
            stats.add(chunk, busy)
            for segment in recorder.add(chunk.frames):
                if started_playing is None:
                    started_playing = clock()
                streamed += recorder.segments.segment_frames / fps  # only the last one is shorter
                yield LiveUpdate(segment, stats)
                segment.unlink(missing_ok=True)
        last, video = recorder.finish()
        finished = True
        stopped = planned_seconds is None or stats.video_seconds < planned_seconds - 0.5 / fps
        for segment in last[:-1]:
            yield LiveUpdate(segment, stats)
        final = last[-1] if last else None
        yield LiveUpdate(final, stats, video=video, done=True, stopped=stopped, time_up=time_up and stopped)
    finally:
        stop_session(backend, session_id)
        if not finished:
            recorder.abort()
        if hasattr(chunks, "close"):
            chunks.close()


def stop_session(backend: SessionBackend, session_id: str) -> bool:
    """``backend.stop`` for clean-up paths: a failure (a remote backend gone) is logged, not raised,
    so it cannot hide what ended the stream. Returns whether the stop went through."""
    try:
        backend.stop(session_id)
        return True
    except Exception:
        logger.exception("could not stop session %s", session_id)
        return False
