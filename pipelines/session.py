"""Generation sessions: the interface a front end (the Gradio page, a server) drives.

A session is one video being generated for one client: it is opened with a request, its chunks are
pulled as they are made, its prompt can be changed while it runs, and stopping it frees its KV
cache. :class:`LocalSessions` runs sessions on a pipeline in this process; the Ray backend in
``vidgen.distributed`` implements the same methods on Ray Serve replicas.

:class:`ModelInfo` says what requests a backend's model accepts (frame rate, sizes, config
defaults), so a front end can check a request and lay out its controls before opening a session.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from vidgen.config import ConfigError, VidgenConfig
from vidgen.pipelines.pipeline import InputError, LongVideoPipeline, StreamControl, VideoChunk
from vidgen.pipelines.vae_stream import spatial_factor


@dataclass
class GenerationRequest:
    prompt: str | None = None
    storyboard: list[tuple[float, str]] | None = None
    seconds: float | None = None
    """None: until stopped."""
    height: int | None = None
    width: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    """``"table.key": value`` config changes for this video (window, sinks, drift, backend)."""
    image: str | None = None
    """Image-to-video: an image file (readable where the session runs) the video starts from."""
    video: str | None = None
    """Continuation: a video file continued; the session's video opens with its frames, and
    ``seconds`` counts the frames made after them."""

    def stream_input(self) -> dict[str, Any]:
        """``pipe.stream`` arguments for the start frames (none without ``image`` / ``video``)."""
        if not (self.image or self.video):
            return {}
        return {"image": self.image, "video": self.video, "include_input": True}


class SessionBackend(Protocol):
    def open(self, request: GenerationRequest) -> str: ...

    def chunks(self, session_id: str) -> Iterator[VideoChunk]: ...

    def change_prompt(self, session_id: str, prompt: str) -> None: ...

    def stop(self, session_id: str) -> None: ...


class SessionNotFound(KeyError):
    pass


def fit_warnings(config: VidgenConfig, prompts: list[str], height: int, width: int) -> list[str]:
    """What in a request the model was not made for (it still runs): prompts beyond its
    vocabulary (``model.vocabulary``) and sizes it was not trained at (``model.trained_sizes``).
    Every surface shows these as warnings: the CLI on stderr, the page as toasts."""
    warnings = []
    if config.model.vocabulary == "shapes_world":
        from vidgen.shapes.vocabulary import prompt_warning

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
class ModelInfo:
    """What a model accepts, derived from its pipeline (see :meth:`from_pipeline`)."""

    config: VidgenConfig
    """The config every request starts from; per-request ``overrides`` are applied to it."""
    size_multiple: int
    """Height and width must be multiples of this (VAE downsampling x transformer patch)."""
    max_side: int
    """Largest height or width the transformer's positional table covers."""
    attention_backends: tuple[str, ...] = ()
    """Attention backends usable where the model runs (empty: only automatic)."""

    @classmethod
    def from_pipeline(cls, pipe: LongVideoPipeline) -> ModelInfo:
        from vidgen.attention import available_backends

        s = spatial_factor(pipe.vae)
        p_h, p_w = pipe.transformer.config.patch_size[1:]
        multiple = s * max(p_h, p_w)
        rope = getattr(pipe.transformer.config, "rope_max_seq_len", None)
        max_side = rope * multiple if rope else 4096
        return cls(pipe.config, multiple, max_side, tuple(available_backends()))

    @property
    def fps(self) -> int:
        return self.config.generation.fps

    def check_size(self, height: int, width: int) -> None:
        """Raises :class:`InputError` unless the model can make ``height`` x ``width`` frames."""
        m = self.size_multiple
        for name, value in (("height", height), ("width", width)):
            if value <= 0 or value % m:
                raise InputError(f"{name} must be a positive multiple of {m} for this model, got {value}")
            if value > self.max_side:
                raise InputError(f"{name} must be at most {self.max_side} for this model, got {value}")

    def check_overrides(self, overrides: dict[str, Any]) -> VidgenConfig:
        """The config ``overrides`` make, or :class:`InputError` saying what to change."""
        try:
            return self.config.replace(**overrides)
        except ConfigError as err:
            raise InputError(str(err).removeprefix("overrides: ")) from None


@dataclass
class _Session:
    request: GenerationRequest
    control: StreamControl
    stream: Iterator[VideoChunk]
    context: contextvars.Context
    """Every step of the stream runs in this one context: the pipeline sets context variables
    (the attention backend) around its loop, and a server steps the generator from worker threads
    that each bring their own context."""
    pulling: bool = False
    """A consumer is iterating :meth:`LocalSessions.chunks`; it closes the stream when done."""


class LocalSessions:
    """Sessions on one in-process pipeline; each session's cache is its own."""

    def __init__(self, pipe: LongVideoPipeline) -> None:
        self.pipe = pipe
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._info: ModelInfo | None = None

    @property
    def info(self) -> ModelInfo:
        if self._info is None:
            self._info = ModelInfo.from_pipeline(self.pipe)
        return self._info

    def open(self, request: GenerationRequest) -> str:
        session_id = uuid.uuid4().hex
        control = StreamControl()
        stream = self.pipe.stream(
            request.prompt,
            storyboard=request.storyboard,
            seconds=request.seconds,
            height=request.height,
            width=request.width,
            num_inference_steps=request.num_inference_steps,
            guidance_scale=request.guidance_scale,
            generator=request.seed,
            control=control,
            overrides=request.overrides or None,
            **request.stream_input(),
        )
        with self._lock:
            self._sessions[session_id] = _Session(request, control, stream, contextvars.copy_context())
        return session_id

    def _get(self, session_id: str) -> _Session:
        with self._lock:
            if session_id not in self._sessions:
                raise SessionNotFound(session_id)
            return self._sessions[session_id]

    def chunks(self, session_id: str) -> Iterator[VideoChunk]:
        """The session's chunks as they are made; the session is closed (its cache freed) when
        they end, when one fails, or when the iterator is closed, even before its first chunk."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise SessionNotFound(session_id)
            if session.pulling:
                raise RuntimeError(f"session {session_id} is already being read")
            session.pulling = True
        return _Reader(self, session_id, session)

    def change_prompt(self, session_id: str, prompt: str) -> None:
        self._get(session_id).control.change_prompt(prompt)

    def stop(self, session_id: str) -> None:
        """Ends the session before its next chunk. A session nobody reads is closed at once; one
        being read is closed by its reader, which sees the stream end."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return
            session.control.stop()
            if session.pulling:
                return
            del self._sessions[session_id]
        session.context.run(_close, session.stream)

    def _close(self, session_id: str) -> None:
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is not None:
            session.context.run(_close, session.stream)  # drops the generator's frame: the KV cache is freed

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._sessions)


class _Reader(Iterator[VideoChunk]):
    """Steps one session's stream in the session's context; closing it closes the session."""

    def __init__(self, sessions: LocalSessions, session_id: str, session: _Session) -> None:
        self._sessions = sessions
        self._session_id = session_id
        self._session: _Session | None = session

    def __next__(self) -> VideoChunk:
        if self._session is None:
            raise StopIteration
        try:
            return self._session.context.run(next, self._session.stream)
        except BaseException:  # the end, an error, or an interrupt: the session is over
            self.close()
            raise

    def close(self) -> None:
        if self._session is not None:
            self._session = None
            self._sessions._close(self._session_id)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _close(stream: Iterator[VideoChunk]) -> None:
    """Close a pipeline's stream (a generator: closing it runs its cleanup)."""
    close = getattr(stream, "close", None)
    if close is not None:
        close()
