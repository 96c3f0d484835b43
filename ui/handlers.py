"""What the page's buttons do: generate (a stream of updates), change the prompt, stop.

:class:`LiveHandlers` holds the server-wide pieces (the session backend, the model's limits, the
server's folder, the stream settings) and the stop switches of the runs in progress; everything
about one browser tab is in its ``gr.State``, which holds the id of the session it is playing.
Bad input (an :class:`~vidgen.validation.InputError`, such as the form's
:class:`~vidgen.ui.form.FormError`) is one message in the status line, the other outputs left as they were and nothing in the server log;
only a failure of generation itself raises ``gr.Error`` (and is logged).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from vidgen.pipelines.memory import trim_heap
from vidgen.pipelines.session import ModelInfo, SessionBackend
from vidgen.request import GenerationRequest
from vidgen.ui.files import ServerFiles
from vidgen.ui.form import Form, FormError, build_request
from vidgen.ui.live import ACTION_NAMES, LiveStats, LiveUpdate, Turns, live_stream, stop_session
from vidgen.validation import InputError
from vidgen.video import Upscale
from vidgen.video.naming import video_file_name

logger = logging.getLogger("vidgen.ui")

MAX_BACK_SECONDS = 10.0
"""The page's "Go back" takes back at most this much; the download trails the stream by it (and
a chunk more), so the frames taken back leave it."""


@dataclass
class StreamSettings:
    segment_seconds: float = 1.0
    """Length of each stream segment (>= 1 s)."""
    max_lead: float = 3.0
    """Seconds of video generation may run ahead of the stream (0: no limit)."""
    upscale: Upscale | int | None = None
    """Enlarges the player's segments and the MP4 (``vidgen serve --upscale``)."""
    turns: Turns | None = None
    """The slots chunks are made in, shared by every stream of the page (None: no turns)."""
    time_limit: float | None = None
    """Wall-clock seconds one video may stream (``--max-session-seconds``; None: no limit)."""
    max_back: float = MAX_BACK_SECONDS
    """Most seconds the page's "Go back" takes back (the download holds that much back)."""


def drift_table(stats: LiveStats | None):
    """The drift plot's data, one row per (chunk, measure); None before the first measures
    (Gradio's LinePlot draws no lines at all after starting from an empty table)."""
    import pandas as pd

    rows = list(stats.drift) if stats is not None else []
    if not rows:
        return None
    chunk, measure, value = zip(*rows)
    return pd.DataFrame(
        {
            "chunk": pd.Series(chunk, dtype="int64"),
            "measure": pd.Series(measure, dtype="str"),
            "value": pd.Series(value, dtype="float64"),
        }
    )


def describe(stats: LiveStats, update: LiveUpdate | None = None, seed: int | None = None) -> str:
    """The status line under the video."""
    if update is not None and update.done:
        verb = "Stopped" if update.stopped else "Done"
        if update.time_up:
            verb = "Stopped at the server's time limit"
        text = f"**{verb}**: {stats.video_seconds:.1f} s of video in {stats.chunks} chunks"
        text += f", seed {seed}." if seed is not None else "."
        return text + (" Download the MP4 below." if update.video is not None else "")
    text = f"**Streaming** {stats.video_seconds:.1f} s, chunk {stats.chunks}: *{stats.prompt}*"
    notes = [ACTION_NAMES.get(a, a.replace("_", " ")) for a in stats.actions]
    if stats.frozen:
        notes.append("the picture froze")
    if notes:
        text += f" ({', '.join(notes)})"
    if seed is not None:
        text += f" - seed {seed}"
    return text


class LiveHandlers:
    """The event handlers of one page, shared by all its browser sessions."""

    def __init__(
        self,
        backend: SessionBackend,
        info: ModelInfo,
        files: ServerFiles,
        settings: StreamSettings | None = None,
    ) -> None:
        self.backend = backend
        self.info = info
        self.files = files
        self.settings = settings or StreamSettings()
        self._stops: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.trim_again_after_s = 2.0
        """Seconds after a video ends when the heap is trimmed once more (if still idle)."""
        self.streams: dict | None = None
        """Gradio's ``Blocks.pending_streams`` (session -> run -> output -> segments in memory),
        set by ``build_app``: a tab's finished runs are dropped when it starts a new one."""

    # -------------------------------------------------------------- generate
    def generate(
        self,
        prompt: str,
        storyboard: Any,
        seconds: float | None,
        until_stopped: bool,
        seed: float | None,
        height: float | None,
        width: float | None,
        steps: float | None,
        window_frames: float | None,
        sink_frames: float | None,
        anchor_stats: bool | None,
        recache_every: float | None,
        context_noise: float | None,
        attention_backend: str | None,
        start_file: str | None = None,
        session_id: str | None = None,
        page: gr.Request | None = None,
    ) -> Iterator[tuple]:
        """Streams a new video. Yields ``(video segment, frames per second, real-time factor,
        chunks, drift table, MP4, status, session id)`` once at the start and then once per
        segment; the last update carries the MP4. ``page``: Gradio's request (its tab), passed by
        Gradio."""
        if session_id:
            self.stop(session_id)  # one stream per browser tab
        if page is not None:
            self.drop_finished_streams(page.session_hash)
        form = Form(
            prompt=prompt,
            storyboard=storyboard,
            seconds=seconds,
            until_stopped=bool(until_stopped),
            seed=seed,
            height=height,
            width=width,
            steps=steps,
            window_frames=window_frames,
            sink_frames=sink_frames,
            anchor_stats=anchor_stats,
            recache_every=recache_every,
            context_noise=context_noise,
            attention_backend=attention_backend,
            start_file=start_file,
        )
        try:
            request, warnings = build_request(form, self.info)
        except FormError as err:
            yield self._message(f"**Check the form**: {err}")
            return
        for warning in warnings:
            gr.Warning(warning)
        yield from self._stream(request)

    @staticmethod
    def _message(status: str) -> tuple:
        """An update that only says ``status`` (the video, figures and download stay as they are)."""
        return (gr.skip(),) * 6 + (status, gr.skip())

    def _stream(self, request: GenerationRequest) -> Iterator[tuple]:
        try:
            session_id = self.backend.open(request)
        except InputError as err:
            yield self._message(f"**Cannot generate this**: {err}")
            return
        folder = self.files.new_run()
        stop_event = threading.Event()
        with self._lock:
            self._stops[session_id] = stop_event
        updates = None
        completed = False
        try:
            yield (gr.skip(), 0.0, 0.0, 0, None, None, "Starting...", session_id)
            updates = live_stream(
                self.backend,
                session_id,
                folder,
                self.info.fps,
                segment_seconds=self.settings.segment_seconds,
                max_lead=self.settings.max_lead,
                stop_event=stop_event,
                planned_seconds=request.seconds,
                file_name=video_file_name(request.prompt or request.storyboard[0][1]),
                upscale=self.settings.upscale,
                turns=self.settings.turns,
                time_limit=self.settings.time_limit,
                hold_seconds=self.settings.max_back + 2.0,  # the boundary before the point, and a chunk
            )
            for update in updates:
                stats = update.stats
                video = str(update.segment) if update.segment is not None else gr.skip()
                download = str(update.video) if update.video is not None else gr.skip()
                yield (
                    video,
                    round(stats.frames_per_second, 1),
                    round(stats.real_time_factor, 2),
                    stats.chunks,
                    gr.skip() if not stats.drift else drift_table(stats),
                    download,
                    describe(stats, update, request.seed),
                    session_id,
                )
            completed = True
        except InputError as err:
            raise gr.Error(str(err), title="Cannot generate this") from None
        except gr.Error:
            raise
        except Exception as err:
            logger.exception("generation %s failed", session_id)
            raise gr.Error(f"generation failed: {err}") from None
        finally:
            # also reached when the client goes away: Gradio closes this generator
            with self._lock:
                self._stops.pop(session_id, None)
            if updates is not None:
                updates.close()  # stops the session, closes its chunks, drops a partial MP4
            stop_session(self.backend, session_id)
            self.files.release(folder, delete=not completed)
            self._trim_if_idle()
            # Gradio goes on to post-process the last update (the MP4 into its cache) after this
            timer = threading.Timer(self.trim_again_after_s, self._trim_if_idle)
            timer.daemon = True
            timer.start()

    def _trim_if_idle(self) -> None:
        """The last video ended: the memory it used goes back to the system."""
        with self._lock:
            idle = not self._stops
        if idle:
            trim_heap()

    def drop_finished_streams(self, session_hash: str | None) -> int:
        """Forgets the tab's finished streams (Gradio keeps every segment of every run in memory
        until the tab closes; a client of the API never closes). Returns how many were dropped."""
        runs = self.streams.get(session_hash) if self.streams is not None and session_hash else None
        if not runs:
            return 0
        finished = [run for run, outputs in list(runs.items()) if all(s.ended for s in outputs.values())]
        for run in finished:
            runs.pop(run, None)
        return len(finished)

    # -------------------------------------------------------------- while it plays
    def change_prompt(self, new_prompt: str, session_id: str | None = None) -> str:
        """Applies ``new_prompt`` from the next chunk of the tab's stream; returns the status line.

        Runs outside the queue (it must not wait behind generations), where Gradio shows no
        toasts, so what went wrong is said in the status line."""
        text = (new_prompt or "").strip()
        if not text:
            return "**Type the new prompt first.**"
        if not self.running(session_id):
            return "**Nothing is being generated**: press Generate first."
        try:
            self.backend.change_prompt(session_id, text)
        except KeyError:  # the session ended meanwhile
            return "**The video has already ended**: press Generate to start a new one."
        return f"Prompt changes to *{text}* from the next chunk."

    def rewind(self, seconds: float | None, new_prompt: str | None, session_id: str | None = None) -> str:
        """Takes back the last ``seconds`` of the tab's video; it goes on from the newest chunk
        boundary before that point, with ``new_prompt`` from there if one is typed (else as it
        went). Returns the status line, with the prompts of the branch the video is now on.

        Runs outside the queue, as ``change_prompt``."""
        limit = self.settings.max_back
        if (
            seconds is None
            or isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not math.isfinite(seconds)
            or not 0 < seconds <= limit
        ):
            return f"**Check the form**: seconds back must be a number above 0 and at most {limit:g}."
        if not self.running(session_id):
            return "**Nothing is being generated**: press Generate first."
        prompt = (new_prompt or "").strip() or None
        try:
            at = self.backend.rewind(session_id, float(seconds), prompt)
            prompts = self.backend.history(session_id)["prompts"]
        except KeyError:  # the session ended meanwhile
            return "**The video has already ended**: press Generate to start a new one."
        except InputError as err:
            return f"**Cannot go back**: {err}"
        timeline = "; ".join(f"{t:.1f} s *{p}*" for t, p in prompts)
        return f"Went back to **{at:.1f} s**: the video goes on from there. Prompts: {timeline}."

    def stop(self, session_id: str | None = None) -> str:
        """Ends the tab's stream before its next chunk; its cache is freed when it ends."""
        if not session_id:
            return gr.skip()
        with self._lock:
            event = self._stops.get(session_id)
        if event is not None:
            event.set()  # wakes the stream if it is waiting for playback
        if not stop_session(self.backend, session_id) and event is None:
            return "**Could not reach the video's session**; it ends when its page closes."
        return "Stopping after the current chunk..." if event is not None else gr.skip()

    def stop_quietly(self, session_id: str | None) -> None:
        """``gr.State``'s delete callback: the tab is gone, so is its stream."""
        if session_id:
            self.stop(session_id)

    def running(self, session_id: str | None) -> bool:
        with self._lock:
            return bool(session_id) and session_id in self._stops
