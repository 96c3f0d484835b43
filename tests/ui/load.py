"""A bounded load test of the live page: ``vidgen serve`` in a subprocess on 127.0.0.1, several
``gradio_client`` clients generating short videos at once, and the server's resident memory
(RSS) measured after a warm-up round and again after every session has ended.

Run as a script to see the figures (``python -m tests.ui.load --help``); ``test_load.py`` runs it
behind the slow marker and asserts that memory comes back.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

PROMPTS = [
    "a red circle moving left on a black background",
    "a small fast blue square moving up-right on a white background",
    "a green triangle moving right on a gray background",
]


@dataclass
class LoadResult:
    clients: int
    generations: int
    """Generations per client after the warm-up round."""
    started_mb: float
    """RSS once the server answers, before any generation."""
    warm_mb: float
    """RSS after the warm-up round (one generation per client at the model's size), every session
    ended."""
    after_mb: float
    """RSS after every generation has ended."""
    seconds: float
    """Wall time of the measured rounds."""
    statuses: list[str] = field(default_factory=list)

    @property
    def growth(self) -> float:
        """``after`` over ``warm``, minus 1 (0.1: 10 % more)."""
        return self.after_mb / self.warm_mb - 1


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` and its children (Ray or ffmpeg helpers), in MB."""
    import psutil

    process = psutil.Process(pid)
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total / 2**20


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(tmp: Path) -> dict[str, str]:
    """The environment of a test server: one thread, scratch files in ``tmp``, offline, loopback."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "NO_PROXY": "127.0.0.1,localhost",
    }


def start_server(args: list[str], tmp: Path, timeout: float = 180.0) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = server_env(tmp)
    command = [sys.executable, "-m", "vidgen", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    log = open(tmp / "serve.log", "wb")  # noqa: SIM115 - the server writes it while it runs
    process = subprocess.Popen(command, env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError((tmp / "serve.log").read_text(errors="replace"))
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the server did not answer within {timeout:.0f} s")
        time.sleep(0.5)


def connect(url: str, clients: int) -> list:
    """``clients`` gradio clients (patient ones: a server busy generating answers slowly)."""
    from gradio_client import Client

    return [
        Client(url, download_files=False, verbose=False, httpx_kwargs={"timeout": 60}) for _ in range(clients)
    ]


def _round(clients: list, generations: int, seconds: float, size: int | None = None) -> list[str]:
    """Each client in its own thread makes ``generations`` videos of ``seconds`` one after another
    (the streamed segments are fetched, as a player does); the final status lines."""
    statuses: list[str] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        c = clients[k]
        for g in range(generations):
            sizes = {"height": size, "width": size} if size else {}
            job = c.submit(
                prompt=PROMPTS[(k + g) % len(PROMPTS)],
                seconds=seconds,
                seed=k * 100 + g,
                **sizes,
                api_name="/generate",
            )
            for video, *_ in job:
                if isinstance(video, dict) and video.get("url"):
                    httpx.get(video["url"], timeout=60)
            result = job.result(timeout=300)
            if isinstance(result[5], dict) and result[5].get("url"):
                httpx.get(result[5]["url"], timeout=60)  # the download, as a person would
            with lock:
                statuses.append(result[6])
            assert result[6].startswith("**Done**"), result[6]

    threads = [threading.Thread(target=client, args=(k,)) for k in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def settle(pid: int, seconds: float = 3.0) -> float:
    """RSS once the server is idle: the lowest of a few readings over ``seconds``."""
    readings = []
    for _ in range(int(seconds / 0.5)):
        time.sleep(0.5)
        readings.append(rss_mb(pid))
    return min(readings)


def run_load(
    clients: int = 3,
    generations: int = 4,
    seconds: float = 2.0,
    server_args: list[str] | None = None,
    tmp: Path | None = None,
    size: int | None = None,
) -> LoadResult:
    """Serve, warm up (one generation per client at the model's size), then ``generations`` more
    per client (at ``size`` if given); RSS after each, once every session has ended."""
    owned = None
    if tmp is None:
        owned = tempfile.TemporaryDirectory(prefix="vidgen-load-")
        tmp = Path(owned.name)
    server_args = server_args or ["--concurrency", "1", "--queue-size", str(4 * clients)]
    process, url = start_server(server_args, tmp)
    try:
        started = settle(process.pid, 1.0)
        connected = connect(url, clients)
        statuses = _round(connected, 1, seconds)
        warm = settle(process.pid)
        t0 = time.monotonic()
        statuses += _round(connected, generations, seconds, size)
        elapsed = time.monotonic() - t0
        after = settle(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        if owned is not None:
            owned.cleanup()
    return LoadResult(clients, generations, started, warm, after, elapsed, statuses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--generations", type=int, default=4, help="per client, after the warm-up")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each video")
    parser.add_argument("--size", type=int, help="height and width of each video (default: the model's)")
    parser.add_argument(
        "server_args", nargs="*", help="vidgen serve options instead of the defaults (after --)"
    )
    args = parser.parse_args()
    result = run_load(args.clients, args.generations, args.seconds, args.server_args or None, size=args.size)
    done = sum(s.startswith("**Done**") for s in result.statuses)
    print(json.dumps({**asdict(result), "statuses": f"{done}/{len(result.statuses)} done"}, indent=1))
    print(
        f"RSS: started {result.started_mb:.0f} MB, warm {result.warm_mb:.0f} MB, after {result.after_mb:.0f} MB "
        f"({result.growth:+.1%}) in {result.seconds:.0f} s"
    )


if __name__ == "__main__":
    main()
