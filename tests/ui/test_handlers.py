"""The page's handlers without a server: bad input becomes a message, a stream runs, changes its
prompt, stops, and a tab that goes away frees its session and files."""

from __future__ import annotations

import gradio as gr
import pytest

from tests.ui.test_live import FakeBackend
from tests.video.conftest import flat_colour_clip
from vidgen.ui.files import ServerFiles
from vidgen.ui.handlers import LiveHandlers, StreamSettings

PROMPT = "a red circle moving left on a black background"
NEW_PROMPT = "a blue square moving up on a white background"


def form(**fields):
    """The generate handler's arguments, as the page sends them by default."""
    values = dict(
        prompt=PROMPT,
        storyboard=[[None, ""]],
        seconds=3,
        until_stopped=False,
        seed=0,
        height=64,
        width=64,
        steps=4,
        window_frames=4,
        sink_frames=2,
        anchor_stats=True,
        recache_every=0,
        context_noise=0.0,
        attention_backend="auto",
        session_id=None,
    )
    values.update(fields)
    return values


@pytest.fixture
def files(tmp_path):
    server = ServerFiles.create(ttl_seconds=60, parent=tmp_path)
    yield server
    server.cleanup()


@pytest.fixture
def handlers(tiny_sessions, files):
    return LiveHandlers(tiny_sessions, tiny_sessions.info, files, StreamSettings(max_lead=0))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": ""}, "the prompt is empty"),
        ({"storyboard": [[3, "b"], [1, "c"]]}, "row 2 starts at 1 s, not after row 1"),
        ({"storyboard": [["later", "b"]]}, "row 1: start 'later' is not a time"),
        ({"height": 100}, "height must be a positive multiple of 8"),
        ({"window_frames": 3}, "multiple of chunk_frames"),
    ],
)
def test_bad_input_is_a_message_not_a_crash(handlers, tiny_sessions, fields, message, caplog):
    """One message in the status line; the video, figures, plot and download keep what they show
    (no "Error" on each of them), and the server log gets nothing."""
    updates = list(handlers.generate(**form(**fields)))
    assert len(updates) == 1
    *panels, status, session = updates[0]
    assert status.startswith("**Check the form**: ") and message in status
    assert all(panel == gr.skip() for panel in panels) and session == gr.skip()
    assert not caplog.records
    assert tiny_sessions.active == 0 and not list(handlers.files.runs_dir.iterdir())


def test_a_stream_from_start_to_mp4(handlers, tiny_sessions, files):
    updates = list(handlers.generate(**form(seconds=3)))
    first, *segments, last = updates
    video, fps, rtf, chunks, drift, download, status, session_id = first
    assert session_id and status == "Starting..." and download is None and chunks == 0
    assert len(segments) >= 2 and all(u[-1] == session_id for u in updates)
    assert all(str(u[0]).endswith(".ts") for u in segments)
    video, fps, rtf, chunks, drift, download, status, _ = last
    # named after the prompt, as vidgen render names its file
    assert download.endswith("/a-red-circle-moving-left-on-a-black-background.mp4") and files.contains(
        download
    )
    assert status.startswith("**Done**: 3.0 s of video") and chunks == 7 and fps > 0 and rtf > 0
    assert status.endswith("seed 0. Download the MP4 below.")
    assert set(drift["measure"]) == {"colour drift", "motion", "repetition"}
    assert drift["chunk"].max() == 6
    assert tiny_sessions.active == 0 and not handlers.running(session_id)


def test_prompt_change_and_stop_while_streaming(handlers, tiny_sessions):
    assert "Nothing is being generated" in handlers.change_prompt(NEW_PROMPT, None)
    stream = handlers.generate(**form(until_stopped=True))
    session_id = next(stream)[-1]
    assert handlers.running(session_id)
    assert "Type the new prompt" in handlers.change_prompt("  ", session_id)
    assert NEW_PROMPT in handlers.change_prompt(NEW_PROMPT, session_id)
    statuses = [next(stream)[6] for _ in range(3)]
    assert NEW_PROMPT in statuses[-1]  # applied from the next chunk
    assert handlers.stop(session_id).startswith("Stopping")
    rest = list(stream)
    assert rest[-1][6].startswith("**Stopped**") and rest[-1][5].endswith("background.mp4")
    assert tiny_sessions.active == 0 and not handlers.running(session_id)
    assert "Nothing is being generated" in handlers.change_prompt(NEW_PROMPT, session_id)


def test_going_back_while_streaming(handlers, tiny_sessions):
    """ "Go back": refused without a stream or with seconds out of range (a message, no change),
    else the status says where the video now stands and lists the branch's prompts; the next
    updates count the branch's seconds."""
    assert "Nothing is being generated" in handlers.rewind(2.0, "", None)
    stream = handlers.generate(**form(until_stopped=True))
    session_id = next(stream)[-1]
    statuses = [next(stream)[6] for _ in range(4)]  # four 1-s segments
    for bad in (None, 0, -1.0, float("nan"), 10.5, True):
        assert handlers.rewind(bad, "", session_id).startswith("**Check the form**"), bad
    status = handlers.rewind(2.0, NEW_PROMPT, session_id)
    at = float(status.split("Went back to **")[1].split(" s")[0])
    before = float(statuses[-1].split("**Streaming** ")[1].split(" s")[0])
    assert 0 < at <= before - 2.0 + 1e-6 and f"0.0 s *{PROMPT}*; {at:.1f} s *{NEW_PROMPT}*" in status
    after = next(stream)[6]
    seconds = float(after.split("**Streaming** ")[1].split(" s")[0])
    assert seconds < before  # the branch's length
    handlers.stop(session_id)
    assert list(stream)[-1][6].startswith("**Stopped**")


def test_a_tab_that_goes_away_frees_its_session_and_files(handlers, tiny_sessions, files):
    stream = handlers.generate(**form(until_stopped=True))
    session_id = next(stream)[-1]
    next(stream)
    assert tiny_sessions.active == 1 and len(list(files.runs_dir.iterdir())) == 1
    stream.close()  # Gradio closes the generator of a client that disconnected
    assert tiny_sessions.active == 0 and not handlers.running(session_id)
    assert not list(files.runs_dir.iterdir())
    # the same through gr.State's delete callback, before the first segment
    stream = handlers.generate(**form(until_stopped=True))
    session_id = next(stream)[-1]
    handlers.stop_quietly(session_id)
    assert list(stream)[-1][6].startswith("**Stopped**") and tiny_sessions.active == 0


def test_errors_inside_generation_become_messages(files):
    backend = FakeBackend(flat_colour_clip(64), fail_at=2)
    handlers = LiveHandlers(backend, _info(), files, StreamSettings(max_lead=0))
    with pytest.raises(gr.Error, match="the model cannot do that"):
        list(handlers.generate(**form()))
    assert backend.stopped and not list(files.runs_dir.iterdir())


def test_late_storyboard_rows_warn(handlers):
    with pytest.warns(UserWarning, match="after the video ends"):
        next(handlers.generate(**form(seconds=2, storyboard=[[5, NEW_PROMPT]])))


def test_prompts_and_sizes_the_default_model_does_not_know_warn(handlers):
    with pytest.warns(UserWarning) as caught:
        next(handlers.generate(**form(prompt="a cat playing the piano, cinematic", height=32, width=32)))
    messages = [str(w.message) for w in caught]
    assert any("does not know 'cat', 'playing', 'piano', 'cinematic'" in m for m in messages), messages
    assert any("trained at 64x64 (WxH), not 32x32" in m for m in messages), messages


def test_upscaled_player_and_download(tiny_sessions, files):
    from vidgen.video import Upscale, read_video

    settings = StreamSettings(max_lead=0, upscale=Upscale(3))
    handlers = LiveHandlers(tiny_sessions, tiny_sessions.info, files, settings)
    segments = []
    for update in handlers.generate(**form(seconds=1)):
        if isinstance(update[0], str):  # a segment is read before the next update deletes it
            segments.append(read_video(update[0])[0])
    video, _ = read_video(update[5])
    assert segments and all(s.shape[1:3] == (192, 192) for s in segments)
    assert video.shape == (16, 192, 192, 3)


def _info():
    from tests.tiny import tiny_components
    from vidgen.pipelines.session import ModelInfo

    return ModelInfo.from_pipeline(tiny_components())


def test_an_uploaded_clip_opens_the_video(handlers, tmp_path):
    import numpy as np

    from vidgen.video import read_video, write_mp4

    clip = tmp_path / "clip.mp4"
    write_mp4(clip, (np.random.default_rng(0).random((9, 64, 64, 3)) * 255).astype(np.uint8), fps=16)
    *_, last = handlers.generate(**form(seconds=1, start_file=str(clip)))
    download = last[5]
    assert len(read_video(download)[0]) == 9 + 16  # the clip, then a second


def test_a_tabs_finished_streams_are_dropped_when_it_starts_another(handlers):
    """Gradio keeps every segment of a run in memory until the tab closes (never, for an API
    client); a new video of the same tab drops the runs that have ended, and only those."""

    class Stream:
        def __init__(self, ended: bool) -> None:
            self.ended = ended

    handlers.streams = {
        "tab": {"old": {1: Stream(True)}, "playing": {1: Stream(False)}},
        "other": {"old": {1: Stream(True)}},
    }
    assert handlers.drop_finished_streams("tab") == 1
    assert list(handlers.streams["tab"]) == ["playing"] and list(handlers.streams["other"]) == ["old"]
    assert handlers.drop_finished_streams(None) == 0 and handlers.drop_finished_streams("gone") == 0


def test_the_heap_is_trimmed_when_the_last_video_ends(handlers, monkeypatch):
    import threading

    import vidgen.ui.handlers as module

    trims = []

    def fake_trim() -> bool:
        # the trim as the video ends runs in its thread; the one again later in a timer's
        # (other handlers' timers may fire in this test too: they are not counted)
        if threading.current_thread() is threading.main_thread():
            trims.append(len(handlers._stops))
        return True

    monkeypatch.setattr(module, "trim_heap", fake_trim)
    updates = list(handlers.generate(**form(seconds=1)))
    assert updates[-1][6].startswith("**Done**") and trims == [0]  # once, with no stream left
    with handlers._lock:
        handlers._stops["another tab"] = None  # a video still playing: not yet
    list(handlers.generate(**form(seconds=1)))
    assert trims == [0]


def test_trim_heap_hands_freed_memory_back_on_glibc():
    import ctypes
    import subprocess
    import sys

    try:
        ctypes.CDLL("libc.so.6").malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        pytest.skip("not glibc")
    # a fresh interpreter: in the suite's own process the heap earlier tests left decides where the
    # blocks land (old holes, already handed back or not), and the freed memory varied from run to run
    check = """
import psutil
from vidgen.pipelines.memory import trim_heap
process = psutil.Process()
blocks = [bytes(4000) + bytes([k % 256]) for k in range(50_000)]  # ~200 MB of heap, not mmap
pinned = blocks[63::64]  # the freed runs lie between live blocks, where free() returns nothing
del blocks
held = process.memory_info().rss
trimmed = trim_heap()
print(trimmed, held - process.memory_info().rss, pinned[-1][-1] == (63 + 64 * (len(pinned) - 1)) % 256)
"""
    out = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120, check=True
    )
    trimmed, freed, intact = out.stdout.split()
    assert trimmed == "True"
    assert int(freed) > 100 * 2**20  # of the ~196 MB freed between the pins
    assert intact == "True"
