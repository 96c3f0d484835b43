"""Shared by the page's tests: the tiny model (in process and as a folder) and a live server."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.tiny import save_tiny_pipeline, tiny_components
from tests.ui.load import free_port, server_env
from vidgen.pipelines.session import SessionManager

SERVER_START_TIMEOUT = 120.0


@pytest.fixture(scope="session")
def tiny_sessions() -> SessionManager:
    return SessionManager(tiny_components())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return save_tiny_pipeline(tmp_path_factory.mktemp("tiny") / "pipeline")


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    tmp: Path
    """The server's TMPDIR: its own folder (``vidgen-ui-*``) is made in here."""
    log: Path

    def folder(self) -> Path:
        (folder,) = self.tmp.glob("vidgen-ui-*")
        return folder

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="session")
def server(tiny_model_dir, tmp_path_factory):
    """``vidgen serve`` on the tiny model, on a free loopback port: two streams taking turns for
    one chunk slot, a queue of one (so a fourth request finds it busy) and uploads up to 1 MB."""
    tmp = tmp_path_factory.mktemp("server")
    log = tmp / "serve.log"
    port = free_port()
    env = server_env(tmp)
    command = [sys.executable, "-m", "vidgen", "serve", "--model", str(tiny_model_dir), "--port", str(port)]
    command += ["--host", "127.0.0.1", "--concurrency", "1", "--streams", "2", "--queue-size", "1"]
    command += ["--max-upload-mb", "1"]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    running = Server(url, process, tmp, log)
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"vidgen serve exited with {process.returncode}:\n{running.output()}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"vidgen serve did not answer within {SERVER_START_TIMEOUT:.0f} s:\n{running.output()}"
                )
            time.sleep(0.5)
        yield running
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0, running.output()
    assert not list(tmp.glob("vidgen-ui-*")), "the server left its folder behind"
