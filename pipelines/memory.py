"""The C heap of a long-lived process (a server, a benchmark): handing freed memory back to the system.

Loads only :mod:`ctypes`, so a fresh interpreter can check it without Gradio or a model."""

from __future__ import annotations

import ctypes
import ctypes.util

_LIBC: ctypes.CDLL | None | bool = False  # False: not looked up yet


def trim_heap() -> bool:
    """Hands the C heap's free memory back to the system (glibc's ``malloc_trim``); whether it did.

    A chunk's tensors and encoder buffers are freed when its video ends, but glibc keeps freed
    memory in each thread's arena for reuse, and the page's worker threads (and the threads of
    sessions stepped together) spread a video over many arenas: without this the server's memory
    stays at its highest (measured in the README). ``SessionManager`` calls it as a session closes.
    A no-op on a C library without ``malloc_trim``."""
    global _LIBC
    if _LIBC is False:
        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 - absent outside glibc
        except (OSError, AttributeError, ImportError):  # ImportError: at interpreter shutdown
            _LIBC = None
    libc = _LIBC
    return isinstance(libc, ctypes.CDLL) and bool(libc.malloc_trim(0))
