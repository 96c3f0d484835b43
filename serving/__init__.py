"""vidgen.serving: many users' sessions on Ray Serve, each session's KV cache kept on one replica.

- ``deployment``: :class:`RaySessions` (the Gradio page's ``SessionBackend`` over a Serve
  deployment handle) and the ``SessionReplica`` deployment.
- Each replica holds its sessions in a :class:`vidgen.pipelines.session.SessionManager` (no Ray),
  the same one the page's local backend uses.
- ``affinity``: which replica serves a session (no Ray); ``router``: the Serve request router
  built on it (imported by Ray Serve only).

Built on :mod:`vidgen.distributed` (the Ray cluster, the worker's pipeline spec) and
:mod:`vidgen.pipelines` (sessions); nothing heavy happens at import (no Ray): the public names
below are resolved lazily.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "RaySessions": "vidgen.serving.deployment",
}

if TYPE_CHECKING:  # pragma: no cover
    from vidgen.serving.deployment import RaySessions


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vidgen.serving' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["RaySessions"]  # noqa: F822 - resolved lazily by __getattr__
