"""Values computed from a whole file text, kept for the next edit of the same call.

Each cache registers itself, and ``forget_texts`` empties them all when a plan ends: a 4 MiB
file of short lines is a hundred megabytes of line objects, not to be kept between calls.
"""

from __future__ import annotations

import threading
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class TextCache(Generic[V]):
    """The last few values computed from a whole text, so the edits of one call pay a Python
    step per line once. A lookup costs one comparison with the cached text, in C. Not an
    lru_cache: the computation is paced, and takes the call's Pace, which is no part of the
    key."""

    def __init__(self, size: int = 2) -> None:
        self._size = size
        self._entries: list[tuple[str, V]] = []
        self._lock = threading.Lock()
        _CACHES.append(self)

    def get(self, text: str) -> V | None:
        with self._lock:
            return next((value for key, value in self._entries if key == text), None)

    def put(self, text: str, value: V) -> None:
        with self._lock:
            self._entries = [(text, value), *self._entries][: self._size]

    def clear(self) -> None:
        with self._lock:
            self._entries = []


_CACHES: list[TextCache[Any]] = []


def forget_texts() -> None:
    """Empty every cache (another call's plan running meanwhile only computes again)."""
    for cache in _CACHES:
        cache.clear()
