"""Which of this test session's processes listen on an address other than loopback (``ss -ltnp``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

_LOOPBACK = ("127.", "[::1]", "::1", "[::ffff:127.", "localhost")


def _our_pids() -> set[int]:
    psutil = pytest.importorskip("psutil")
    me = psutil.Process(os.getpid())
    return {me.pid} | {child.pid for child in me.children(recursive=True)}


def listeners_off_loopback() -> list[str]:
    """``ss`` lines of sockets our processes (this one, Ray's, its workers) listen on off loopback."""
    if shutil.which("ss") is None:
        pytest.skip("ss is not installed")
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    ours = _our_pids()
    bad = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        local = fields[3]
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if pids & ours and not local.startswith(_LOOPBACK):
            bad.append(line)
    return bad
