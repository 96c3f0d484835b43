"""Generation sessions: the interface a front end (the Gradio page, a server) drives.

A session is one video being generated for one client: it is opened with a request, its chunks are
pulled as they are made, its prompt can be changed while it runs, and stopping it frees its KV
cache. :class:`LocalSessions` runs sessions on a pipeline in this process; the Ray backend in
``vidgen.distributed`` implements the same methods on Ray Serve replicas.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from vidgen.pipelines.pipeline import LongVideoPipeline, StreamControl, VideoChunk


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


class SessionBackend(Protocol):
    def open(self, request: GenerationRequest) -> str: ...

    def chunks(self, session_id: str) -> Iterator[VideoChunk]: ...

    def change_prompt(self, session_id: str, prompt: str) -> None: ...

    def stop(self, session_id: str) -> None: ...


class SessionNotFound(KeyError):
    pass


@dataclass
class _Session:
    request: GenerationRequest
    control: StreamControl
    stream: Iterator[VideoChunk] | None = None


class LocalSessions:
    """Sessions on one in-process pipeline; each session's cache is its own."""

    def __init__(self, pipe: LongVideoPipeline) -> None:
        self.pipe = pipe
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

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
        )
        with self._lock:
            self._sessions[session_id] = _Session(request, control, stream)
        return session_id

    def _get(self, session_id: str) -> _Session:
        with self._lock:
            if session_id not in self._sessions:
                raise SessionNotFound(session_id)
            return self._sessions[session_id]

    def chunks(self, session_id: str) -> Iterator[VideoChunk]:
        session = self._get(session_id)
        try:
            yield from session.stream
        finally:
            self._close(session_id)

    def change_prompt(self, session_id: str, prompt: str) -> None:
        self._get(session_id).control.change_prompt(prompt)

    def stop(self, session_id: str) -> None:
        with contextlib.suppress(SessionNotFound):
            self._get(session_id).control.stop()

    def _close(self, session_id: str) -> None:
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is not None and session.stream is not None:
            session.stream.close()  # drops the generator's frame: the KV cache is freed

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._sessions)
