"""Generation sessions: the interface a front end (the Gradio page, a server) drives.

A session is one video being generated for one client: it is opened with a
:class:`~vidgen.request.GenerationRequest`, its chunks are pulled as they are made, its prompt can
be changed while it runs, it can be made longer, and stopping it frees its KV cache.
:class:`SessionManager` holds the sessions of one pipeline: the page's local backend uses it in
this process, and each Ray Serve replica (``vidgen.serving``) wraps one, which ``RaySessions``
drives through the same :class:`SessionBackend` methods.

Its stream runs without end on the pipeline; a session hands out frames up to its current length
(``seconds``) and keeps the rest of a cut chunk, so a session that is extended continues exactly
where it stopped, with the frames an uninterrupted video would have.

Persistence (``persist_dir``): each session keeps ``<persist_dir>/<session id>/session.json`` (a
:class:`SessionRecord`: the request, the storyboard with the prompt changes made so far, frames
delivered) and the pipeline's state file. An idle session is evicted after ``idle_timeout_s``:
its stream is ended so that the pipeline saves the state after the last chunk delivered, and its
memory is freed. A later request for it restores the stream from that state (in this process or
another one) and goes on seamlessly. The pipeline saves its state after every chunk, so a session
also survives a crash (it then makes its last chunk again, and hands out only the frames not yet
delivered). Without ``persist_dir`` an evicted session is gone.

:class:`ModelInfo` says what requests a backend's model accepts (frame rate, sizes, config
defaults), so a front end can check a request and lay out its controls before opening a session.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import json
import math
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vidgen.config import ConfigError, VidgenConfig, vocabulary_module
from vidgen.pipelines.batching import StepBatcher
from vidgen.pipelines.memory import trim_heap
from vidgen.pipelines.pipeline import InputError, LongVideoPipeline, StreamControl, VideoChunk
from vidgen.pipelines.vae_stream import spatial_factor
from vidgen.request import GenerationRequest, prompt_changes

STATE_FILE = "state.safetensors"
"""The pipeline's state file in a session's folder (its KV snapshots are beside it, named after it)."""


class SessionBackend(Protocol):
    def open(self, request: GenerationRequest) -> str: ...

    def chunks(self, session_id: str) -> Iterator[VideoChunk]: ...

    def change_prompt(self, session_id: str, prompt: str) -> None: ...

    def stop(self, session_id: str) -> None: ...

    def extend(self, session_id: str, seconds: float) -> None: ...

    def rewind(self, session_id: str, seconds: float, prompt: str | None = None) -> float: ...

    def history(self, session_id: str) -> dict[str, Any]: ...


class SessionNotFound(KeyError):
    pass


def fit_warnings(config: VidgenConfig, prompts: list[str], height: int, width: int) -> list[str]:
    """What in a request the model was not made for (it still runs): prompts beyond its
    vocabulary (``model.vocabulary``) and sizes it was not trained at (``model.trained_sizes``).
    Every surface shows these as warnings: the CLI on stderr, the page as toasts."""
    warnings = []
    module = vocabulary_module(config.model.vocabulary)
    if module:  # the model's own checker, named by its config
        prompt_warning = importlib.import_module(module).prompt_warning
        warnings += [w for w in map(prompt_warning, dict.fromkeys(prompts)) if w]
    trained = config.trained_sizes()
    if trained and (width, height) not in trained:
        sizes = " or ".join(f"{w}x{h}" for w, h in trained)
        warnings.append(
            f"the model was trained at {sizes} (WxH), not {width}x{height}: expect fragments rather than "
            f"a video; leave the size out (or set {sizes.split(' ')[0]}) for what it was made for"
        )
    return warnings


@dataclass(frozen=True)
class RequestLimits:
    """A server's bounds on one request, below the model's own (``vidgen serve --max-side``,
    ``--max-steps``): what one client may ask is refused at ``open``, before memory is spent."""

    max_side: int | None = None
    """Largest height or width (None: twice the config's default size)."""
    max_steps: int | None = None
    """Most sampler steps per chunk (None: twice the config's default, at least 16)."""

    def resolve(self, config: VidgenConfig) -> tuple[int, int]:
        """``(max_side, max_steps)`` for a model whose config is ``config``."""
        g = config.generation
        side = self.max_side if self.max_side is not None else 2 * max(g.height, g.width)
        steps = self.max_steps if self.max_steps is not None else max(16, 2 * g.num_inference_steps)
        return side, steps


@dataclass(frozen=True)
class ModelInfo:
    """What a model accepts, derived from its pipeline (see :meth:`from_pipeline`)."""

    config: VidgenConfig
    """The config every request starts from; per-request ``overrides`` are applied to it."""
    size_multiple: int
    """Height and width must be multiples of this (VAE downsampling x transformer patch)."""
    max_side: int
    """Largest height or width: what the transformer's positional table covers, or less where a
    server limits it (:class:`RequestLimits`)."""
    attention_backends: tuple[str, ...] = ()
    """Attention backends usable where the model runs (empty: only automatic)."""
    max_steps: int | None = None
    """Most sampler steps per chunk (None: the config's ``generation.max_steps``)."""
    limited: bool = False
    """The bounds are a server's (:class:`RequestLimits`), tighter than the model's."""

    @classmethod
    def from_pipeline(cls, pipe: LongVideoPipeline, limits: RequestLimits | None = None) -> ModelInfo:
        from vidgen.attention import available_backends

        s = spatial_factor(pipe.vae)
        p_h, p_w = pipe.transformer.config.patch_size[1:]
        multiple = s * max(p_h, p_w)
        rope = getattr(pipe.transformer.config, "rope_max_seq_len", None)
        max_side = rope * multiple if rope else 4096
        max_steps = pipe.config.generation.max_steps
        if limits is not None:
            side, steps = limits.resolve(pipe.config)
            max_side, max_steps = min(max_side, side), min(max_steps, steps)
        return cls(
            pipe.config, multiple, max_side, tuple(available_backends()), max_steps, limits is not None
        )

    @property
    def fps(self) -> int:
        return self.config.generation.fps

    @property
    def steps_limit(self) -> int:
        return self.max_steps if self.max_steps is not None else self.config.generation.max_steps

    def check_size(self, height: int, width: int) -> None:
        """Raises :class:`InputError` unless the model can make ``height`` x ``width`` frames."""
        m = self.size_multiple
        where = "on this server" if self.limited else "for this model"
        for name, value in (("height", height), ("width", width)):
            if value <= 0 or value % m:
                raise InputError(f"{name} must be a positive multiple of {m} for this model, got {value}")
            if value > self.max_side:
                raise InputError(f"{name} must be at most {self.max_side} {where}, got {value}")

    def check_steps(self, steps: int) -> None:
        """Raises :class:`InputError` unless ``steps`` sampler steps per chunk may be asked for."""
        if steps > self.steps_limit:
            where = "on this server" if self.limited else "for this model"
            raise InputError(f"steps must be at most {self.steps_limit} {where}, got {steps}")

    def check_request(self, request: GenerationRequest) -> None:
        """The size and steps of ``request`` (its defaults: the config's), checked as above."""
        g = self.config.generation
        self.check_size(request.height or g.height, request.width or g.width)
        self.check_steps(request.num_inference_steps or g.num_inference_steps)

    def check_overrides(self, overrides: dict[str, Any]) -> VidgenConfig:
        """The config ``overrides`` make, or :class:`InputError` saying what to change."""
        try:
            return self.config.replace(**overrides)
        except ConfigError as err:
            raise InputError(str(err).removeprefix("overrides: ")) from None


@dataclass
class SessionRecord:
    """What makes a session's video again from a saved state (``session.json``)."""

    request: GenerationRequest
    """The request, its seed set."""
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

    FORMAT = 2
    """Layout of ``session.json`` (a file of another layout is not restored)."""

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        data = {**dataclasses.asdict(self), "format": self.FORMAT, "request": self.request.to_dict()}
        temp = folder / "session.json.tmp"
        temp.write_text(json.dumps(data))
        temp.replace(folder / "session.json")

    @classmethod
    def load(cls, folder: Path) -> SessionRecord | None:
        """The record saved in ``folder``; None when there is none this version can read."""
        try:
            data = json.loads((folder / "session.json").read_text())
            if data.pop("format", None) != cls.FORMAT:
                return None
            data["request"] = GenerationRequest.from_dict(data["request"])
            data["storyboard"] = [(float(t), str(p)) for t, p in data["storyboard"]]
            return cls(**data)
        except (OSError, ValueError, KeyError, TypeError):
            return None


@dataclass
class _Live:
    record: SessionRecord
    stream: Iterator[VideoChunk]
    control: StreamControl
    context: contextvars.Context
    """Every step of the stream runs in this one context: the pipeline sets context variables
    (the attention backend) around its loop, and a server steps the generator from worker threads
    that each bring their own context."""
    fps: int
    frame_end: int = 0
    """End of the last chunk the stream made (a prompt change applies from there)."""
    carry: VideoChunk | None = None
    """The part of a chunk beyond the session's length, handed out if it is extended."""
    stopped: bool = False
    pulling: bool = False
    """A consumer is reading the session's chunks; it closes a stopped session when done."""
    last_active: float = field(default_factory=time.monotonic)
    folder: Path | None = None
    """Where the stream saves its state after each chunk (None: nowhere)."""
    history: dict[int, _Saved] = field(default_factory=dict)
    """The saved state after each of the last chunks, by chunk index (rewind and fork)."""
    stepping: threading.RLock = field(default_factory=threading.RLock)
    """Held while the stream makes a chunk, and while a rewind replaces the stream."""

    @property
    def history_bytes(self) -> int:
        return sum(saved.size for saved in self.history.values())


@dataclass(frozen=True)
class _Saved:
    """A session's state after one chunk: the files its stream saved then (the state, and a KV
    snapshot where ``runtime.kv_snapshot_every`` writes one), and the frame the next chunk starts at."""

    frame_end: int
    files: dict[str, bytes]

    @property
    def size(self) -> int:
        return sum(len(data) for data in self.files.values())


class SessionManager:
    """The sessions of one pipeline, each with its own KV cache (the :class:`SessionBackend` of
    the page's local backend, and what each Ray Serve replica wraps).

    ``streamer``: what makes a session's stream from ``pipe.stream``'s arguments (default
    ``pipe.stream``); a sequence-parallel replica passes one that runs it on every rank of its
    group (``vidgen.distributed.session_group.SessionLeader``).

    :meth:`chunks` reads a session; :meth:`next_chunk` is its step (a server that steps sessions
    on one compute thread calls it, with :meth:`begin_read` / :meth:`end_read` around). A session
    stays until it is stopped or evicted, so that it can be extended; an idle one is evicted when
    another opens, or by a server's own timer (:meth:`idle`, :meth:`evict`). With ``limits`` a
    request beyond a server's bounds is refused at :meth:`open` (and :attr:`info` states them).

    ``batch_sessions`` > 1: sessions whose chunks are made at the same time, on their own threads
    (each page client's, a Serve replica's compute threads), run their transformer calls as one
    batched forward, up to that many sessions in one (:mod:`vidgen.pipelines.batching`), and
    ``batch_lanes`` such forwards at once; each session's frames are those it makes alone.

    ``history_mb``: each session keeps its state after each of its last chunks, up to this many MB
    (the oldest go first; 0: none), so that it can go back (:meth:`rewind`) or branch off
    (:meth:`fork`) at any chunk it still holds; a rewind with the same prompt continues as the
    video did, frame for frame.
    """

    def __init__(
        self,
        pipe: LongVideoPipeline,
        *,
        persist_dir: str | Path | None = None,
        idle_timeout_s: float = 600.0,
        new_id: Callable[[], str] | None = None,
        streamer: Callable[..., Iterator[VideoChunk]] | None = None,
        limits: RequestLimits | None = None,
        batch_sessions: int = 1,
        batch_lanes: int = 1,
        history_mb: float = 64.0,
    ) -> None:
        self.pipe = pipe
        self.history_bytes = int(history_mb * 2**20)
        self._scratch: Path | None = None  # state folders of sessions that do not persist
        self.batcher = StepBatcher(batch_sessions, batch_lanes) if batch_sessions > 1 else None
        self.streamer = streamer or pipe.stream
        self.limits = limits
        self.persist_dir = Path(persist_dir) if persist_dir else None
        self.idle_timeout_s = idle_timeout_s
        self.new_id = new_id or (lambda: uuid.uuid4().hex)
        self.sessions: dict[str, _Live] = {}
        self.lock = threading.Lock()
        self.evicted = 0
        self.restored = 0
        self._info: ModelInfo | None = None

    @property
    def info(self) -> ModelInfo:
        if self._info is None:
            self._info = ModelInfo.from_pipeline(self.pipe, self.limits)
        return self._info

    @property
    def active(self) -> int:
        """Sessions live in memory."""
        with self.lock:
            return len(self.sessions)

    # ------------------------------------------------------------------ opening
    def open(self, request: GenerationRequest) -> str:
        """Start a session (its first chunk is made when it is first read). A request that cannot
        run raises :class:`InputError` here, not at the first chunk."""
        for idle in self.idle():
            self.evict(idle)
        request.validate()
        if self.limits is not None:  # a server's bounds (the model's own are checked below)
            self.info.check_request(request)
        overrides = request.config_overrides()
        fps = (self.pipe.config.replace(**overrides) if overrides else self.pipe.config).generation.fps
        seed = (
            request.seed if request.seed is not None else int.from_bytes(uuid.uuid4().bytes[:4], "big") >> 1
        )
        request = dataclasses.replace(request, seed=seed)
        self.pipe.check_inputs(**request.stream_kwargs())
        opening = _opening_frames(request)
        frames = request.num_frames(fps)
        record = SessionRecord(
            request,
            prompt_changes(request.prompt, request.storyboard),
            opening + frames if frames is not None else None,
            opening_frames=opening,
        )
        session_id = self.new_id()
        live = self._start(session_id, record, resume=False)
        with self.lock:
            self.sessions[session_id] = live
        if self.persist_dir is not None:
            record.save(self.persist_dir / session_id)
        return session_id

    def _start(self, session_id: str, record: SessionRecord, resume: bool) -> _Live:
        """The session's stream: without end, under the storyboard as changed so far."""
        run = dataclasses.replace(record.request, prompt=None, storyboard=record.storyboard, seconds=None)
        control = StreamControl()
        folder = self._folder(session_id)
        state = folder / STATE_FILE if folder is not None else None
        stream = self.streamer(**run.stream_kwargs(), control=control, state_path=state, resume=resume)
        overrides = run.config_overrides()
        config = self.pipe.config.replace(**overrides) if overrides else self.pipe.config
        live = _Live(record, stream, control, contextvars.copy_context(), config.generation.fps)
        live.folder = folder
        return live

    def _folder(self, session_id: str) -> Path | None:
        """Where a session's stream saves its state: its persisted folder, or (with a history) a
        folder of this manager's own, removed when the session closes."""
        if self.persist_dir is not None:
            return self.persist_dir / session_id
        if not self.history_bytes:
            return None
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="vidgen-sessions-"))
        folder = self._scratch / session_id
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _restore(self, session_id: str) -> _Live | None:
        folder = self.persist_dir / session_id if self.persist_dir else None
        if folder is None or not (folder / "session.json").is_file():
            return None
        record = SessionRecord.load(folder)
        if record is None:
            return None
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
    def chunks(self, session_id: str) -> Iterator[VideoChunk]:
        """The session's chunks as they are made, up to its length or until it is stopped.
        :class:`SessionNotFound` (or ``RuntimeError`` if another consumer reads it) is raised
        here, not at the first chunk. A stopped session is closed (its cache freed) when its
        reading ends, even before the first chunk."""
        self.begin_read(session_id)
        return _Reader(self, session_id)

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
        with live.stepping:
            if self.sessions.get(session_id) is not live:  # rewound while this waited
                live = self.get(session_id)
            return self._next_chunk(session_id, live)

    def _next_chunk(self, session_id: str, live: _Live) -> VideoChunk | None:
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
                    with self.batcher.member() if self.batcher is not None else contextlib.nullcontext():
                        chunk = live.context.run(next, live.stream)
                except StopIteration:
                    return None
                live.frame_end = chunk.frame_start + len(chunk.frames)
                self._remember(live, chunk)
            after = _after(chunk, record.delivered, live.fps)  # a restored stream makes some frames again
            if after is not None:
                chunk = after
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

    def rewind(self, session_id: str, seconds: float, prompt: str | None = None) -> float:
        """Take back the last ``seconds`` of the session's video: it goes on from the newest chunk
        boundary at or before that point whose state it still holds (its start at the latest),
        with ``prompt`` from there if given. Prompt changes made after that point are dropped;
        with the same prompt the video continues as it did, frame for frame. Returns the time the
        session now stands at, in seconds of its video (what it hands out next starts there)."""
        _check_seconds("seconds", seconds)
        self._check_history()
        live = self.get(session_id)
        with live.stepping:
            live = self.get(session_id)
            chunk, saved = self._saved_at(live, live.record.delivered - round(seconds * live.fps))
            record = _branch(live.record, saved, live.fps, prompt)
            live.context.run(_close, live.stream)  # the old branch's cache is freed
            fresh = self._restart(session_id, record, saved)
            fresh.history = {k: v for k, v in live.history.items() if k <= chunk}
            fresh.pulling, fresh.stepping = live.pulling, live.stepping
            with self.lock:
                self.sessions[session_id] = fresh
            return record.delivered / live.fps

    def fork(self, session_id: str, at_seconds: float, prompt: str | None = None) -> str:
        """A new session that is this one's video up to ``at_seconds`` (the newest chunk boundary
        at or before it whose state is held) and goes on from there, with ``prompt`` if given; this
        session goes on unchanged. Returns the new session's id; its reading starts at that point."""
        _check_seconds("at_seconds", at_seconds)
        self._check_history()
        live = self.get(session_id)
        with live.stepping:
            frame = min(round(at_seconds * live.fps), live.record.delivered)
            chunk, saved = self._saved_at(live, frame)
            record = _branch(live.record, saved, live.fps, prompt)
            new_id = self.new_id()
            branch = self._restart(new_id, record, saved)
            branch.history = {k: v for k, v in live.history.items() if k <= chunk}
        with self.lock:
            self.sessions[new_id] = branch
        return new_id

    def history(self, session_id: str) -> dict[str, Any]:
        """What a session can go back to: the chunk boundaries held (seconds of its video), the
        bytes they take and the budget, and its prompts as changed so far (seconds, prompt)."""
        live = self.get(session_id)
        fps, opening = live.fps, live.record.opening_frames
        return {
            "position": live.record.delivered / fps,
            "boundaries": [0.0] + [saved.frame_end / fps for _, saved in sorted(live.history.items())],
            "bytes": live.history_bytes,
            "budget": self.history_bytes,
            "prompts": [(t + opening / fps, p) for t, p in live.record.storyboard],
        }

    def _check_history(self) -> None:
        if not self.history_bytes:
            raise InputError("this server keeps no session history (history_mb=0): it cannot rewind or fork")

    def _remember(self, live: _Live, chunk: VideoChunk) -> None:
        """Keep the state the stream saved after the chunk before ``chunk`` (a stream saves a
        chunk's state when the next one is asked for), dropping the oldest beyond the budget."""
        if not self.history_bytes or live.folder is None or chunk.index == 0:
            return
        files = {
            path.name: path.read_bytes()
            for path in sorted(live.folder.glob(STATE_FILE + "*"))
            if not path.name.endswith(".tmp")
        }
        if STATE_FILE not in files:
            return
        live.history[chunk.index - 1] = _Saved(chunk.frame_start, files)
        while live.history_bytes > self.history_bytes and len(live.history) > 1:
            del live.history[min(live.history)]

    @staticmethod
    def _saved_at(live: _Live, frame: int) -> tuple[int, _Saved | None]:
        """The newest held state at or before ``frame``: (its chunk, the state); (-1, None): the start."""
        held = [(k, saved) for k, saved in live.history.items() if saved.frame_end <= frame]
        if not held:
            return -1, None
        return max(held, key=lambda item: item[0])

    def _restart(self, session_id: str, record: SessionRecord, saved: _Saved | None) -> _Live:
        """A stream for ``record`` that takes up ``saved``, or starts afresh without one."""
        folder = self._folder(session_id)
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob(STATE_FILE + "*"):
                old.unlink()
            for name, data in (saved.files if saved is not None else {}).items():
                (folder / name).write_bytes(data)
            if self.persist_dir is not None:
                record.save(folder)
        live = self._start(session_id, record, resume=saved is not None)
        live.frame_end = record.delivered
        return live

    def stop(self, session_id: str) -> None:
        """End the session for good (its persisted state too). One being read ends before its
        next chunk and is closed by its reader; stopping twice is harmless."""
        with self.lock:
            live = self.sessions.get(session_id)
            if live is None:
                self._forget(session_id)
                return
            live.stopped = True
            live.control.stop()
            reading = live.pulling
        if not reading:
            self._close(session_id, forget=True)

    # ------------------------------------------------------------------ eviction
    def idle(self, now: float | None = None) -> list[str]:
        """Sessions nobody has read or steered for ``idle_timeout_s``."""
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
        live.context.run(_close, live.stream)  # drops the generator's frame: the KV cache is freed
        if forget or self.persist_dir is None:  # a session that does not persist is gone
            self._forget(session_id)
        del live
        trim_heap()  # its cache's memory back to the system, not kept in a thread's arena

    def _forget(self, session_id: str) -> None:
        if self.persist_dir is not None:
            shutil.rmtree(self.persist_dir / session_id, ignore_errors=True)
        elif self._scratch is not None:
            shutil.rmtree(self._scratch / session_id, ignore_errors=True)

    def close(self) -> None:
        """Drop every live session without saving anything more (what is on disk stays)."""
        with self.lock:
            lives, self.sessions = list(self.sessions.values()), {}
        for live in lives:
            live.context.run(_close, live.stream)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def describe(self) -> dict[str, Any]:
        with self.lock:
            return {
                "sessions": sorted(self.sessions),
                "reading": sorted(sid for sid, live in self.sessions.items() if live.pulling),
                "evicted": self.evicted,
                "restored": self.restored,
                **({"batched": dataclasses.asdict(self.batcher.stats)} if self.batcher is not None else {}),
            }


class _Reader(Iterator[VideoChunk]):
    """One consumer's reading of a session: :meth:`SessionManager.next_chunk` until it ends, then
    :meth:`SessionManager.end_read` (also when closed early or garbage-collected)."""

    def __init__(self, sessions: SessionManager, session_id: str) -> None:
        self._sessions: SessionManager | None = sessions
        self._session_id = session_id

    def __next__(self) -> VideoChunk:
        if self._sessions is None:
            raise StopIteration
        try:
            chunk = self._sessions.next_chunk(self._session_id)
        except BaseException:  # an error or an interrupt: this reading is over
            self.close()
            raise
        if chunk is None:
            self.close()
            raise StopIteration
        return chunk

    def close(self) -> None:
        if self._sessions is not None:
            sessions, self._sessions = self._sessions, None
            sessions.end_read(self._session_id)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _opening_frames(request: GenerationRequest) -> int:
    """How many frames the session's start file holds (read now: an unreadable file fails the
    request at ``open``)."""
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


def _check_seconds(name: str, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise InputError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


def _branch(record: SessionRecord, saved: _Saved | None, fps: int, prompt: str | None) -> SessionRecord:
    """``record`` taken back to ``saved`` (None: the start): the prompt changes made before that
    point, then ``prompt`` from it."""
    frame = saved.frame_end if saved is not None else 0
    at = max(0.0, (frame - record.opening_frames) / fps)  # storyboard times count after the opening
    board = [entry for index, entry in enumerate(record.storyboard) if index == 0 or entry[0] < at - 1e-9]
    if prompt is not None and prompt.strip():
        if at <= 1e-9:
            board = [(0.0, prompt.strip())]
        else:
            _add_change(board, at, prompt.strip())
    return dataclasses.replace(record, storyboard=board, delivered=frame, pending_prompt=None)


def _drain(stream: Iterator[VideoChunk]) -> None:
    for _ in stream:
        pass


def _close(stream: Iterator[VideoChunk]) -> None:
    """Close a pipeline's stream (a generator: closing it runs its cleanup)."""
    close = getattr(stream, "close", None)
    if close is not None:
        close()


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


__all__ = [
    "GenerationRequest",
    "ModelInfo",
    "RequestLimits",
    "SessionBackend",
    "SessionManager",
    "SessionNotFound",
    "SessionRecord",
    "fit_warnings",
]
