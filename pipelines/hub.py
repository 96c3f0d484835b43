"""Hugging Face Hub ids where paths are typed: ``--model``, ``--transformer``, ``--lora`` and
``from_pretrained`` take ``owner/name`` (a repository) or ``owner/name/path/in/repo`` (one file of it)
as diffusers does, fetched with ``huggingface_hub`` into its cache.

``HF_HUB_OFFLINE=1`` (or no network) is honoured: what is cached is used and nothing is fetched;
what is not cached fails in one line (:class:`HubError`, exit status 2 from the CLI) naming the
command that downloads it. ``HF_HUB_CACHE`` / ``HF_HOME`` are read when a model is loaded, not at
import. A published ``.pt`` training checkpoint is converted once (``vidgen convert``'s code, read
with ``weights_only=True``) into a safetensors transformer folder in the cache, beside the hub's
folders, and loaded from there afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from vidgen.validation import InputError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(/[^:]+)?$")


class HubError(InputError):
    """A hub id that cannot be resolved (not cached while offline, no such repository or file)."""


def hub_reference(text: str | os.PathLike) -> tuple[str, str | None] | None:
    """``(repo_id, file or None)`` when ``text`` is no local path and reads as a hub id:
    ``owner/name`` or ``owner/name/path/in/repo``; None otherwise."""
    text = os.fspath(text)
    if not text or Path(text).expanduser().exists() or text.startswith(("/", ".", "~")):
        return None
    if not _HUB_ID.match(text):
        return None
    owner, name, *rest = text.split("/")
    return f"{owner}/{name}", "/".join(rest) or None


def cache_dir() -> Path:
    """The hub cache as the environment says now: ``HF_HUB_CACHE``, else ``HF_HOME/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")).expanduser()
    return home / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _missing(repo_id: str, filename: str | None, err: Exception) -> HubError:
    what = f"{repo_id}/{filename}" if filename else repo_id
    fetch = f"hf download {repo_id}" + (f" {filename}" if filename else "")
    why = (
        "downloads are off (HF_HUB_OFFLINE=1)"
        if offline()
        else f"it could not be fetched ({type(err).__name__})"
    )
    return HubError(
        f"{what} is not in the Hugging Face cache {cache_dir()} and {why}: run `{fetch}` where there "
        f"is internet (with HF_HUB_CACHE={cache_dir()}), or pass a local path"
    )


def fetch_file(repo_id: str, filename: str) -> Path:
    """One file of a model repository, from the cache or fetched into it."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, filename, cache_dir=cache_dir(), local_files_only=offline()))
    except Exception as err:  # huggingface_hub's not-cached / not-found / network errors alike
        raise _missing(repo_id, filename, err) from None


def fetch_folder(repo_id: str, ignore_patterns: list[str] | None = None) -> Path:
    """A model repository's snapshot folder, from the cache or fetched into it (``ignore_patterns``:
    files not needed, e.g. a transformer that another checkpoint replaces)."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo_id, cache_dir=cache_dir(), local_files_only=offline(), ignore_patterns=ignore_patterns
        )
    except Exception as err:
        raise _missing(repo_id, None, err) from None
    return Path(folder)


def resolve(text: str | os.PathLike, ignore_patterns: list[str] | None = None) -> Path:
    """A local path as given, or the cached (fetched) file or folder a hub id names."""
    reference = hub_reference(text)
    if reference is None:
        return Path(text).expanduser()
    repo_id, filename = reference
    return fetch_file(repo_id, filename) if filename else fetch_folder(repo_id, ignore_patterns)


def converted_checkpoint(checkpoint: Path, key: str, dtype: str, geometry: dict | None = None) -> Path:
    """The transformer folder of a ``.pt`` training checkpoint, converted once: a folder under
    ``<hub cache>/vidgen-converted/`` named by the file's content (size, modification time and
    resolved path: a hub blob's path is its hash), the key, the dtype and ``geometry`` (the base
    model's transformer config, used where the shapes do not tell it)."""
    from vidgen.models.convert import convert_checkpoint

    real = checkpoint.resolve()
    stat = real.stat()
    named = [str(real), stat.st_size, stat.st_mtime_ns, key, dtype, geometry]
    digest = hashlib.sha256(json.dumps(named, sort_keys=True, default=str).encode())
    out = cache_dir() / "vidgen-converted" / f"{checkpoint.stem}-{digest.hexdigest()[:16]}"
    if (out / "config.json").is_file():
        return out
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        import shutil

        shutil.rmtree(partial)
    try:
        # the link's name, not the blob's, tells the format
        convert_checkpoint(checkpoint, partial, key=key or None, dtype=dtype, config=geometry)
    except (OSError, ValueError) as err:
        raise HubError(f"cannot convert {checkpoint}: {err}") from None
    partial.rename(out)
    return out
