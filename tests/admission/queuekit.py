"""Running an AsyncQueue coroutine against the suite's real Redis, from a plain test."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings

from admission.queue import AsyncQueue


def run(coro_fn: Callable[[AsyncQueue], Awaitable[Any]], prefix: str) -> Any:
    """`coro_fn(queue)` on a fresh event loop with its own client, closed afterwards."""

    async def main() -> Any:
        client = aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
        try:
            return await coro_fn(AsyncQueue(client, prefix))
        finally:
            await client.aclose()

    return asyncio.run(main())


def dispatching_queue(
    sync_redis: Any, prefix: str, worker_id: str, offer: dict[str, str], *, slots: int = 1
) -> Any:
    """A SyncQueue whose scripts push granted envelopes onto `worker_id`'s (emptied) Celery
    queue list, with the worker registered as incarnation "inc1"."""
    from admission.queue import SyncQueue
    from workspaces.dispatch import broker_queue_key, worker_queue_name

    queue = SyncQueue(sync_redis, prefix)
    sync_redis.delete(broker_queue_key(worker_queue_name(worker_id)))
    assert queue.dispatching, "these tests need the broker to be the admission Redis"
    queue.register_incarnation(
        worker_id=worker_id, incarnation="inc1", slots=slots, ttl_ms=30_000, offer=offer
    )
    return queue


def pushed(sync_redis: Any, worker_id: str) -> list[str]:
    """Envelopes on the worker's Celery queue, oldest first."""
    from workspaces.dispatch import broker_queue_key, worker_queue_name

    key = broker_queue_key(worker_queue_name(worker_id))
    return [str(m) for m in reversed(sync_redis.lrange(key, 0, -1))]


def entering(
    q: AsyncQueue, worker_id: str, entry_id: str, now: int, defaults: dict[str, Any], **kw: Any
) -> Awaitable[Any]:
    """q.enter for an execute_command call on workspace "ws" carrying `envelope-<entry_id>`."""
    args: dict[str, Any] = dict(
        worker_id=worker_id,
        key=("ws", ""),
        exec_budget_ms=30_000,
        queue_limit=32,
        slot_ceiling=8,
        operation="execute_command",
        workspace_id="ws",
        needs=["op:execute_command"],
        envelope=f"envelope-{entry_id}",
    )
    args.update(defaults)
    args.update(kw)
    return q.enter(entry_id=entry_id, now_ms=now, **args)
