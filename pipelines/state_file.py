"""The resume file: what :meth:`VideoRun.save <vidgen.pipelines.run.VideoRun.save>` writes after
each chunk and :meth:`~vidgen.pipelines.run.VideoRun.load` takes up, as one safetensors file.

Its header's metadata holds the format, the settings the state must agree with, and a SHA-256 of
every tensor (names, dtypes, shapes and bytes, in name order), checked on reading: a file torn by a
crash, a flipped bit, or a file that is not a vidgen state is :class:`StateFileError`, never a
state silently taken up. Written to a temporary name and renamed, so the path only ever holds a
whole file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from vidgen.validation import InputError
from vidgen.video.atomic import file_digest

__all__ = ["STATE_FORMAT", "StateFileError", "file_digest", "read_state", "saved_chunk", "write_state"]

STATE_FORMAT = "vidgen-run-state-1"
"""The ``format`` entry of a state file's metadata (files without a digest are still read)."""


class StateFileError(InputError):
    """The file at a state path is not a whole vidgen generation state."""


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the tensors' names, dtypes, shapes and bytes, in name order (hex)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def write_state(
    path: str | os.PathLike, tensors: dict[str, torch.Tensor], settings: dict, **extra: str
) -> None:
    """Write a state file (temporary name, then rename) with its format, settings and digest
    (``extra``: more metadata entries, such as the digest of a file the state refers to)."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    metadata = {
        **extra,
        "format": STATE_FORMAT,
        "settings": json.dumps(settings),
        "sha256": tensors_digest(tensors),
    }
    tmp = Path(f"{os.fspath(path)}.tmp")
    try:
        save_file(tensors, os.fspath(tmp), metadata=metadata)
    except SafetensorError as err:  # safetensors reports a refused write as its own error
        code = re.search(r"os error (\d+)", str(err))
        if code is None:
            raise
        tmp.unlink(missing_ok=True)
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), os.fspath(tmp)) from None
    os.replace(tmp, path)


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The metadata of the state file at ``path``, or :class:`StateFileError` if it is not one."""
    check_state_path(path)
    try:
        with safe_open(os.fspath(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise StateFileError(f"{path} is not a whole generation state ({_first_line(err)})") from None
    if meta.get("format") != STATE_FORMAT:
        raise StateFileError(
            f"{path} is not a generation state this vidgen can resume (format {meta.get('format')!r})"
        )
    return meta


def read_state(
    path: str | os.PathLike, device: str = "cpu"
) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """``(metadata, tensors)`` of the state file at ``path``, its digest checked."""
    meta = read_metadata(path)
    try:
        tensors = load_file(os.fspath(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise StateFileError(f"{path} is not a whole generation state ({_first_line(err)})") from None
    if "sha256" in meta and tensors_digest(tensors) != meta["sha256"]:
        raise StateFileError(f"{path} is damaged: its tensors do not match the checksum saved with them")
    return meta, {k: v.to(device) for k, v in tensors.items()}


def check_state_path(path: str | os.PathLike) -> None:
    """:class:`InputError` for a state path that holds something other than a file (a folder, a
    device, a FIFO): it is neither read nor overwritten."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise InputError(f"state_path {path} cannot be used: {err.strerror}") from None
    if not stat.S_ISREG(mode):
        raise InputError(f"state_path {path} is not a file (a folder, a device or a FIFO): give a file path")


def check_overwritable(path: str | os.PathLike) -> None:
    """:class:`InputError` unless ``path`` is free or holds a vidgen state (a whole one or a damaged
    one whose header still says so): a state path never overwrites someone's other file."""
    check_state_path(path)
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return
    try:
        read_metadata(path)
    except StateFileError:
        raise InputError(
            f"state_path {path} holds a file that is not a vidgen generation state: "
            "choose another path (it is not overwritten)"
        ) from None


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0][:200]


def saved_chunk(path: str | os.PathLike) -> int | None:
    """The chunk after which the state at ``path`` was saved, or None when there is no whole,
    undamaged state there (missing, torn, a flipped bit, not a vidgen state)."""
    if not os.path.isfile(path):
        return None
    try:
        _, tensors = read_state(path)
        return int(tensors["extra.chunk_index"][0])
    except (StateFileError, KeyError, IndexError):
        return None
