"""``vidgen serve`` in a subprocess, driven through its API with ``gradio_client``: streamed
segments that decode, a full queue, prompt change and stop, cancellation, path safety."""

from __future__ import annotations

import time

import httpx
import pytest

from vidgen.video import read_video

gradio_client = pytest.importorskip("gradio_client")

PROMPT = "a red circle moving left on a black background"
NEW_PROMPT = "a blue square moving up on a white background"


def client(server):
    return gradio_client.Client(server.url, download_files=False, verbose=False)


def newest_segment(video: dict) -> bytes:
    """The newest MPEG-TS segment of a streamed update (its ``url`` is the HLS playlist)."""
    playlist = httpx.get(video["url"], timeout=10).text
    names = [line for line in playlist.splitlines() if line and not line.startswith("#")]
    return httpx.get(f"{video['url'].rsplit('/', 1)[0]}/{names[-1]}", timeout=10).content


def wait_for(condition, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def run_outside_queue(server, api_name: str, c, *data):
    """Calls a ``queue=False`` endpoint directly for client ``c``'s session (works with a full queue)."""
    body = {"data": [*data, None], "session_hash": c.session_hash}  # None: the session's gr.State
    response = httpx.post(f"{server.url}gradio_api/run/{api_name}", json=body, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["data"][0]


def test_api_streams_segments_that_decode(server):
    job = client(server).submit(prompt=PROMPT, seconds=4, seed=3, api_name="/generate")
    frames = []
    for video, fps, rtf, chunks, _drift, _mp4, status, *_ in job:
        if isinstance(video, dict) and video.get("url"):
            assert video["is_stream"] and status.startswith("**Streaming**") and chunks > 0
            assert fps > 0 and rtf > 0
            segment, segment_fps = read_video(newest_segment(video))
            assert segment.shape == (16, 64, 64, 3) and segment_fps == 16
            frames.append(segment)
    assert len(frames) >= 3
    *_, mp4, status = job.result(timeout=30)[:7]
    assert status.startswith("**Done**: 4.0 s of video")
    video, fps = read_video(httpx.get(mp4["url"], timeout=10).content)
    assert video.shape == (64, 64, 64, 3) and fps == 16
    # what was played is what is downloaded (up to the H.264 round trips)
    first = video[: len(frames[0])].astype(int)
    assert abs(first - frames[0].astype(int)).mean() < 8


def test_no_request_reads_outside_the_served_folder(server, tiny_model_dir):
    runs = server.folder() / "runs"
    wait_for(lambda: any(runs.glob("*/*.mp4")), what="a finished run")
    inside_but_private = next(runs.glob("*/*.mp4"))
    for path in ("/etc/passwd", str(tiny_model_dir / "model_index.json"), str(inside_but_private)):
        for url in (f"{server.url}gradio_api/file={path}", f"{server.url}file={path}"):
            assert httpx.get(url, timeout=10).status_code in (403, 404), url
    traversal = f"{server.url}gradio_api/file={server.folder()}/gradio/../runs/{inside_but_private.parent.name}/{inside_but_private.name}"
    assert httpx.get(traversal, timeout=10).status_code in (403, 404)


def test_bad_input_is_reported_and_the_server_keeps_serving(server):
    c = client(server)
    assert "the prompt is empty" in c.predict(prompt="  ", api_name="/generate")[6]
    status = c.predict(
        prompt=PROMPT,
        storyboard={"headers": ["start (s)", "prompt"], "data": [[2, "a"], [1, "b"]]},
        api_name="/generate",
    )[6]
    assert status.startswith("**Check the form**") and "row 2 starts at 1 s, not after row 1" in status
    assert (
        "height must be a positive multiple of 8"
        in c.predict(prompt=PROMPT, height=50, api_name="/generate")[6]
    )
    assert c.predict(prompt=PROMPT, seconds=1, api_name="/generate")[6].startswith("**Done**")


def test_full_queue_busy_then_change_prompt_and_stop(server):
    a, b, c = client(server), client(server), client(server)
    playing = a.submit(prompt=PROMPT, until_stopped=True, seed=1, api_name="/generate")
    wait_for(lambda: len(playing.outputs()) >= 2, what="the first segment")
    waiting = b.submit(prompt=PROMPT, seconds=1, api_name="/generate")  # concurrency 1: it waits
    wait_for(lambda: waiting.status().code.name == "IN_QUEUE", what="the second request to queue")
    with pytest.raises(Exception, match="(?i)queue is full"):
        c.predict(prompt=PROMPT, seconds=1, api_name="/generate")  # queue size 1: busy

    assert NEW_PROMPT in run_outside_queue(server, "change_prompt", a, NEW_PROMPT)
    wait_for(lambda: NEW_PROMPT in (playing.outputs()[-1][6] or ""), what="the new prompt to show")
    assert run_outside_queue(server, "stop", a).startswith("Stopping")
    result = playing.result(timeout=30)
    assert result[6].startswith("**Stopped**") and result[5]["url"].endswith("background.mp4")
    assert waiting.result(timeout=30)[6].startswith("**Done**: 1.0 s")


def test_a_cancelled_client_frees_its_run(server):
    runs = server.folder() / "runs"
    before = set(runs.iterdir())
    job = client(server).submit(prompt=PROMPT, until_stopped=True, api_name="/generate")
    wait_for(lambda: len(job.outputs()) >= 2, what="the first segment")
    (running,) = set(runs.iterdir()) - before
    job.cancel()
    wait_for(lambda: not running.exists(), timeout=20, what="the cancelled run's folder to go")
    assert set(runs.iterdir()) == before


def test_an_uploaded_clip_is_continued(server, tmp_path):
    import numpy as np

    from vidgen.video import write_mp4

    clip = tmp_path / "clip.mp4"
    write_mp4(clip, (np.random.default_rng(0).random((9, 64, 64, 3)) * 255).astype(np.uint8), fps=16)
    start = gradio_client.handle_file(str(clip))
    result = client(server).predict(prompt=PROMPT, seconds=1, start_file=start, api_name="/generate")
    assert result[6].startswith("**Done**")
    mp4 = httpx.get(result[5]["url"], timeout=10).content
    assert len(read_video(mp4)[0]) == 9 + 16  # the clip, then a second


def test_the_log_has_our_address_and_no_share_hint(server):
    """``vidgen serve`` cannot share a public link, so Gradio's "set share=True" hint is not shown."""
    output = server.output()
    assert f"vidgen serve: {server.url.rstrip('/')}" in output
    assert "share=True" not in output and "public link" not in output
