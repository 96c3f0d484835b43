"""The one small bounded cache of vidgen: compiled attention patterns, prompt embeddings.

Compiling a pattern costs far more than a lookup (a 16k x 16k mask, a FlexAttention
``BlockMask``), and a model asks for the same few (pattern, lengths, device) combinations on
every layer and step, so each backend keeps its compiled forms here; the text encoders keep
their recent prompts' embeddings. The cache is bounded (least recently used entries go first)
because a long generation sees many KV lengths and a live session many prompts.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class LRUCache(Generic[V]):
    """A thread-safe mapping that keeps the ``maxsize`` most recently used entries."""

    def __init__(self, maxsize: int = 32) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_create(self, key: Hashable, create: Callable[[], V]) -> V:
        """Return the entry for ``key``, calling ``create()`` to build it on a miss."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        value = create()  # outside the lock: building can be slow and may itself use a cache
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return value

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
