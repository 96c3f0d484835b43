"""The server's own folder: every file the page writes or serves lives under it.

One temporary folder per server (``vidgen-ui-*``), holding:

- ``runs/<random id>/``: one folder per generation (its stream segments and the final MP4);
- ``gradio/``: Gradio's upload and output cache (``GRADIO_TEMP_DIR`` points here), the only
  place Gradio serves files from.

Run folders are created by the server under names it draws itself, never from anything a request
sends; :meth:`ServerFiles.sweep` deletes those older than the time to live (the runs still
generating excepted), and :meth:`ServerFiles.cleanup` removes the whole folder when the server
stops.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path


def is_inside(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether ``path`` resolves (symlinks and ``..`` followed) to somewhere inside ``folder``."""
    try:
        resolved = Path(path).resolve()
        return resolved.is_relative_to(Path(folder).resolve())
    except (OSError, RuntimeError, ValueError):
        return False


class ServerFiles:
    """A server's folder of run folders, cleaned after ``ttl_seconds``."""

    def __init__(self, root: str | os.PathLike, ttl_seconds: float = 3600.0) -> None:
        if ttl_seconds <= 0:
            raise ValueError(f"the file time to live must be > 0 seconds, got {ttl_seconds}")
        self.root = Path(root).resolve()
        self.ttl_seconds = float(ttl_seconds)
        self.runs_dir = self.root / "runs"
        self.gradio_dir = self.root / "gradio"
        for folder in (self.runs_dir, self.gradio_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._active: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    @classmethod
    def create(cls, ttl_seconds: float = 3600.0, parent: str | os.PathLike | None = None) -> ServerFiles:
        """A fresh folder under ``parent`` (default: the system's temporary folder)."""
        return cls(tempfile.mkdtemp(prefix="vidgen-ui-", dir=parent), ttl_seconds)

    # -------------------------------------------------------------- runs
    def new_run(self) -> Path:
        """A new, empty run folder, protected from sweeping until :meth:`release`."""
        name = uuid.uuid4().hex
        folder = self.runs_dir / name
        folder.mkdir()
        with self._lock:
            self._active.add(name)
        return folder

    def release(self, folder: Path, delete: bool = False) -> None:
        """The run is over: its folder ages from now (or goes now, with ``delete``)."""
        with self._lock:
            self._active.discard(folder.name)
        if delete:
            self._remove(folder)
        elif folder.is_dir():
            os.utime(folder)

    def contains(self, path: str | os.PathLike) -> bool:
        return is_inside(path, self.root)

    def _remove(self, path: Path) -> None:
        if not self.contains(path) or path.resolve() == self.root:
            raise ValueError(f"refusing to delete {path}: it is not inside {self.root}")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    # -------------------------------------------------------------- cleaning
    def sweep(self, now: float | None = None) -> list[Path]:
        """Deletes run folders (and Gradio cache entries) untouched for the time to live."""
        now = time.time() if now is None else now
        removed = []
        with self._lock:
            active = set(self._active)
        for parent in (self.runs_dir, self.gradio_dir):
            for entry in parent.iterdir() if parent.is_dir() else ():
                if entry.name in active:
                    continue
                try:
                    age = now - _newest_mtime(entry)
                except OSError:
                    continue
                if age > self.ttl_seconds:
                    self._remove(entry)
                    removed.append(entry)
        return removed

    def start_sweeping(self, every_seconds: float | None = None) -> None:
        """Sweeps in a background thread (default: every tenth of the time to live, 1 s-10 min)."""
        interval = every_seconds or min(max(self.ttl_seconds / 10, 1.0), 600.0)

        def loop() -> None:
            while not self._stop.wait(interval):
                self.sweep()

        self._sweeper = threading.Thread(target=loop, name="vidgen-ui-sweeper", daemon=True)
        self._sweeper.start()

    def cleanup(self) -> None:
        """Stops sweeping and removes the whole folder."""
        self._stop.set()
        shutil.rmtree(self.root, ignore_errors=True)


def _newest_mtime(path: Path) -> float:
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for item in path.rglob("*"):
            with contextlib.suppress(OSError):
                newest = max(newest, item.lstat().st_mtime)
    return newest
