"""Redis clients for admission. They raise on every error: admission must never guess.

(The cache-style "ignore exceptions" mode would turn a Redis outage into unlimited,
unordered admission; here an outage becomes a typed 503 instead.)
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from admission.queue import AsyncQueue, SyncQueue

_lock = threading.Lock()
_sync: SyncQueue | None = None
_async: dict[int, AsyncQueue] = {}


def _client_kwargs() -> dict[str, Any]:
    # One quick retry, then the error: an outage must become a prompt typed 503, not a stall.
    return {
        "decode_responses": True,
        "socket_connect_timeout": 1,
        "socket_timeout": 5,
        "health_check_interval": 30,
        "retry": Retry(ExponentialBackoff(cap=0.05, base=0.01), 1),
    }


def _async_kwargs() -> dict[str, Any]:
    kwargs = _client_kwargs()
    kwargs["retry"] = AsyncRetry(ExponentialBackoff(cap=0.05, base=0.01), 1)
    return kwargs


def sync_queue() -> SyncQueue:
    global _sync
    with _lock:
        if _sync is None:
            client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, **_client_kwargs())
            _sync = SyncQueue(client, settings.REDIS_KEY_PREFIX)
        return _sync


def async_queue() -> AsyncQueue:
    """One client per event loop: asyncio connections belong to the loop that opened them."""
    loop = asyncio.get_running_loop()
    queue = _async.get(id(loop))
    if queue is None:
        client = aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, **_async_kwargs())
        # Blocking pops (one connection per waiting call) wait up to the call's own deadline:
        # no socket timeout, and no retry that could re-send a pop whose element was taken.
        blocking = aioredis.Redis.from_url(
            settings.ADMISSION_REDIS_URL,
            decode_responses=True,
            socket_connect_timeout=1,
            socket_timeout=None,
            socket_keepalive=True,
            max_connections=20_000,
            retry=AsyncRetry(ExponentialBackoff(cap=0.05, base=0.01), 0),
        )
        queue = _async[id(loop)] = AsyncQueue(client, settings.REDIS_KEY_PREFIX, blocking=blocking)
    return queue
