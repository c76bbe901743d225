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
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.driver_info import DriverInfo
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from admission.queue import AsyncQueue, SyncQueue
from admission.waiters import reader_for

T = TypeVar("T")
_lock = threading.Lock()
_sync: SyncQueue | None = None
_async: dict[int, AsyncQueue] = {}
_broker: dict[int, Any] = {}
# Commands of one API process (per node, on a cluster) share at most this many connections:
# a burst of calls queues for a connection for a moment instead of opening one each (2,000
# concurrent connects timed out and became 503s). Waiting calls hold none (admission/waiters.py).
COMMAND_POOL_MAX = 64
# How long a command waits for a free pooled connection before it is a typed 503.
COMMAND_POOL_WAIT_S = 5.0


class ClusterUnavailable(redis.exceptions.ConnectionError):
    """The cluster could not be reached or has no node for a slot.

    redis-py raises these as RedisClusterException, which is not a RedisError; admission
    turns RedisError into a typed 503, so it is re-raised as one.
    """


class _SyncCluster(RedisCluster):
    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc


class _AsyncCluster(AsyncRedisCluster):
    """redis-py's asyncio cluster client, made safe for concurrent first use.

    redis-py 8.1 picks a command's routing policy before it learns the slot map: while the
    client (re)initializes it has no default node, so a keyed command issued meanwhile is
    treated as keyless and sent to an arbitrary node. Every such command draws a MOVED, and
    after five of them the client closes every connection, including those of commands in
    flight (which then fail with AttributeError, not a RedisError, so a 500). A burst of
    calls on a fresh API process, or after a failover, does exactly that. Waiting for the
    slot map before routing avoids it; `initialize` takes a lock, so this costs nothing once
    the client is initialized.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The cluster client's per-node pool refuses (MaxConnectionsError) instead of waiting
        # once it is busy; this bound makes commands wait for their turn instead.
        self._turns = asyncio.Semaphore(COMMAND_POOL_MAX)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            if self._initialize:
                await self.initialize()
            async with self._turns:
                return await super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc


def cluster_enabled() -> bool:
    return bool(getattr(settings, "ADMISSION_REDIS_CLUSTER", False))


# What every connection tells Redis of its library (CLIENT SETINFO), made once: redis-py
# otherwise reads its own package metadata from disk for each new connection (0.35 ms here,
# 64 times over as a burst fills the command pool).
DRIVER_INFO = DriverInfo()


def _client_kwargs() -> dict[str, Any]:
    # One quick retry, then the error: an outage must become a prompt typed 503, not a stall.
    return {
        "driver_info": DRIVER_INFO,
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


def client_name() -> str:
    """What this process's admission connections call themselves (CLIENT LIST)."""
    return f"{getattr(settings, 'REDIS_CLIENT_NAME', 'sluice-api')}:{os.getpid()}"


def sync_client(**kwargs: Any) -> Any:
    """A synchronous client for the admission Redis (a cluster client when configured)."""
    if cluster_enabled():
        # The cluster client keeps a pool per node; health_check_interval is a plain-client
        # option it does not take.
        kwargs.pop("health_check_interval", None)
        try:
            return _SyncCluster.from_url(settings.ADMISSION_REDIS_URL, **kwargs)
        except RedisClusterException as exc:
            # The sync client reads the slot map as it is built: no node answered.
            raise ClusterUnavailable(str(exc)) from exc
    return redis.Redis.from_url(settings.ADMISSION_REDIS_URL, **kwargs)


def async_client(**kwargs: Any) -> Any:
    """An asyncio client for the admission Redis (a cluster client when configured), with a
    bounded number of connections that a command waits for rather than being refused."""
    if cluster_enabled():
        # Per node; _AsyncCluster makes the excess wait (a semaphore of the same size).
        kwargs.setdefault("max_connections", COMMAND_POOL_MAX)
        return _AsyncCluster.from_url(settings.ADMISSION_REDIS_URL, **kwargs)
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.ADMISSION_REDIS_URL,
        max_connections=kwargs.pop("max_connections", COMMAND_POOL_MAX),
        timeout=COMMAND_POOL_WAIT_S,
        **kwargs,
    )
    return aioredis.Redis(connection_pool=pool)


def sync_queue() -> SyncQueue:
    global _sync
    with _lock:
        if _sync is None:
            _sync = SyncQueue(sync_client(**_client_kwargs()), settings.REDIS_KEY_PREFIX)
        return _sync


def _for_this_loop(made: dict[int, T], make: Callable[[], T]) -> T:
    """One per event loop: asyncio connections belong to the loop that opened them."""
    loop = id(asyncio.get_running_loop())
    if loop not in made:
        made[loop] = make()
    return made[loop]


def async_queue() -> AsyncQueue:
    """This loop's queue: one bounded command pool and one wake-up reader (per node)."""

    def make() -> AsyncQueue:
        client = async_client(**_async_kwargs(), client_name=client_name())
        reader = reader_for(client, idle_channel=f"{settings.REDIS_KEY_PREFIX}adm:idle")
        return AsyncQueue(client, settings.REDIS_KEY_PREFIX, waiters=reader)

    return _for_this_loop(_async, make)


def async_broker() -> Any:
    """The Celery broker's Redis (a plain one, never a cluster), for publishing assignments
    (workspaces/dispatch.py)."""
    return _for_this_loop(
        _broker, lambda: aioredis.Redis.from_url(settings.CELERY_BROKER_URL, **_async_kwargs())
    )
