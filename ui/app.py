"""The live page of ``vidgen serve``: type a prompt, watch the video stream as it is generated.

The page (``gr.Blocks``): a prompt, an optional storyboard (rows of start time and prompt), the
length (seconds, or until stopped), seed, size and steps, and an Advanced accordion (context
window, sink frames, drift correction, attention backend). Generate streams the video into a
streaming ``gr.Video``, one MPEG-TS segment (one second by default) per update, with live figures
(generation frames per second, real-time factor, chunks, a plot of the drift measures) and the
whole MP4 to download at the end. While it plays, "Change prompt now" applies a new prompt from
the next chunk, "Go back" takes back the last seconds (at most 10) and goes on from there -- with
the prompt typed above if any, else as the video went -- leaving them out of the download, and
Stop ends it within a chunk.

It is built on :class:`~vidgen.pipelines.session.SessionBackend`, so any backend with that
protocol serves it (``--backend local``: the pipeline in this process; ``--backend ray``: Ray
Serve replicas from ``vidgen.serving``). The model is loaded in :func:`run_server` only (the
``vidgen serve`` command translates its flags into that call); importing this module loads nothing.

API (``gradio_client``). ``/generate`` takes the form's fields by name and streams updates
``(video, frames_per_second, real_time_factor, chunks, drift, mp4, status)``; the first carries
no video, then one per segment, and the last the MP4 (named after the prompt); a mistake in the
form comes back as one update whose status is ``**Check the form**: ...`` (no exception).
``video`` is the stream's HLS playlist (``is_stream``); the segments it lists are MPEG-TS files
next to it::

    import httpx
    from gradio_client import Client

    client = Client("http://127.0.0.1:7860/", download_files=False)
    job = client.submit(
        prompt="a red circle moving left on a black background",
        seconds=4,  # or until_stopped=True, and stop it (below)
        seed=1,
        # start_file=gradio_client.handle_file("start.png"),  # an image or a clip to continue
        api_name="/generate",
    )
    for video, fps, rtf, chunks, drift, mp4, status in job:
        if isinstance(video, dict) and video.get("url"):
            playlist = httpx.get(video["url"]).text
            base = video["url"].rsplit("/", 1)[0]
            names = [line for line in playlist.splitlines() if line and not line.startswith("#")]
            newest_segment = httpx.get(f"{base}/{names[-1]}").content  # MPEG-TS bytes
    # mp4 (last update): {"url": ..., ...} of the whole video

While a stream runs, ``client.predict("a blue square moving up on a white background",
api_name="/change_prompt")`` changes its prompt from the next chunk,
``client.predict(2.0, "", api_name="/go_back")`` takes back its last two seconds (a prompt in
place of ``""`` goes on with that prompt) and ``client.predict(api_name="/stop")`` stops it (the last update still brings the MP4); both act
on the stream this client (its Gradio session) started. ``job.cancel()`` ends it too, and drops
its files. ``gradio_client`` sends even these through the queue, so while the queue is full call
them directly: ``httpx.post(url + "gradio_api/run/stop", json={"data": [None], "session_hash":
client.session_hash})`` (``/change_prompt``: ``"data": [new_prompt, None]``). A full queue
answers ``/generate`` with HTTP 503, which ``gradio_client`` raises as ``QueueError`` and the
page shows as "This application is currently busy".

Bounds (:class:`~vidgen.ui.settings.ServeSettings`): ``--streams`` videos stream at once and take
turns chunk by chunk for ``--concurrency`` slots (:class:`~vidgen.ui.live.Turns`); the server's
per-request limits (:class:`~vidgen.pipelines.session.RequestLimits`) are in the page's fields and
checked where sessions open; uploads and request bodies are bounded by ``--max-upload-mb``
(:class:`~vidgen.ui.http.BodySizeLimit`, HTTP 413).

Files: every file the server writes or serves lives in its own temporary folder
(:class:`~vidgen.ui.files.ServerFiles`), cleaned after ``--file-ttl`` seconds and removed when
the server stops; no request names a path.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from vidgen.pipelines.session import ModelInfo, RequestLimits, SessionBackend
from vidgen.ui.files import ServerFiles
from vidgen.ui.form import AUTO_BACKEND
from vidgen.ui.live import DRIFT_LEGEND
from vidgen.ui.settings import ServeSettings
from vidgen.validation import InputError

if TYPE_CHECKING:
    import gradio as gr

logger = logging.getLogger("vidgen.ui")

EXAMPLE_PROMPT = "a red circle moving left on a black background"
EXAMPLES = [
    # prompt, storyboard rows, seconds, until stopped
    [EXAMPLE_PROMPT, [], 8, False],
    ["a small fast blue square moving up-right on a white background", [], 8, False],
    [
        "a green triangle moving right on a gray background",
        [
            [3, "a yellow circle moving down on a gray background"],
            [6, "a large purple square on a beige background"],
        ],
        9,
        False,
    ],
]
"""Shapes World prompts, which the embedded default model was trained on."""

CSS = """
#live-video video { image-rendering: pixelated; }
"""


def _tab_closed(handlers) -> Callable[[str | None], None]:
    """``gr.State``'s delete callback as a plain function. Gradio deep-copies every component's
    settings on each ``GET /config`` (every client's first request); a bound method is copied with
    its object, here the handlers, the backend and the model's weights (0.9 s and +300 MB a request,
    measured), while a function is copied as itself."""

    def stop(session_id: str | None) -> None:
        handlers.stop_quietly(session_id)

    return stop


def build_app(
    backend: SessionBackend,
    info: ModelInfo,
    files: ServerFiles,
    settings: ServeSettings | None = None,
) -> gr.Blocks:
    """The page, wired to ``backend`` (queue set up, not launched)."""
    import gradio as gr

    from vidgen.ui.fields import raw, table
    from vidgen.ui.handlers import MAX_BACK_SECONDS, LiveHandlers, StreamSettings
    from vidgen.ui.live import Turns
    from vidgen.video import Upscale

    settings = settings or ServeSettings()
    stream = StreamSettings(
        settings.segment_seconds,
        settings.max_lead,
        Upscale(settings.upscale, settings.resample),
        # the streams (up to settings.streams) take turns for the slots chunk by chunk: a video
        # that runs until stopped does not hold a slot while others wait
        turns=Turns(settings.concurrency * settings.batch_sessions),
        time_limit=settings.max_session_seconds or None,
    )
    handlers = LiveHandlers(backend, info, files, stream)
    g, d = info.config.generation, info.config.drift
    step = g.chunk_frames
    with gr.Blocks(
        title="vidgen live",
        analytics_enabled=False,
        delete_cache=(max(int(settings.file_ttl // 10), 1), int(settings.file_ttl)),
    ) as demo:
        handlers.streams = demo.pending_streams
        session = gr.State(None, delete_callback=_tab_closed(handlers))
        gr.Markdown(
            "# vidgen live\n"
            f"A causal diffusion transformer makes the video chunk by chunk; each chunk streams out "
            f"as soon as it is decoded ({g.width}x{g.height} at {g.fps} fps by default)."
        )
        with gr.Row():
            with gr.Column(scale=1):
                prompt = gr.Textbox(label="Prompt", lines=2, value=EXAMPLE_PROMPT, elem_id="prompt")
                with gr.Accordion("Storyboard: change the prompt at given times", open=False):
                    storyboard = table(
                        gr.Dataframe(
                            headers=["start (s)", "prompt"],
                            datatype=["number", "str"],
                            type="array",
                            column_count=2,
                            row_count=1,
                            label="Storyboard",
                            elem_id="storyboard",
                        )
                    )
                with gr.Accordion("Start from an image or a video (optional)", open=False):
                    start_file = gr.File(
                        label="Image to animate, or video to continue",
                        file_types=["image", "video"],
                        type="filepath",
                        elem_id="start-file",
                    )
                with gr.Row():
                    seconds = raw(
                        gr.Number(label="Length (seconds)", value=10, minimum=0.5, maximum=g.max_seconds)
                    )
                    until_stopped = gr.Checkbox(label="Until stopped", value=False)
                with gr.Row():
                    seed = raw(gr.Number(label="Seed (-1: random)", value=-1, precision=0, minimum=-1))
                    steps = raw(gr.Slider(
                        1, min(max(16, 2 * g.num_inference_steps), info.steps_limit), g.num_inference_steps,
                        step=1, label="Steps",
                    ))  # fmt: skip
                with gr.Row():
                    m = info.size_multiple
                    height = raw(
                        gr.Number(
                            label="Height",
                            value=g.height,
                            precision=0,
                            step=m,
                            minimum=m,
                            maximum=info.max_side,
                        )
                    )
                    width = raw(
                        gr.Number(
                            label="Width",
                            value=g.width,
                            precision=0,
                            step=m,
                            minimum=m,
                            maximum=info.max_side,
                        )
                    )
                with gr.Accordion("Advanced", open=False):
                    window_frames = raw(gr.Slider(
                        0, max(4 * g.window_frames, 8 * step), g.window_frames, step=step,
                        label="Window frames (latent frames of recent context)",
                    ))  # fmt: skip
                    sink_frames = raw(gr.Slider(
                        0, max(4 * g.sink_frames, 4 * step), g.sink_frames, step=step,
                        label="Sink frames (opening latent frames always attended to)",
                    ))  # fmt: skip
                    anchor_stats = gr.Checkbox(
                        label="Anchor latent statistics (drift correction)", value=d.anchor_stats
                    )
                    recache_every = raw(
                        gr.Number(
                            label="Re-cache every N chunks (0: never)",
                            value=d.recache_every,
                            precision=0,
                            minimum=0,
                        )
                    )
                    context_noise = raw(
                        gr.Slider(0, 0.5, g.addnoise_condition, step=0.01, label="Context noise")
                    )
                    backend_choice = raw(
                        gr.Dropdown(
                            [AUTO_BACKEND, *info.attention_backends],
                            value=_initial_backend(info),
                            label="Attention backend",
                        )
                    )
                with gr.Row():
                    generate_button = gr.Button("Generate", variant="primary", elem_id="generate")
                    stop_button = gr.Button("Stop", variant="stop", elem_id="stop")
                examples = gr.Examples(
                    EXAMPLES,
                    inputs=[prompt, storyboard, seconds, until_stopped],
                    label="Examples (one click starts one)",
                    example_labels=["Red circle", "Fast blue square", "Storyboard: three scenes"],
                )
            with gr.Column(scale=1):
                video = gr.Video(
                    label="Live video",
                    streaming=True,
                    autoplay=True,
                    interactive=False,
                    height=360,
                    elem_id="live-video",
                )
                with gr.Row(equal_height=True):
                    new_prompt = gr.Textbox(
                        label="Change prompt now (applies from the next chunk)",
                        placeholder="a blue square moving up on a white background",
                        scale=4,
                        elem_id="new-prompt",
                    )
                    change_button = gr.Button("Change prompt now", scale=1, elem_id="change-prompt")
                with gr.Row(equal_height=True):
                    back_seconds = raw(
                        gr.Number(
                            label=f"Seconds to go back (at most {MAX_BACK_SECONDS:g}; a new prompt above applies from there)",
                            value=2.0,
                            scale=4,
                            elem_id="back-seconds",
                        )
                    )
                    back_button = gr.Button("Go back", scale=1, elem_id="go-back")
                status = gr.Markdown("Press Generate to start.", label="Status", elem_id="status")
                with gr.Row():
                    fps = gr.Number(label="Frames per second", value=0, interactive=False, elem_id="fps")
                    rtf = gr.Number(label="Real-time factor", value=0, interactive=False, elem_id="rtf")
                    chunks = gr.Number(
                        label="Chunks", value=0, precision=0, interactive=False, elem_id="chunks"
                    )
                drift = gr.LinePlot(
                    None,
                    x="chunk",
                    y="value",
                    color="measure",
                    title="Drift measures per chunk",
                    label="Drift",
                    elem_id="drift-plot",
                )
                gr.Markdown(DRIFT_LEGEND, elem_id="drift-legend")
                download = gr.File(label="Full video (MP4)", interactive=False, elem_id="download")

        form = [
            prompt, storyboard, seconds, until_stopped, seed, height, width, steps,
            window_frames, sink_frames, anchor_stats, recache_every, context_noise, backend_choice,
            start_file, session,
        ]  # fmt: skip
        outputs = [video, fps, rtf, chunks, drift, download, status, session]

        # Stopping the tab's previous stream runs outside the queue, so it is never stuck behind it.
        generate_button.click(
            handlers.stop,
            [session],
            [status],
            queue=False,
            api_name="stop_previous",
            api_visibility="private",
        ).then(handlers.generate, form, outputs, api_name="generate", concurrency_id="generate")
        examples.load_input_event.then(
            handlers.stop,
            [session],
            [status],
            queue=False,
            api_name="stop_for_example",
            api_visibility="private",
        ).then(
            handlers.generate,
            form,
            outputs,
            api_name="generate_example",
            api_visibility="private",
            concurrency_id="generate",
        )
        change_button.click(
            handlers.change_prompt, [new_prompt, session], [status], queue=False, api_name="change_prompt"
        )
        new_prompt.submit(
            handlers.change_prompt,
            [new_prompt, session],
            [status],
            queue=False,
            api_name="change_prompt_on_enter",
            api_visibility="private",
        )
        back_button.click(
            handlers.rewind, [back_seconds, new_prompt, session], [status], queue=False, api_name="go_back"
        )
        stop_button.click(handlers.stop, [session], [status], queue=False, api_name="stop")
    demo.queue(default_concurrency_limit=settings.streams, max_size=settings.queue_size)
    return demo


def _initial_backend(info: ModelInfo) -> str:
    """The dropdown's initial choice: the config's backend when it is usable here."""
    chosen = info.config.runtime.attention_backend
    return chosen if chosen in info.attention_backends else AUTO_BACKEND


# ------------------------------------------------------------------ serving
def open_backend(
    kind: str,
    model: str | None,
    config: str | None,
    limits: RequestLimits | None = None,
    *,
    sp: int = 1,
    sp_kind: str | None = None,
    batching: tuple[int, int] = (1, 1),
    history_mb: float = 64.0,
) -> tuple[SessionBackend, ModelInfo]:
    """Loads the model behind the page: in this process (``local``) or on Ray Serve (``ray``, each
    replica ``sp`` processes splitting every video's tokens by ``sp_kind``); ``limits``: the
    server's bounds on one request, enforced where sessions open; ``batching``: (sessions per
    batched forward, forwards at once); ``history_mb``: each session's states kept for rewinds."""
    from vidgen.pipelines import LongVideoPipeline
    from vidgen.pipelines.session import SessionManager

    sessions: SessionBackend
    if kind == "ray":
        try:
            from vidgen.serving import RaySessions  # the SessionBackend protocol, plus .info
        except ImportError as err:
            raise InputError(f"--backend ray: {err} (pip install 'vidgen[distributed]')") from None
        sessions = RaySessions.from_pretrained(
            model,
            config=config,
            limits=limits,
            sp=sp,
            sp_kind=sp_kind,
            batch_sessions=batching[0],
            batch_lanes=batching[1],
            history_mb=history_mb,
        )
    elif sp != 1:
        raise InputError(f"--sp {sp} applies to --backend ray (the local backend is one process)")
    else:
        sessions = SessionManager(
            LongVideoPipeline.from_pretrained(model, config=config),
            limits=limits,
            batch_sessions=batching[0],
            batch_lanes=batching[1],
            history_mb=history_mb,
        )
    return sessions, sessions.info


def serve(
    demo: gr.Blocks,
    host: str,
    port: int | None,
    stop: threading.Event | None = None,
    max_upload_bytes: int | None = None,
) -> None:
    """Runs ``demo`` on ``host:port`` until ``stop`` is set (or SIGINT/SIGTERM); an upload larger
    than ``max_upload_bytes``, or any request body larger than that and its form, is refused by
    the server (HTTP 413)."""
    import gradio as gr
    from starlette.middleware import Middleware

    from vidgen.ui import errors
    from vidgen.ui.http import BodySizeLimit

    errors.install()  # a refused request is one line in the log, not a traceback
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    demo.launch(
        server_name=host,
        server_port=port,
        share=False,
        quiet=True,  # Gradio's banner suggests share=True, which vidgen serve never uses; its URL is below
        prevent_thread_lock=True,
        show_error=True,
        ssr_mode=False,
        allowed_paths=[],
        max_file_size=max_upload_bytes,
        app_kwargs=(
            {"middleware": [Middleware(BodySizeLimit, max_file_bytes=max_upload_bytes)]}
            if max_upload_bytes
            else None
        ),
        theme=gr.themes.Soft(),
        css=CSS,
        # Gradio's own "is localhost reachable" probe gives up on the first reply slower than
        # 3 s and then refuses to start; on a busy CPU it fails a server that is fine
        _frontend=False,
    )
    print(f"vidgen serve: {demo.local_url}", flush=True)
    try:
        stop.wait()
    finally:
        demo.close()


def run_server(
    settings: ServeSettings,
    *,
    backend: str = "local",
    model: str | None = None,
    config: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    sp: int = 1,
    sp_kind: str | None = None,
) -> int:
    """Load the model (in this process, or on Ray Serve with ``backend="ray"``), build the page and
    serve it on ``host:port`` until interrupted (``vidgen serve``)."""
    import importlib.util

    if importlib.util.find_spec("gradio") is None:
        raise InputError("vidgen serve needs Gradio: pip install 'vidgen[ui]'")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    limits = RequestLimits(settings.max_side, settings.max_steps)
    sessions, info = open_backend(
        backend,
        model,
        config,
        limits,
        sp=sp,
        sp_kind=sp_kind,
        batching=(settings.batch_sessions, settings.concurrency),
        history_mb=settings.history_mb,
    )
    files = ServerFiles.create(settings.file_ttl)
    # Gradio reads these when it is imported (build_app imports it): its uploads, served copies
    # and scratch files then live inside the server's folder, and go with it
    os.environ["GRADIO_TEMP_DIR"] = str(files.gradio_dir)
    os.environ["GRADIO_EXAMPLES_CACHE"] = str(files.root / "examples")
    try:
        demo = build_app(sessions, info, files, settings)
        files.start_sweeping()
        serve(demo, host, port, max_upload_bytes=settings.max_upload_bytes)
    finally:
        files.cleanup()
        shutdown = getattr(sessions, "shutdown", None)  # a Ray deployment is taken down with the page
        if callable(shutdown):
            shutdown()
    return 0
