"""Database work from async code: in a pool thread, on a connection that works if Postgres does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

T = TypeVar("T")


def _healthy(fn: Callable[..., T], kwargs: dict[str, Any]) -> T:
    # A persistent connection that broke while Postgres was away stays broken in its pool
    # thread (nothing else closes it there), so every later call on that thread would fail
    # after Postgres is back. Only a connection that already failed is checked: no extra
    # round trip on the happy path.
    for conn in connections.all(initialized_only=True):
        if conn.errors_occurred:
            conn.close_if_unusable_or_obsolete()
    return fn(**kwargs)


async def in_db_thread(fn: Callable[..., T], /, **kwargs: Any) -> T:
    """Run `fn(**kwargs)` in a worker thread (not the shared thread-sensitive one)."""
    return await sync_to_async(_healthy, thread_sensitive=False)(fn, kwargs)
