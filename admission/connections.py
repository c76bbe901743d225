"""Redis clients for admission. They raise on every error: admission must never guess.

(The cache-style "ignore exceptions" mode would turn a Redis outage into unlimited,
unordered admission; here an outage becomes a typed 503 instead.)

`ADMISSION_REDIS_URL` names one Redis, or, with `ADMISSION_REDIS_CLUSTER` on, any one node
of a Redis Cluster: the cluster clients learn the other nodes and the slot map from it. The
scripts need no change on a cluster because every key one script touches shares the worker's
hash tag (`{w:<id>}`), the wake lists built inside the scripts included, so each script runs
whole on the node that owns that slot. The Celery broker (`REDIS_URL`) is never a cluster.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from admission.queue import AsyncQueue, SyncQueue

_lock = threading.Lock()
_sync: SyncQueue | None = None
_async: dict[int, AsyncQueue] = {}
# A blocking pop holds one connection per waiting call, on the node owning its worker's slot.
BLOCKING_MAX_CONNECTIONS = 20_000


def cluster_enabled() -> bool:
    return bool(getattr(settings, "ADMISSION_REDIS_CLUSTER", False))


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


def _blocking_kwargs() -> dict[str, Any]:
    # Blocking pops (one connection per waiting call) wait up to the call's own deadline:
    # no socket timeout, and no retry that could re-send a pop whose element was taken.
    return {
        "decode_responses": True,
        "socket_connect_timeout": 1,
        "socket_timeout": None,
        "socket_keepalive": True,
        "max_connections": BLOCKING_MAX_CONNECTIONS,
        "retry": AsyncRetry(ExponentialBackoff(cap=0.05, base=0.01), 0),
    }


def sync_client(**kwargs: Any) -> Any:
    """A synchronous client for the admission Redis (a cluster client when configured)."""
    if cluster_enabled():
        # The cluster client keeps a pool per node; health_check_interval is a plain-client
        # option it does not take.
        kwargs.pop("health_check_interval", None)
        return RedisCluster.from_url(settings.ADMISSION_REDIS_URL, **kwargs)
    return redis.Redis.from_url(settings.ADMISSION_REDIS_URL, **kwargs)


def async_client(**kwargs: Any) -> Any:
    """An asyncio client for the admission Redis (a cluster client when configured)."""
    if cluster_enabled():
        return AsyncRedisCluster.from_url(settings.ADMISSION_REDIS_URL, **kwargs)
    return aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, **kwargs)


def sync_queue() -> SyncQueue:
    global _sync
    with _lock:
        if _sync is None:
            _sync = SyncQueue(sync_client(**_client_kwargs()), settings.REDIS_KEY_PREFIX)
        return _sync


def async_queue() -> AsyncQueue:
    """One client per event loop: asyncio connections belong to the loop that opened them."""
    loop = asyncio.get_running_loop()
    queue = _async.get(id(loop))
    if queue is None:
        client = async_client(**_async_kwargs())
        blocking = async_client(**_blocking_kwargs())
        queue = _async[id(loop)] = AsyncQueue(client, settings.REDIS_KEY_PREFIX, blocking=blocking)
    return queue
