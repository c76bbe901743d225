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
