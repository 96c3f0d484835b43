"""Atomic output files: write under a hidden temporary name in the target folder, then rename.

A process killed half way leaves only a ``.<name>.<random>.partial`` file, which no glob for
finished files (``*.mp4``, ``*.ts``) matches and which the resumable recording cleans up.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from pathlib import Path

TEMP_SUFFIX = ".partial"


def check_writable_folder(folder: Path) -> None:
    """Raises a clear error now, rather than after minutes of generation, if ``folder`` can't take files."""
    if not folder.exists():
        raise FileNotFoundError(f"cannot write into {folder}: the folder does not exist")
    if not folder.is_dir():
        raise NotADirectoryError(f"cannot write into {folder}: it is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write into {folder}: permission denied")


def make_folder(folder: str | os.PathLike) -> Path:
    """Creates ``folder`` (and parents) if needed and checks files can be written into it."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"cannot write into {folder}: it is a file, not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    check_writable_folder(folder)
    return folder


def check_output_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"cannot write a video to {path}: it is a folder, give a file name")
    check_writable_folder(path.parent)
    check_name_length(path)
    return path


# what the longest name written next to an output adds to it: the temporary ".NAME.<12 hex>.partial"
_LONGEST_SIBLING = len(".") + len(".0123456789ab") + len(TEMP_SUFFIX)


def check_name_length(path: Path) -> None:
    """``OSError`` (ENAMETOOLONG) now, not after the render, when ``path``'s name or a name written
    beside it (its temporary file, ``NAME.parts/``) is longer than the folder's filesystem allows."""
    folder = path.parent if str(path.parent) else Path(".")
    try:
        limit = os.pathconf(folder if folder.exists() else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    longest = len(os.fsencode(path.name)) + _LONGEST_SIBLING
    if longest > limit:
        raise OSError(
            36,
            f"the name {path.name[:40]}... is {len(os.fsencode(path.name))} bytes; with the files written "
            f"beside it that is more than the {limit} this filesystem allows: use at most "
            f"{limit - _LONGEST_SIBLING} bytes",
        )


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, read in blocks (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def temp_sibling(path: Path) -> Path:
    """A hidden, unique name next to ``path`` (same folder, so the final rename is atomic)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}")


def is_temp_file(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX)


def commit(temp: Path, path: Path) -> None:
    """fsyncs ``temp`` and renames it to ``path``: the final name only ever holds a whole file."""
    fd = os.open(temp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    # Make the rename itself durable; not every filesystem allows fsync on a folder.
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
