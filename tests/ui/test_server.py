"""``vidgen serve`` in a subprocess, driven through its API with ``gradio_client``: streamed
segments that decode, a full queue, prompt change and stop, cancellation, path safety."""

from __future__ import annotations

import json
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


def _png_header(path, width: int, height: int) -> None:
    """A small PNG whose header claims ``width`` x ``height`` pixels (a decoder would allocate them)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def test_a_start_image_too_large_to_decode_ends_the_job_with_a_status(server, tmp_path):
    """A 9500x9500 PNG under the upload limit used to be decoded whole; refused from its header,
    the job ends with the form's one-line status, which the client receives."""
    image = tmp_path / "huge.png"
    _png_header(image, 9500, 9500)
    started = time.monotonic()
    status = client(server).predict(
        prompt=PROMPT, seconds=1, start_file=gradio_client.handle_file(str(image)), api_name="/generate"
    )[6]
    assert status.startswith("**Check the form**") and "more than the 50,000,000" in status, status
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (dict(seconds=-1), "seconds must be above 0"),
        (dict(seconds=1e308), "seconds must be above 0 and at most"),
        (dict(seed=-5), "seed must be at least -1"),
        (dict(seed=2.5), "seed must be a whole number"),
        (dict(steps=0), "steps must be at least 1"),
        (dict(steps=1000), "steps must be at most"),
        (dict(height=100000), "height must be at most"),
        (dict(width=-100000), "width must be a positive multiple"),
        (dict(window_frames=1e9), "Cannot generate this**: a 64x64 video needs about"),
        (dict(context_noise=5), "addnoise_condition"),
        (dict(recache_every=-3), "re-cache every must be at least 0"),
        (dict(attention_backend="../../etc"), "attention backend '../../etc' cannot run here"),
        (
            dict(storyboard={"headers": ["start", "prompt"], "data": [["zzz", "a blue square"]]}),
            "storyboard row 1: start 'zzz' is not a time",
        ),
    ],
)
def test_values_out_of_range_through_the_api_are_a_check_the_form_status(server, values, message):
    """What the page's fields would not let a person type, sent through the API: the client gets
    the page's own "Check the form" status naming the field, as a person would, not Gradio's error."""
    *_, status = client(server).predict(prompt=PROMPT, **values, api_name="/generate")
    assert status.startswith(("**Check the form**", "**Cannot generate this**")) and message in status, status


def test_a_nan_sent_as_json_is_refused_not_read_as_the_default(server):
    """``NaN`` is valid to Python's JSON reader (gradio_client will not send it; a raw client can):
    the form refuses it rather than making the default 10-s video."""
    data = [PROMPT, None, "NaN", False, 1, None, None, None, None, None, None, None, None, "auto", None, None]
    text = json.dumps({"data": data}).replace('"NaN"', "NaN")
    response = httpx.post(
        f"{server.url}gradio_api/call/generate", content=text, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    events = httpx.get(f"{server.url}gradio_api/call/generate/{response.json()['event_id']}", timeout=30).text
    assert "seconds must be a finite number, got nan" in events, events


def test_refused_requests_are_one_line_each_in_the_log(server):
    """Payloads Gradio itself refuses (a storyboard that is not a table) reach the client as its
    error and the server log as one line each naming the endpoint: no tracebacks a client could
    flood the log with."""
    c = client(server)
    before = server.output()
    for bad in ("zzz", 5, "[[1]]"):
        with pytest.raises(gradio_client.exceptions.AppError):
            c.predict(prompt=PROMPT, storyboard=bad, api_name="/generate")
    wait_for(lambda: server.output().count("refused a request") - before.count("refused a request") >= 3,
             what="three log lines")  # fmt: skip
    new = server.output()[len(before) :]
    assert "Traceback" not in new, new
    lines = [line for line in new.splitlines() if "refused a request" in line]
    assert len(lines) == 3 and all("generate" in line for line in lines), lines


def test_full_queue_busy_then_change_prompt_and_stop(server):
    a, b, c, d = client(server), client(server), client(server), client(server)
    playing = a.submit(prompt=PROMPT, until_stopped=True, seed=1, api_name="/generate")
    wait_for(lambda: len(playing.outputs()) >= 2, what="the first segment")
    also = b.submit(prompt=PROMPT, until_stopped=True, seed=2, api_name="/generate")  # streams 2
    wait_for(lambda: len(also.outputs()) >= 2, what="the second stream's first segment")
    waiting = c.submit(prompt=PROMPT, seconds=1, api_name="/generate")  # the streams are taken: it waits
    wait_for(lambda: waiting.status().code.name == "IN_QUEUE", what="the third request to queue")
    with pytest.raises(Exception, match="(?i)queue is full"):
        d.predict(prompt=PROMPT, seconds=1, api_name="/generate")  # queue size 1: busy

    assert NEW_PROMPT in run_outside_queue(server, "change_prompt", a, NEW_PROMPT)
    wait_for(lambda: NEW_PROMPT in (playing.outputs()[-1][6] or ""), what="the new prompt to show")
    assert run_outside_queue(server, "stop", a).startswith("Stopping")
    result = playing.result(timeout=30)
    assert result[6].startswith("**Stopped**") and result[5]["url"].endswith("background.mp4")
    assert waiting.result(timeout=60)[6].startswith("**Done**: 1.0 s")
    assert run_outside_queue(server, "stop", b).startswith("Stopping")
    assert also.result(timeout=30)[6].startswith("**Stopped**")


def test_a_video_until_stopped_does_not_starve_the_next(server):
    """One chunk slot: a video that runs until stopped and one asked for after it take turns, so
    the second starts streaming at once and ends while the first goes on."""
    a, b = client(server), client(server)
    endless = a.submit(prompt=PROMPT, until_stopped=True, seed=1, api_name="/generate")
    wait_for(lambda: len(endless.outputs()) >= 3, what="the first video to stream")
    asked = time.monotonic()
    short = b.submit(prompt=NEW_PROMPT, seconds=2, seed=2, api_name="/generate")
    wait_for(
        lambda: any(isinstance(o[0], dict) and o[0].get("url") for o in short.outputs()),
        timeout=30,
        what="the second video's first segment",
    )
    first_frames = time.monotonic() - asked
    assert short.result(timeout=60)[6].startswith("**Done**: 2.0 s")
    # the first went on streaming: not ended to make room, and still making segments
    done_at = len(endless.outputs())
    assert not endless.done()
    wait_for(lambda: len(endless.outputs()) > done_at, timeout=30, what="the first video to go on")
    assert run_outside_queue(server, "stop", a).startswith("Stopping")
    assert endless.result(timeout=30)[6].startswith("**Stopped**")
    print(f"second client's first segment after {first_frames:.1f} s")


def test_uploads_beyond_the_limit_are_refused_with_a_message(server):
    upload = f"{server.url}gradio_api/upload"

    def post(*sizes: int) -> httpx.Response:
        files = [("files", (f"f{k}.png", b"\0" * size)) for k, size in enumerate(sizes)]
        return httpx.post(upload, files=files, timeout=30)

    small = post(500_000)
    assert small.status_code == 200 and len(small.json()) == 1
    # one file over 1 MB: refused before it is read
    big = post(1_500_000)
    assert big.status_code == 413 and "accepts files of up to 1 MB" in big.json()["detail"]
    # just over 1 MB: the request is small enough, the file is not (Gradio's own check)
    over = post(1_000_001)
    assert over.status_code == 413 and "maximum allowed size of 1000000 bytes" in over.text
    # many files under the limit, together over it
    assert post(600_000, 600_000).status_code == 413
    # the same limit for any request body, a JSON one too
    join = httpx.post(f"{server.url}gradio_api/queue/join", content=b"x" * 1_200_000, timeout=30)
    assert join.status_code == 413
    # gradio_client reads the limit from the page's config and refuses before sending
    big_file = server.tmp / "big.png"
    big_file.write_bytes(b"\0" * 1_500_000)
    with pytest.raises(Exception, match="exceeds the maximum file size of 1000000 bytes"):
        client(server).predict(
            prompt=PROMPT,
            seconds=1,
            start_file=gradio_client.handle_file(str(big_file)),
            api_name="/generate",
        )


def _raw_post(server, path: str, headers: list[str], body_parts, timeout: float = 20.0) -> str:
    """POST over a plain socket (what an HTTP client would not send: chunked or lying bodies);
    returns the response's status line. Sending stops when the server closes the connection."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(server.url)
    head = "\r\n".join([f"POST {path} HTTP/1.1", f"Host: {url.hostname}:{url.port}", *headers, "", ""])
    with socket.create_connection((url.hostname, url.port), timeout=timeout) as sock:
        try:
            sock.sendall(head.encode())
            for part in body_parts:
                sock.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the body was all sent
        response = b""
        try:
            while b"\r\n" not in response:
                data = sock.recv(65536)
                if not data:
                    break
                response += data
        except ConnectionResetError:
            pass
    return response.split(b"\r\n", 1)[0].decode(errors="replace")


def _form(size: int) -> tuple[str, bytes]:
    boundary = "vidgenboundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="a.png"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + b"\0" * size
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return f"Content-Type: multipart/form-data; boundary={boundary}", body


def test_bodies_are_counted_as_they_arrive_whatever_their_length_says(server):
    """The body limit counts bytes as they come: a 3 MB upload sent chunked (no Content-Length)
    against the 1 MB limit is 413, not a 500; one whose Content-Length says 100 is refused, not
    cut at 100 bytes and accepted; a small chunked upload still goes through."""
    path = "/gradio_api/upload"
    content_type, big = _form(3_000_000)

    def chunked(body: bytes):
        for k in range(0, len(body), 65536):
            piece = body[k : k + 65536]
            yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        yield b"0\r\n\r\n"

    status = _raw_post(
        server, path, [content_type, "Transfer-Encoding: chunked", "Connection: close"], chunked(big)
    )
    assert " 413 " in status, status
    status = _raw_post(server, path, [content_type, "Content-Length: 100", "Connection: close"], [big])
    assert " 400 " in status, status
    _, small = _form(1000)
    status = _raw_post(
        server, path, [content_type, "Transfer-Encoding: chunked", "Connection: close"], chunked(small)
    )
    assert " 200 " in status, status
    assert httpx.get(server.url, timeout=10).status_code == 200  # and the server goes on


def test_a_request_beyond_the_servers_limits_is_refused(server):
    """The page's fields carry the server's limits (twice the tiny model's 64x64 and 4 steps) for
    the browser; the form checks them for every client (a "Check the form" status naming the limit)
    and ``SessionManager.open`` checks again."""
    c = client(server)
    status = c.predict(prompt=PROMPT, height=2048, width=2048, api_name="/generate")[-1]
    assert status.startswith("**Check the form**") and "height must be at most 128 on this server" in status
    status = c.predict(prompt=PROMPT, steps=17, api_name="/generate")[-1]
    assert status.startswith("**Check the form**") and "steps must be at most 16 on this server" in status
    assert c.predict(prompt=PROMPT, seconds=1, height=128, steps=16, api_name="/generate")[6].startswith(
        "**Done**"
    )


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


def test_twelve_clients_at_once_cost_neither_time_nor_memory(server):
    """Every ``gradio_client.Client()`` first fetches ``/config``, which Gradio deep-copies: the page
    held the model there (six clients at once timed out and RSS doubled, measured on the default
    model). Twelve clients connect at once, each within seconds, and the server's memory stays."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.ui.load import rss_mb

    before = rss_mb(server.process.pid)
    started = time.monotonic()
    with ThreadPoolExecutor(12) as pool:
        clients = list(pool.map(lambda _: client(server), range(12)))
    elapsed = time.monotonic() - started
    assert len(clients) == 12 and all(c.session_hash for c in clients)
    assert elapsed < 30, f"{elapsed:.1f} s for 12 clients"
    assert rss_mb(server.process.pid) - before < 200, "the page's config copies no model"
